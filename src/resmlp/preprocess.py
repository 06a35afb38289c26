"""The one preprocessing contract: what a checkpoint's images go through, at training, evaluation and inference.

A checkpoint's metadata["preprocess"] holds img_size, in_chans, mean, std, crop_pct and interpolation.
Evaluation everywhere (predict, eval, the probes, DINO's k-NN, the benchmarks' agreement check) uses
`Preprocess.eval_transform()`, which is timm's: resize the shorter side to floor(img_size / crop_pct),
centre-crop img_size, ToTensor, Normalize. timm's rule because timm's and DeiT's published weights were
evaluated with it.

Which preprocessing a file gets is one rule, `preprocess_of_file` (eval, predict, the probes):
- a file with preprocessing metadata (a run's best/last.safetensors, resmlp.save(..., metadata=...)): its own;
- a run's training state (last.pth): the run's, from the config the state carries;
- a file without metadata is assumed by where its weights come from, and the assumption is printed
  (`Preprocess.note`): ResMLP weights in DeiT's or timm's layout at the authors' test crop 0.9 (DeiT's
  README_resmlp.md: "a crop-ratio of 0.9 at test time"; timm's own resmlp pretrained_cfg says 0.875), a DINO
  checkpoint as DINO's eval_knn.py / eval_linear.py (Resize 256, CenterCrop 224: 0.875), Mixer weights in timm's
  layout as timm's Mixer pretrained_cfg (Google's weights: mean = std = 0.5, crop 0.875), a timm model as its
  pretrained_cfg, and this project's layout at timm's default crop DEFAULT_CROP_PCT with the dataset's statistics;
- `--crop-pct` (crop_pct=...) replaces the crop of any of these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from PIL import ImageOps
from timm.data import DEFAULT_CROP_PCT, create_transform

from resmlp.checkpoint_reader import check_float, check_int, check_str
from resmlp.data import dataset_stats
from resmlp.data.images import max_image_pixels, open_image
from resmlp.data.sources import parse_source
from resmlp.errors import CheckpointError, DataError

if TYPE_CHECKING:
    from resmlp.data.device.batch_augment import BatchAugment

INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
# the smallest centre crop: resizing to img_size / crop_pct, a crop_pct of 1e-9 would resize every image to
# billions of pixels; timm's and DeiT's models use 0.875 to 1
MIN_CROP_PCT = 0.1


@dataclass(frozen=True)
class Preprocess:
    """Evaluation preprocessing of one model; `source` says where it came from ("checkpoint", "run config" or
    "assumed") and `note`, when not empty, is the one line to print: what was assumed or overridden."""

    img_size: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = DEFAULT_CROP_PCT
    interpolation: str = "bicubic"
    source: str = "checkpoint"
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dict(img_size=self.img_size, crop_pct=self.crop_pct, interpolation=self.interpolation,
                    mean=list(self.mean), std=list(self.std), in_chans=self.in_chans)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], model: torch.nn.Module,
                      dataset: str | None = None) -> Preprocess:
        """From a checkpoint's metadata["preprocess"]; without one, what `preprocess_of_file` assumes for weights
        in this project's layout: the statistics of `dataset` (a dataset kind) when given, else ImageNet's, with
        timm's default crop DEFAULT_CROP_PCT."""
        return preprocess_of_file({"extra": metadata, "layout": "resmlp"}, model, dataset)

    @classmethod
    def _from_checked(cls, pre: Any, model: torch.nn.Module) -> Preprocess:
        """From a metadata["preprocess"]-shaped dict, every field checked, and checked against the model."""
        cfg = getattr(model, "config", None)
        made = cls._from_fields(pre)
        made.check()
        if cfg is not None and (made.img_size, made.in_chans) != (cfg.img_size, cfg.in_chans):
            raise ValueError(f"checkpoint preprocess metadata says {made.in_chans}x{made.img_size}px but the model "
                             f"takes {cfg.in_chans}x{cfg.img_size}px; fix the metadata")
        return made

    @classmethod
    def _from_fields(cls, pre: Any) -> Preprocess:
        """The metadata's fields, each of its type (an int is an int, not 8.5; numbers finite)."""
        where = "checkpoint preprocess metadata"
        if not isinstance(pre, dict) or "img_size" not in pre or not isinstance(pre.get("mean"), list) \
                or not isinstance(pre.get("std"), list) or not 0 < len(pre["mean"]) <= 64 or len(pre["std"]) > 64:
            raise CheckpointError(f"{where} {pre!r:.200} is malformed; it needs img_size, mean and std lists (and "
                                  "optionally crop_pct, interpolation, in_chans)")
        return cls(check_int(pre["img_size"], "img_size", where, 1, 4096),
                   check_int(pre.get("in_chans", len(pre["mean"])), "in_chans", where, 1, 64),
                   tuple(check_float(v, "mean", where, -1e6, 1e6) for v in pre["mean"]),
                   tuple(check_float(v, "std", where, -1e6, 1e6) for v in pre["std"]),
                   check_float(pre.get("crop_pct", DEFAULT_CROP_PCT), "crop_pct", where, -1, 1e6),
                   check_str(pre.get("interpolation", "bicubic"), "interpolation", where))

    def check(self) -> None:
        """Each value checked once, here: a bad one would divide by zero or scale images silently later."""
        problems = [
            (self.img_size >= 1, "img_size", "must be a positive number of pixels"),
            (self.in_chans >= 1, "in_chans", "must be a positive number of channels"),
            (MIN_CROP_PCT <= self.crop_pct <= 1.0, "crop_pct",
             f"must be in [{MIN_CROP_PCT}, 1] (the centre crop's share of the image)"),
            (len(self.mean) in (1, 3, self.in_chans), "mean", f"needs 1, 3 or in_chans={self.in_chans} values"),
            (len(self.std) == len(self.mean), "std", "needs as many values as mean"),
            (all(math.isfinite(v) for v in self.mean), "mean", "must be finite"),
            (all(math.isfinite(v) and v > 0 for v in self.std), "std", "must be finite and > 0"),
            (self.interpolation in INTERPOLATIONS, "interpolation", f"must be one of {', '.join(INTERPOLATIONS)}"),
        ]
        for ok, field, rule in problems:
            if not ok:
                raise CheckpointError(f"checkpoint preprocess metadata: {field}={getattr(self, field)!r} {rule}; "
                                      "fix the metadata (see docs/inference.md)")

    # ------------------------------------------------------------------------------------------ transforms
    def eval_transform(self):
        """timm's evaluation transform: PIL image -> normalised (C, img_size, img_size) tensor."""
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"unknown interpolation {self.interpolation!r}; use one of {', '.join(INTERPOLATIONS)}")
        transform = create_transform((self.in_chans, self.img_size, self.img_size), is_training=False,
                                     interpolation=self.interpolation, mean=self.mean, std=self.std,
                                     crop_pct=self.crop_pct)
        transform.transforms.insert(0, ResizeBound(math.floor(self.img_size / self.crop_pct)))
        return transform

    def train_transform(self, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip: float = 0.5, color_jitter: float = 0.0,
                        auto_augment: str | None = None, reprob: float = 0.0, uint8: bool = False,
                        remode: str = "pixel", recount: int = 1):
        """timm's training transform (random-resized crop, flip, RandAugment, erasing) ending in this
        preprocessing's normalisation; uint8: ending in a uint8 tensor, normalisation and erasing left to the
        device (timm's use_prefetcher; resmlp.data.loading.finish). remode, recount: timm's re_mode, re_count."""
        transform = create_transform(
            (self.in_chans, self.img_size, self.img_size), is_training=True, scale=tuple(scale), ratio=tuple(ratio),
            hflip=hflip, color_jitter=color_jitter, auto_augment=auto_augment, interpolation=self.interpolation,
            mean=self.mean, std=self.std, re_prob=reprob, re_mode=remode, re_count=recount, use_prefetcher=uint8)
        return _with_zero_bit_posterize(transform)

    def batched_eval(self, image_height: int, image_width: int, after=None) -> BatchAugment | None:
        """The evaluation transform for whole uint8 batches of HxW images, where it is exact: no resize and no
        crop (crop_pct 1, images already img_size), i.e. ToTensor + Normalize (+ `after`). Else None: use
        eval_transform() per image."""
        from resmlp.data.device.batch_augment import BatchAugment

        if self.crop_pct != 1.0 or (image_height, image_width) != (self.img_size, self.img_size):
            return None
        return BatchAugment(self.img_size, self.in_chans, self.mean, self.std, (1, 1), (1, 1), 0.0, 0.0,
                            self.interpolation, after=after)

    def load(self, path: str | Path, transform=None) -> torch.Tensor:
        """One image file as a normalised (C, H, W) tensor (`transform`: eval_transform(), made once by callers
        that load many); DataError (a ValueError) naming the file if it can't be read or is too large
        (resmlp.data.images.open_image)."""
        image = open_image(path, self.in_chans)
        try:
            return (transform or self.eval_transform())(image)
        except DataError as e:  # ResizeBound's refusal, which can't know the file
            raise DataError(f"image {path}: {e}") from None


IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # timm's IMAGENET_DEFAULT_MEAN / _STD
# The preprocessing of weights that come without metadata, by where they come from: (mean/std, crop, source).
# None for the statistics: the dataset's (this project's own layout, trained on anything).
ASSUMED: dict[str, tuple[tuple[tuple[float, ...], tuple[float, ...]] | None, float, str]] = {
    "deit_resmlp": (IMAGENET_STATS, 0.9, "ResMLP weights in DeiT's layout: the authors' test crop, DeiT's "
                                         "README_resmlp.md \"a crop-ratio of 0.9 at test time\""),
    "timm_resmlp": (IMAGENET_STATS, 0.9, "ResMLP weights in timm's layout: the authors' test crop, DeiT's "
                                         "README_resmlp.md \"a crop-ratio of 0.9 at test time\" (timm's "
                                         "pretrained_cfg says 0.875)"),
    "timm_mixer": (((0.5,) * 3, (0.5,) * 3), 0.875, "Mixer weights in timm's layout: timm's Mixer pretrained_cfg "
                                                    "(Google's weights)"),
    "dino": (IMAGENET_STATS, 0.875, "a DINO checkpoint: DINO's eval_knn.py / eval_linear.py, Resize(256) + "
                                    "CenterCrop(224)"),
    "resmlp": (None, DEFAULT_CROP_PCT, "weights in this project's layout without preprocessing metadata: timm's "
                                       "default crop"),
}


def preprocess_of_file(header: dict[str, Any], model: torch.nn.Module, dataset: str | None = None,
                       crop_pct: float | None = None) -> Preprocess:
    """The evaluation preprocessing of a loaded file (the module docstring's rule). header: what
    resmlp.checkpoint.load_with_header returns; dataset: the dataset kind it is evaluated on, if known;
    crop_pct: the user's crop (--crop-pct), replacing the file's or the assumed one."""
    extra = header.get("extra") or {}
    origin = header.get("torch") or {}
    if extra.get("preprocess"):
        pre = Preprocess._from_checked(extra["preprocess"], model)
    elif origin.get("kind") == "state":
        pre = _of_run_config(origin.get("run_config"), model)
    else:
        pre = _assumed(header, origin.get("kind"), model, dataset)
    if crop_pct is None or crop_pct == pre.crop_pct:
        return pre
    if not MIN_CROP_PCT <= crop_pct <= 1.0:  # NaN fails too
        raise ValueError(f"--crop-pct {crop_pct} must be in [{MIN_CROP_PCT}, 1] (the centre crop's share of the "
                         "image; the authors' ResMLP crop is 0.9)")
    note = (pre.note.replace(f"crop {pre.crop_pct}", f"crop {crop_pct} (--crop-pct)") if pre.note else
            f"preprocessing: crop {crop_pct} from --crop-pct instead of the {pre.source}'s {pre.crop_pct}")
    return replace(pre, crop_pct=crop_pct, note=note)


def _of_run_config(config: Any, model: torch.nn.Module) -> Preprocess:
    """A training state's preprocessing: its run config's data section for the model's input, as the run
    built it (resmlp.data.loading.assemble.run_preprocess); checked as metadata is."""
    data = config.get("data") if isinstance(config, dict) else None
    cfg = getattr(model, "config", None)
    if not isinstance(data, dict) or cfg is None or not isinstance(data.get("kind"), str):
        raise CheckpointError("the training state's run config has no readable data section; evaluate the run's "
                              "last.safetensors or best.safetensors instead")
    if data.get("mean") and data.get("std"):
        mean, std = data["mean"], data["std"]
    else:  # the statistics of the source the run read (data.source), as run_preprocess took them: data.kind
        # is the recipe's (fashion-mnist) even where --data named a folder (issue 50 item 8)
        source = data.get("source")
        kind = parse_source(source).kind if isinstance(source, str) and source else data["kind"]
        mean, std = dataset_stats(kind, cfg.in_chans)
    fields = dict(img_size=cfg.img_size, in_chans=cfg.in_chans, mean=list(mean), std=list(std),
                  crop_pct=data.get("crop_pct", DEFAULT_CROP_PCT), interpolation=data.get("interpolation", "bicubic"))
    return replace(Preprocess._from_checked(fields, model), source="run config")


def _assumed(header: dict[str, Any], kind: str | None, model: torch.nn.Module, dataset: str | None) -> Preprocess:
    """The preprocessing of a file without metadata, by where its weights come from (ASSUMED), with its note."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return _assumed_foreign(model)
    stats, crop, why = ASSUMED["dino" if kind == "dino" else header.get("layout") or "resmlp"]
    if stats is None or cfg.in_chans != len(stats[0]):
        if dataset is None and cfg.in_chans != 3:
            raise ValueError(f"the checkpoint has no preprocessing metadata and the model takes {cfg.in_chans} "
                             "channels, so ImageNet defaults don't apply; pass --data KIND, or re-save it with "
                             "metadata={'preprocess': {...}} (see docs/inference.md)")
        stats = dataset_stats(dataset or "folder", cfg.in_chans)
        statistics = f"{dataset}'s" if dataset else "ImageNet's"
    else:
        statistics = "ImageNet's" if stats == IMAGENET_STATS else "mean/std 0.5"
    note = (f"no preprocessing metadata: assumed {statistics} mean/std, crop {crop}, bicubic, "
            f"{cfg.img_size}px ({why})")
    return Preprocess(cfg.img_size, cfg.in_chans, *stats, crop, "bicubic", source="assumed", note=note)


def _assumed_foreign(model: torch.nn.Module) -> Preprocess:
    """A timm model without preprocessing metadata: its pretrained_cfg, as timm's validate.py resolves it
    (resolve_data_config). torchvision classifiers carry no such description: refused."""
    from timm.data import resolve_data_config

    if not getattr(model, "pretrained_cfg", None):
        raise ValueError("the checkpoint has no preprocessing metadata and its model no ResMLP config or timm "
                         "pretrained_cfg; save it with resmlp.save(..., metadata={'preprocess': {...}}) "
                         "(docs/inference.md)")
    data = resolve_data_config({}, model=model)
    in_chans, height, _ = data["input_size"]
    made = Preprocess(height, in_chans, tuple(data["mean"]), tuple(data["std"]), data["crop_pct"],
                      data["interpolation"] if data["interpolation"] in INTERPOLATIONS else "bicubic",
                      source="assumed")
    made.check()
    return replace(made, note=f"no preprocessing metadata: assumed timm's pretrained_cfg of "
                              f"{model.pretrained_cfg.get('architecture')}: mean {made.mean}, std {made.std}, crop "
                              f"{made.crop_pct}, {made.interpolation}, {made.img_size}px")


class ResizeBound:
    """The first step of the evaluation transform: refuse (DataError) an image whose resize (shorter side to
    `shorter`) would exceed the pixel bound of `resmlp.data.images`; its aspect ratio, not its own size, is
    what makes a strip of a few pixels allocate gigabytes there."""

    def __init__(self, shorter: int) -> None:
        self.shorter = shorter

    def __call__(self, image):
        width, height = image.size
        longer = math.ceil(self.shorter * max(width, height) / max(min(width, height), 1))
        limit = max_image_pixels()
        if self.shorter * longer > limit:
            raise DataError(f"a {width}x{height}-pixel image resized to a shorter side of {self.shorter} would have "
                            f"{self.shorter * longer} pixels, more than the limit of {limit}; crop it first")
        return image


def _posterize(img, bits_to_keep: int, **_):
    """timm's posterize, keeping 0 bits as Pillow < 13 did (a black image): the top magnitude of RandAugment's
    'inc1' posterize asks for 0 bits, which Pillow 13's ImageOps.posterize refuses with a ValueError."""
    if bits_to_keep >= 8:
        return img
    if bits_to_keep <= 0:
        return img.point(lambda _: 0)
    return ImageOps.posterize(img, bits_to_keep)


def _with_zero_bit_posterize(transform):
    """`transform` with the posterize ops of its RandAugment/AutoAugment (timm's AugmentOp) using `_posterize`."""
    for step in getattr(transform, "transforms", ()):
        policy = getattr(step, "ops", None) or [op for sub in getattr(step, "policy", ()) for op in sub]
        for op in policy:
            if getattr(op, "name", "").startswith("Posterize"):
                op.aug_fn = _posterize
    return transform

"""Datasets for training and evaluation: Fashion-MNIST (default), image folders, CIFAR, synthetic."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, create_transform
from torch.utils.data import Dataset
from torchvision import transforms

from resmlp.data import cifar as _cifar
from resmlp.data import fashion_mnist as _fmnist
from resmlp.data.arrays import ArrayDataset
from resmlp.data.fashion_mnist import fashion_mnist, read_idx
from resmlp.data.folder import SkippingImageFolder
from resmlp.data.images import open_image
from resmlp.data.permute import PixelPermutation, pixel_permutation
from resmlp.data.samplers import ResumableSampler, SeededDataset, ShardSampler, collate_skipping
from resmlp.data.synthetic import synthetic
from resmlp.errors import CheckpointError

if TYPE_CHECKING:
    from resmlp.models.resmlp import ResMLP

KINDS = ("fashion-mnist", "folder", "cifar10", "cifar100", "synthetic")
DEFAULT_STATS = {
    "fashion-mnist": (_fmnist.MEAN, _fmnist.STD),
    "cifar10": (_cifar.MEAN, _cifar.STD),
    "cifar100": (_cifar.MEAN, _cifar.STD),
    "synthetic": ((0.5,), (0.25,)),
}

__all__ = ["KINDS", "ArrayDataset", "PixelPermutation", "Preprocess", "ResumableSampler", "SeededDataset",
           "ShardSampler", "SkippingImageFolder", "build_dataset", "build_transform", "collate_skipping",
           "dataset_stats", "fashion_mnist", "pixel_permutation", "read_idx", "synthetic"]


@dataclass(frozen=True)
class Preprocess:
    """The evaluation preprocessing stored in checkpoint metadata ("preprocess" in the contract):
    resize the shorter side to round(img_size / crop_pct), centre crop, normalise."""

    img_size: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    source: str = "checkpoint"  # "checkpoint" (its metadata) or "defaults" (ImageNet preset values)

    def to_dict(self) -> dict:
        return dict(img_size=self.img_size, crop_pct=self.crop_pct, interpolation=self.interpolation,
                    mean=list(self.mean), std=list(self.std), in_chans=self.in_chans)

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any], model: ResMLP, dataset: str | None = None) -> Preprocess:
        """From a checkpoint's metadata["preprocess"]. Without one (timm, DeiT checkpoints): the statistics of
        `dataset` (a dataset kind) when given, else ImageNet's, with DeiT's evaluation crop 0.875."""
        cfg = getattr(model, "config", None)
        pre = metadata.get("preprocess")
        if not pre:
            if cfg is None:
                raise ValueError("the checkpoint has no preprocessing metadata and its model no ResMLP config; "
                                 "save it with resmlp.save(..., metadata={'preprocess': {...}}) (docs/inference.md)")
            if dataset is None and cfg.in_chans != 3:
                raise ValueError(f"the checkpoint has no preprocessing metadata and the model takes {cfg.in_chans} "
                                 "channels, so ImageNet defaults don't apply; re-save it with "
                                 "metadata={'preprocess': {...}} (see docs/inference.md)")
            mean, std = dataset_stats(dataset or "folder", cfg.in_chans)
            return cls(cfg.img_size, cfg.in_chans, mean, std, 0.875, "bicubic", source="defaults")
        try:
            made = cls(int(pre["img_size"]), int(pre.get("in_chans", len(pre["mean"]))),
                       tuple(float(v) for v in pre["mean"]), tuple(float(v) for v in pre["std"]),
                       float(pre.get("crop_pct", 1.0)), str(pre.get("interpolation", "bicubic")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CheckpointError(f"checkpoint preprocess metadata {pre!r} is malformed ({e!r}); it needs "
                                  "img_size, mean, std (and optionally crop_pct, interpolation, in_chans)") from None
        # each value checked once, here: a bad one would divide by zero or scale images silently later
        problems = [
            (made.img_size >= 1, "img_size", "must be a positive number of pixels"),
            (made.in_chans >= 1, "in_chans", "must be a positive number of channels"),
            (0.0 < made.crop_pct <= 1.0, "crop_pct", "must be in (0, 1] (the centre crop's share of the image)"),
            (len(made.mean) in (1, 3, made.in_chans), "mean", f"needs 1, 3 or in_chans={made.in_chans} values"),
            (len(made.std) == len(made.mean), "std", "needs as many values as mean"),
            (all(math.isfinite(v) for v in made.mean), "mean", "must be finite"),
            (all(math.isfinite(v) and v > 0 for v in made.std), "std", "must be finite and > 0"),
            (made.interpolation in {m.value for m in transforms.InterpolationMode}, "interpolation",
             f"must be one of {', '.join(m.value for m in transforms.InterpolationMode)}"),
        ]
        for ok, field, rule in problems:
            if not ok:
                raise CheckpointError(f"checkpoint preprocess metadata: {field}={getattr(made, field)!r} {rule}; "
                                      "fix the metadata (see docs/inference.md)")
        if cfg is not None and (made.img_size, made.in_chans) != (cfg.img_size, cfg.in_chans):
            raise ValueError(f"checkpoint preprocess metadata says {made.in_chans}x{made.img_size}px but the model "
                             f"takes {cfg.in_chans}x{cfg.img_size}px; fix the metadata")
        return made

    def transform(self) -> transforms.Compose:
        try:
            mode = transforms.InterpolationMode(self.interpolation)
        except ValueError:
            raise ValueError(f"unknown interpolation {self.interpolation!r}; use one of "
                             f"{', '.join(m.value for m in transforms.InterpolationMode)}") from None
        return transforms.Compose([
            transforms.Resize(round(self.img_size / self.crop_pct), interpolation=mode),
            transforms.CenterCrop(self.img_size),
            transforms.ToTensor(),
            transforms.Normalize(self.mean, self.std),
        ])

    def load(self, path: str | Path) -> torch.Tensor:
        """One image file as a normalised (C, H, W) tensor; DataError (a ValueError) naming the file if it
        can't be read or is too large (resmlp.data.images.open_image)."""
        return self.transform()(open_image(path, self.in_chans))


def dataset_stats(kind: str, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Default normalisation for a dataset kind, with as many channels as the model takes."""
    mean, std = DEFAULT_STATS.get(kind, (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
    if len(mean) != in_chans:  # grayscale repeated to RGB, or colour read as grayscale
        mean, std = (sum(mean) / len(mean),) * in_chans, (sum(std) / len(std),) * in_chans
    return tuple(mean), tuple(std)


def build_transform(pre: Preprocess, training: bool, aug: dict | None = None):
    """timm's transform: `aug` holds the training options (scale, ratio, hflip, auto_augment, reprob...)."""
    size = (pre.in_chans, pre.img_size, pre.img_size)
    if not training:
        return create_transform(size, is_training=False, interpolation=pre.interpolation, mean=pre.mean,
                                std=pre.std, crop_pct=pre.crop_pct)
    aug = aug or {}
    return create_transform(
        size, is_training=True, scale=tuple(aug.get("scale", (0.08, 1.0))),
        ratio=tuple(aug.get("ratio", (3 / 4, 4 / 3))), hflip=aug.get("hflip", 0.5),
        color_jitter=aug.get("color_jitter", 0.0), auto_augment=aug.get("auto_augment"),
        interpolation=pre.interpolation, mean=pre.mean, std=pre.std, re_prob=aug.get("reprob", 0.0),
        re_mode="pixel", re_count=1,
    )


def build_dataset(kind: str, split: str, data_dir: str | Path | None, in_chans: int, transform=None,
                  synthetic_size: tuple[int, int] = (256, 64), synthetic_classes: int = 4,
                  img_size: int = 28, seed: int = 0, permute: str = "none", permute_patch: int = 4,
                  permute_seed: int = 0) -> Dataset:
    """Split 'train' or 'val' of a dataset kind (Fashion-MNIST and CIFAR call 'val' their test set).

    permute: 'patch' or 'global' applies one fixed pixel permutation (resmlp.data.permute) to every image
    tensor after `transform`, the same for both splits.
    """
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', got {split!r}")
    if permute != "none":
        if transform is None:
            raise ValueError("a pixel permutation acts on image tensors: pass a transform that makes them")
        transform = transforms.Compose([transform, PixelPermutation(permute, img_size, permute_patch, permute_seed)])
    if kind == "fashion-mnist":
        return fashion_mnist("train" if split == "train" else "test", data_dir, in_chans, transform)
    if kind in ("cifar10", "cifar100"):
        if data_dir is None:
            raise ValueError(f"{kind} needs data.dir (the folder holding the python-pickle version)")
        return _cifar.cifar(kind, "train" if split == "train" else "test", data_dir, in_chans, transform)
    if kind == "folder":
        if data_dir is None:
            raise ValueError("an image-folder dataset needs data.dir (holding train/<class>/ and val/<class>/)")
        return SkippingImageFolder(Path(data_dir) / split, in_chans=in_chans, transform=transform)
    if kind == "synthetic":
        n = synthetic_size[0] if split == "train" else synthetic_size[1]
        return synthetic(split, n, synthetic_classes, img_size, in_chans, seed=seed, transform=transform)
    raise ValueError(f"unknown dataset kind {kind!r}; choose one of {', '.join(KINDS)}")


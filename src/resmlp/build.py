"""One grammar for naming a model, everywhere a model is named (training, teachers, benchmark, analysis):

    preset              a preset of this project (resmlp_s12, mixer_b16, ...; `resmlp models` lists them), also
                        by DeiT's and timm's names of the same architecture (resmlp_12, resmlp_12_224)
    timm:NAME           any timm architecture (random weights unless a weights file is given)
    torchvision:NAME    any torchvision classifier (random weights unless a weights file is given)
    path/to/checkpoint  a checkpoint file: ours (.safetensors with its config), timm's or DeiT's; a run folder
                        names its best.safetensors
    preset.TAG          a preset's published weights as timm names them (resmlp_s12.fb_in1k): their file,
                        from the Hugging Face cache (resmlp.models.weight_tags)
    hf-hub:ORG/NAME     a Hub repository's weight file in the local Hugging Face cache, as timm names it
                        (hf-hub:timm/resmlp_12_224.fb_in1k; read offline, resmlp.models.weight_tags.hub_model_file)

`build_model(spec, ...)` makes the model; `model_input(spec, ...)` says what input it takes without building
it where it can. Fine-tuning helpers live here too: a checkpoint start at a new resolution, freezing.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resmlp.errors import ConfigError
from resmlp.models.constructor_args import check_constructor_args, class_scores_problem
from resmlp.models.torchvision_models import RepeatChannels

CHECKPOINT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin")
KINDS = ("preset", "timm", "torchvision", "file")


@dataclass(frozen=True)
class ModelName:
    kind: str  # one of KINDS
    name: str  # the preset, the timm/torchvision architecture, or the file path

    def __str__(self) -> str:
        return self.name if self.kind in ("preset", "file") else f"{self.kind}:{self.name}"


def parse_model_name(spec: str) -> ModelName:
    """`preset | timm:NAME | torchvision:NAME | path` -> ModelName; a clear error for anything else."""
    from resmlp.models.registry import PRESETS

    spec = canonical_name(str(spec).strip())
    from resmlp.models.weight_tags import hub_model_file

    if (hub_file := hub_model_file(spec)) is not None:
        return ModelName("file", str(hub_file))
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in ("timm", "torchvision"):
        if not rest:
            raise ValueError(f"model {spec!r}: write {prefix}:NAME, e.g. timm:resnet18")
        return ModelName(prefix, rest)
    if spec in PRESETS:
        return ModelName("preset", spec)
    if spec.endswith(CHECKPOINT_SUFFIXES) or Path(spec).is_file():
        return ModelName("file", spec)
    if spec and Path(spec).is_dir():  # a run folder, as eval, predict and export take it: its best checkpoint
        if not (Path(spec) / "best.safetensors").is_file():
            raise ValueError(f"model {spec!r} is a folder without best.safetensors; name a checkpoint file or a "
                             "finished run folder")
        return ModelName("file", str(Path(spec) / "best.safetensors"))
    from resmlp.models.weight_tags import tagged_weights

    weights = tagged_weights(spec)  # PRESET.TAG, timm's name of published weights: their local file
    if weights is not None:
        return ModelName("file", str(weights))
    close = difflib.get_close_matches(spec, list(PRESETS), n=3)
    hint = f" did you mean {', '.join(close)}?" if close else ""
    import timm

    if timm.is_model(spec):
        hint = f" {spec} is a timm architecture: write timm:{spec}"
    raise ValueError(f"unknown model {spec!r}: expected a preset (`resmlp models`), timm:NAME, torchvision:NAME or "
                     f"a checkpoint file (.safetensors, .pth).{hint}")


def canonical_name(spec: str) -> str:
    """DeiT's or timm's name of a preset's architecture (resmlp_12, resmlp_12_224; with a weight tag,
    resmlp_12_224.fb_in1k) as the preset's name; any other spec unchanged."""
    from resmlp.models.registry import PRESET_ALIASES

    name, dot, tag = spec.partition(".")
    return PRESET_ALIASES[name] + dot + tag if name in PRESET_ALIASES else spec


# the model keys a recipe written for another architecture still means for each kind of model: the data's
# shape, the classes and (for timm, which takes them for every architecture; for a checkpoint, whose
# architecture is the file's) the dropout rates. A preset takes every ResMLPConfig field.
SHARED_MODEL_KEYS = {
    "timm": ("in_chans", "img_size", "num_classes", "drop_rate", "drop_path_rate"),
    "torchvision": ("in_chans", "img_size", "num_classes"),
    "file": ("drop_rate", "drop_path_rate"),
}


def keys_not_applying(name: ModelName, keys: list[str]) -> list[str]:
    """The model keys of a recipe written for another model that `name` does not take: for a preset, those
    that are not ResMLPConfig fields; for timm, the ResMLP architecture fields (its other keys are timm
    constructor arguments); for torchvision and a checkpoint, all but SHARED_MODEL_KEYS."""
    import dataclasses

    from resmlp.models.resmlp import ResMLPConfig

    fields = {f.name for f in dataclasses.fields(ResMLPConfig)}
    if name.kind == "preset":
        return [k for k in keys if k not in fields]
    shared = SHARED_MODEL_KEYS[name.kind]
    return [k for k in keys if k not in shared and (k in fields or name.kind != "timm")]


def check_constructor_keys(name: ModelName, overrides: dict[str, Any]) -> str | None:
    """Why a timm:/torchvision: model cannot be built with these model keys or take the images they imply
    (None when it can), found by building it and running it once on the meta device, which allocates and
    computes nothing: before any data is read. The output must be one row of class scores per image: keys such
    as global_pool='' build a model whose output is a feature map, which training could only fail on."""
    if name.kind not in ("timm", "torchvision") or not overrides:
        return None
    in_chans, img_size = model_input(name, overrides)
    keys = ", ".join(f"model.{k}={v!r}" for k, v in overrides.items())
    try:
        check_constructor_args(overrides, str(name))
        with torch.device("meta"), torch.no_grad():
            model = build_model_for_input(name, **overrides)
            # eval mode: what predicts and is scored (a distilled DeiT returns two heads while training)
            out = model.eval()(torch.empty(2, in_chans, img_size, img_size))
    except Exception as e:  # a model fails in its own words (TypeError, AssertionError, AttributeError...)
        return f"{name} cannot be built with {keys}: {' '.join(str(e).split())[:300]}"
    problem = class_scores_problem(out, overrides.get("num_classes", getattr(model, "num_classes", None)))
    return f"{name} with {keys} {problem}" if problem else None


def build_model_for_input(spec: str | ModelName, **kwargs: Any) -> nn.Module:
    """`build_model` for a model that is fed `img_size` images: a timm model that takes the size as an argument
    (ViT, Mixer) is built for it; one that takes any size (a convnet) refuses the argument and is built
    without it; torchvision's classifiers take any size."""
    name = spec if isinstance(spec, ModelName) else parse_model_name(spec)
    if name.kind == "timm" and "img_size" in kwargs:
        try:
            return build_model(name, **kwargs)
        except (TypeError, ConfigError):  # "unexpected keyword argument 'img_size'": a convnet
            pass
    return build_model(name, **{k: v for k, v in kwargs.items() if k != "img_size" or name.kind == "preset"})


def build_model(spec: str | ModelName, num_classes: int | None = None, in_chans: int | None = None,
                weights: str | Path | None = None, **overrides: Any) -> nn.Module:
    """The model named by `spec`, with `num_classes` / `in_chans` when given and constructor `overrides`
    (ResMLPConfig fields for presets and our checkpoints, timm.create_model arguments for timm:).
    `weights`: a state-dict file for a timm:/torchvision: model (a checkpoint file holds its own)."""
    name = spec if isinstance(spec, ModelName) else parse_model_name(spec)
    sizes = {k: v for k, v in (("num_classes", num_classes), ("in_chans", in_chans)) if v is not None}
    if weights is not None and name.kind in ("preset", "file"):
        raise ValueError(f"a weights file goes with a timm:NAME or torchvision:NAME model, not {name}; a checkpoint "
                         "file holds its own weights and a preset takes pretrained=True")
    if name.kind == "preset":
        from resmlp.models.pretrained import create_model

        return create_model(name.name, **sizes, **overrides)
    if name.kind == "file":
        from resmlp.checkpoint import load

        if not Path(name.name).is_file():
            raise FileNotFoundError(f"checkpoint {name.name} does not exist")
        return load(name.name, **overrides)
    if name.kind in ("timm", "torchvision"):  # plain, bounded values only: no paths, loaders, giant depths
        check_constructor_args(overrides, f"{name}")
    if name.kind == "timm":
        import timm

        if not timm.is_model(name.name):
            raise ValueError(f"timm has no model {name.name!r} (see timm.list_models())")
        model = _construct(name, overrides, lambda: timm.create_model(name.name, pretrained=False, **sizes,
                                                                      **overrides))
    else:
        from resmlp.models.torchvision_models import build_torchvision

        nc = {"num_classes": num_classes} if num_classes is not None else {}
        model = _construct(name, overrides, lambda: build_torchvision(name.name, in_chans, **overrides, **nc))
    if weights is not None:  # the classifier's own weights, inside a grayscale wrapper
        load_weights_file(model.model if isinstance(model, RepeatChannels) else model, weights, str(name))
    return model


def _construct(name: ModelName, overrides: dict[str, Any], make) -> nn.Module:
    """`make()`, with a constructor's refusal of its arguments (TypeError, ValueError, AssertionError...) as a
    ConfigError naming the model and the model.* keys given: they are what the user can change."""
    try:
        return make()
    except MemoryError:
        raise
    except Exception as e:  # timm's and torchvision's constructors raise whatever their code raises
        keys = ", ".join(f"model.{k}={v!r}" for k, v in overrides.items()) or "no model.* keys"
        raise ConfigError(f"{name} can't be built with {keys} ({type(e).__name__}: {e}); fix or remove those "
                          "keys") from None


def model_input(spec: str | ModelName, overrides: dict[str, Any] | None = None) -> tuple[int, int]:
    """(in_chans, img_size) the named model takes: presets and checkpoints from their config, timm and
    torchvision models from `overrides` (in_chans, img_size; default 3 and 224)."""
    name = spec if isinstance(spec, ModelName) else parse_model_name(spec)
    overrides = overrides or {}
    if name.kind == "preset":
        from resmlp.models.registry import model_config

        cfg = model_config(name.name, **{k: v for k, v in overrides.items() if k != "name"})
        return cfg.in_chans, cfg.img_size
    if name.kind == "file":
        cfg = _file_config(name.name)
        if cfg is None:
            in_chans, img_size = _trained_input(name.name)
            return overrides.get("in_chans", in_chans), overrides.get("img_size", img_size)
        return cfg.in_chans, overrides.get("img_size") or cfg.img_size
    return overrides.get("in_chans", 3), overrides.get("img_size", 224)


def _file_config(path: str):
    """A checkpoint's ResMLPConfig: from the safetensors header where ours holds it (no tensor is read), else
    from the model built from the file (timm's and DeiT's files); None for a timm or torchvision model's file."""
    if path.endswith(".safetensors"):
        from resmlp.checkpoint import read_header
        from resmlp.errors import CheckpointError
        from resmlp.models.resmlp import ResMLPConfig

        header = read_header(path)
        if "config" in header:
            try:
                return ResMLPConfig.from_dict(header["config"])
            except (TypeError, ValueError) as e:
                raise CheckpointError(f"{path}: the model config in its metadata is invalid ({e}); re-save the "
                                      "file") from None
        if "timm" in header or "torchvision" in header:
            return None
    return getattr(build_model(ModelName("file", path)), "config", None)


def _trained_input(path: str) -> tuple[int, int]:
    """(in_chans, img_size) a timm/torchvision model's checkpoint was trained on: the preprocessing a training
    run records, else its constructor's in_chans; (3, 224) for a file that says neither."""
    from resmlp.checkpoint import read_header

    header = read_header(path) if path.endswith(".safetensors") else {}
    pre = header.get("extra", {}).get("preprocess")
    pre = pre if isinstance(pre, dict) else {}
    built = header.get("timm", {}).get("kwargs", {}).get("in_chans") or header.get("torchvision", {}).get("in_chans")
    in_chans, img_size = pre.get("in_chans") or built or 3, pre.get("img_size") or 224
    return (int(in_chans), int(img_size)) if isinstance(in_chans, int) and isinstance(img_size, int) else (3, 224)


def load_weights_file(model: nn.Module, path: str | Path, what: str) -> nn.Module:
    """Fill `model` from a state-dict file (safetensors, or a torch file read weights-only, flat or under
    'model'/'state_dict'); a message when the file doesn't fit."""
    from resmlp.checkpoint_reader import check_state_dict, read_safetensors, read_torch_file
    from resmlp.errors import CheckpointError

    if str(path).endswith(".safetensors"):
        state = read_safetensors(path)[1]
    else:
        state = read_torch_file(path)
        for key in ("model", "state_dict"):  # common wrappers of training scripts
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
    if not isinstance(state, dict):
        raise CheckpointError(f"weights {path} hold a {type(state).__name__}, not a state dict")
    check_state_dict(state, path)  # names, dense tensors, dtypes, finite values
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"weights {path} do not fit {what}: {str(e).splitlines()[0]} ...") from None
    return model


# ------------------------------------------------------------------------------------------ fine-tuning starts
def resmlp_start(model: nn.Module, img_size: int | None = None) -> nn.Module:
    """A ResMLP/Mixer read from a checkpoint, at `img_size` (a clear error for a grid the resize cannot reach)."""
    from resmlp.transfer import change_resolution

    if img_size is not None and img_size != model.config.img_size:
        model = change_resolution(model, img_size)
    return model


def timm_start(start: nn.Module, checkpoint: str | Path, num_classes: int, **overrides: Any) -> nn.Module:
    """A timm model read from a checkpoint, rebuilt for fine-tuning: the dataset's classes and the run's
    `overrides` (dropout), with every weight of the file but the classifier's (a new head, as for a ResMLP)."""
    import timm

    arch = getattr(start, "pretrained_cfg", {}).get("architecture")
    classifier = getattr(start, "pretrained_cfg", {}).get("classifier")
    if not arch or not classifier:
        raise ValueError(f"{checkpoint} holds a {type(start).__name__}, not a ResMLP, MLP-Mixer or timm model; "
                         "fine-tuning starts from those checkpoints")
    model = timm.create_model(arch, pretrained=False, **{**getattr(start, "_model_args", {}), **overrides,
                                                         "num_classes": num_classes})
    state = {k: v for k, v in start.state_dict().items() if not k.startswith(classifier + ".")}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or not all(k.startswith(classifier + ".") for k in missing):
        raise ValueError(f"{checkpoint}: its weights do not fit {arch} rebuilt for fine-tuning "
                         f"({missing[:3]} {unexpected[:3]})")
    model.finetune_classifier = classifier  # what freeze_layers('all-but-head') keeps learning
    return model


def freeze_layers(model: nn.Module, freeze: int | str | None) -> nn.Module:
    """freeze=N: the stem and the first N blocks stop learning; 'all-but-head': only the classifier learns."""
    if freeze is None:
        return model
    if freeze == "all-but-head":
        head = getattr(model, "finetune_classifier", "head")  # a timm model's classifier, e.g. resnets' fc
        model.requires_grad_(False)
        model.get_submodule(head).requires_grad_(True)
        return model
    if not hasattr(model, "blocks"):
        raise ValueError(f"finetune.freeze={freeze}: counting blocks is for ResMLP/Mixer; freeze all-but-head")
    if not 0 <= int(freeze) <= len(model.blocks):
        raise ValueError(f"finetune.freeze={freeze}: the model has {len(model.blocks)} blocks")
    frozen = [model.stem, *model.blocks[: int(freeze)]]
    if model.pos_embed is not None:
        model.pos_embed.requires_grad_(False)
    for module in frozen:
        module.requires_grad_(False)
    return model

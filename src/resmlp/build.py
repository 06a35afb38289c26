"""One grammar for naming a model, everywhere a model is named (training, teachers, benchmark, analysis):

    preset              a preset of this project (resmlp_s12, mixer_b16, ...; `resmlp models` lists them)
    timm:NAME           any timm architecture (random weights unless a weights file is given)
    torchvision:NAME    any torchvision classifier (random weights unless a weights file is given)
    path/to/checkpoint  a checkpoint file: ours (.safetensors with its config), timm's or DeiT's

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

    spec = str(spec).strip()
    prefix, sep, rest = spec.partition(":")
    if sep and prefix in ("timm", "torchvision"):
        if not rest:
            raise ValueError(f"model {spec!r}: write {prefix}:NAME, e.g. timm:resnet18")
        return ModelName(prefix, rest)
    if spec in PRESETS:
        return ModelName("preset", spec)
    if spec.endswith(CHECKPOINT_SUFFIXES) or Path(spec).is_file():
        return ModelName("file", spec)
    close = difflib.get_close_matches(spec, list(PRESETS), n=3)
    hint = f" did you mean {', '.join(close)}?" if close else ""
    import timm

    if timm.is_model(spec):
        hint = f" {spec} is a timm architecture: write timm:{spec}"
    raise ValueError(f"unknown model {spec!r}: expected a preset (`resmlp models`), timm:NAME, torchvision:NAME or "
                     f"a checkpoint file (.safetensors, .pth).{hint}")


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
        from resmlp.models.registry import create_model

        return create_model(name.name, **sizes, **overrides)
    if name.kind == "file":
        from resmlp.checkpoint import load

        if not Path(name.name).is_file():
            raise FileNotFoundError(f"checkpoint {name.name} does not exist")
        return load(name.name, **overrides)
    if name.kind == "timm":
        import timm

        if not timm.is_model(name.name):
            raise ValueError(f"timm has no model {name.name!r} (see timm.list_models())")
        model = _construct(name, overrides, lambda: timm.create_model(name.name, pretrained=False, **sizes,
                                                                      **overrides))
    else:
        import torchvision

        if name.name not in torchvision.models.list_models(module=torchvision.models):
            raise ValueError(f"torchvision has no classification model {name.name!r}")
        model = _construct(name, overrides, lambda: torchvision.models.get_model(
            name.name, weights=None, **({"num_classes": num_classes} if num_classes is not None else {})))
    if weights is not None:
        load_weights_file(model, weights, str(name))
    if name.kind == "torchvision" and in_chans == 1:
        model = RepeatChannels(model)  # torchvision classifiers take RGB
    return model


def _construct(name: ModelName, overrides: dict[str, Any], make) -> nn.Module:
    """`make()`, with a constructor's refusal of its arguments (TypeError, ValueError, AssertionError...) as a
    ConfigError naming the model and the model.* keys given: they are what the user can change."""
    from resmlp.errors import ConfigError

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
            return overrides.get("in_chans", 3), overrides.get("img_size", 224)
        return cfg.in_chans, overrides.get("img_size") or cfg.img_size
    return overrides.get("in_chans", 3), overrides.get("img_size", 224)


def _file_config(path: str):
    """A checkpoint's ResMLPConfig: from the safetensors header where ours holds it (no tensor is read), else
    from the model built from the file (timm's and DeiT's files); None for a timm model's file."""
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
    return getattr(build_model(ModelName("file", path)), "config", None)


class RepeatChannels(nn.Module):
    """Grayscale input for an RGB model: the channel repeated three times."""

    def __init__(self, model: nn.Module, times: int = 3) -> None:
        super().__init__()
        self.model, self.times = model, times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.repeat(1, self.times, 1, 1) if x.shape[1] == 1 else x)


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
def load_resmlp_start(checkpoint: str | Path, img_size: int | None = None) -> nn.Module:
    """A ResMLP/Mixer checkpoint as a model at `img_size`; clear errors for other architectures or sizes."""
    from resmlp.models.resmlp import ResMLP
    from resmlp.transfer import change_resolution

    model = build_model(str(checkpoint))
    if not isinstance(model, ResMLP):
        raise ValueError(f"{checkpoint} holds a {type(model).__name__} (timm), not a ResMLP or MLP-Mixer; "
                         "fine-tuning starts from ResMLP/Mixer checkpoints (ours, timm's or DeiT's)")
    if img_size is not None and img_size != model.config.img_size:
        model = change_resolution(model, img_size)  # raises for a grid the resize cannot reach
    return model


def freeze_layers(model: nn.Module, freeze: int | str | None) -> nn.Module:
    """freeze=N: the stem and the first N blocks stop learning; 'all-but-head': only the classifier learns."""
    if freeze is None:
        return model
    if freeze == "all-but-head":
        frozen = [m for name, m in model.named_children() if name != "head"]
    else:
        if not 0 <= int(freeze) <= len(model.blocks):
            raise ValueError(f"finetune.freeze={freeze}: the model has {len(model.blocks)} blocks")
        frozen = [model.stem, *model.blocks[: int(freeze)]]
        if model.pos_embed is not None:
            model.pos_embed.requires_grad_(False)
    for module in frozen:
        module.requires_grad_(False)
    return model

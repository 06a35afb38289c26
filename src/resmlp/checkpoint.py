"""Checkpoint files: this project's safetensors format, timm / DeiT state dicts, conversion both ways.

Formats (detected from the keys):
- ``resmlp``: this project's names (``cross_patch``, ``channel_mlp``, ``*_scale.gamma``); the
  safetensors file carries the model config (and any extra metadata) so it rebuilds the model alone.
- ``timm_resmlp``: timm's ResMLP (``linear_tokens``, ``ls1``, ``stem.proj``, Affine shaped (1, 1, dim)).
- ``deit_resmlp``: the DeiT repository's files (``attn``, ``gamma_1``, ``patch_embed.proj``), flat or
  under ``model``.
- ``timm_mixer``: timm's MLP-Mixer (``mlp_tokens``, ``mlp_channels``).
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import socket
import zipfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

# CheckpointError and atomic_write moved to resmlp.errors / resmlp.fileio; importable from here as before
from resmlp.errors import CheckpointError
from resmlp.fileio import atomic_write
from resmlp.models.resmlp import ResMLP, ResMLPConfig

FORMATS = ("resmlp", "timm_resmlp", "deit_resmlp", "timm_mixer")

# per-block key prefixes: this project's name -> the other format's name
_BLOCK_NAMES: dict[str, dict[str, str]] = {
    "timm_resmlp": {
        "cross_patch_norm.": "norm1.",
        "cross_patch_scale.gamma": "ls1",
        "cross_patch.": "linear_tokens.",
        "channel_norm.": "norm2.",
        "channel_mlp.": "mlp_channels.",
        "channel_scale.gamma": "ls2",
    },
    "deit_resmlp": {
        "cross_patch_norm.": "norm1.",
        "cross_patch_scale.gamma": "gamma_1",
        "cross_patch.": "attn.",
        "channel_norm.": "norm2.",
        "channel_mlp.": "mlp.",
        "channel_scale.gamma": "gamma_2",
    },
    "timm_mixer": {
        "cross_patch_norm.": "norm1.",
        "cross_patch.": "mlp_tokens.",
        "channel_norm.": "norm2.",
        "channel_mlp.": "mlp_channels.",
    },
}
_TOP_NAMES: dict[str, dict[str, str]] = {"deit_resmlp": {"stem.": "patch_embed."}}
# formats whose Affine parameters are stored as (1, 1, dim)
_AFFINE_3D = ("timm_resmlp", "deit_resmlp")


class WeightsUnavailableError(RuntimeError):
    """Published weights could not be fetched; the message names the file to place by hand."""


# ------------------------------------------------------------------------------------------ files
def torch_load(path: str | Path) -> Any:
    """torch.load with weights_only=True and errors that explain what is wrong with the file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        # DeiT's training checkpoints carry an argparse.Namespace of their arguments: plain data
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {path}: it needs code to unpickle ({str(e).splitlines()[0][:200]}), and "
            "untrusted checkpoints must never run code. If you trust its source, re-save only its tensors "
            "(torch.save(state_dict, ...)) or convert it to safetensors"
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError) as e:
        raise CheckpointError(f"{path} is truncated or not a PyTorch checkpoint ({e}); re-download or "
                              "re-save it") from None


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of a checkpoint file (.safetensors, or a torch pickle read weights-only) and its metadata."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        try:
            with safe_open(str(path), framework="pt") as f:
                raw_meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        except Exception as e:  # safetensors raises its own error types for bad headers and short files
            raise CheckpointError(f"{path} is not a readable safetensors file ({e}); it may be truncated or "
                                  "of another format: re-download or re-save it") from None
        return tensors, _decode_metadata(raw_meta)
    obj = torch_load(path)
    for key in ("model", "state_dict", "model_ema", "module"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path} holds no state dict (a dict of tensors, flat or under 'model')")
    return {k.removeprefix("module."): v for k, v in obj.items()}, {}


def _decode_metadata(raw: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key in ("config", "timm", "extra"):
        if key in raw:
            try:
                meta[key] = json.loads(raw[key])
            except json.JSONDecodeError as e:
                raise CheckpointError(f"checkpoint metadata {key!r} is not valid JSON ({e})") from None
    return meta


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The extra metadata saved with `save(..., metadata=...)` (class names, preprocessing...)."""
    return read_checkpoint(path)[1].get("extra", {})


# ------------------------------------------------------------------------------------------ key maps
def detect_format(state_dict: dict[str, torch.Tensor]) -> str:
    """Which of FORMATS a state dict is in, from its key names."""
    keys = list(state_dict)

    def has(fragment: str) -> bool:
        return any(fragment in k for k in keys)

    if has(".cross_patch") or has(".channel_mlp."):
        return "resmlp"
    if has(".linear_tokens."):
        return "timm_resmlp"
    if has(".mlp_tokens."):
        return "timm_mixer"
    if has("patch_embed.proj.") and (has(".attn.") or has(".gamma_1")):
        return "deit_resmlp"
    raise CheckpointError(
        f"unrecognised checkpoint keys (first: {keys[:4]}); expected a ResMLP or Mixer state dict in this "
        f"project's, timm's or DeiT's format"
    )


def _rename(key: str, names: dict[str, str], top: dict[str, str]) -> str:
    for src, dst in top.items():
        if key.startswith(src):
            return dst + key[len(src):]
    parts = key.split(".", 2)
    if len(parts) == 3 and parts[0] == "blocks":
        for src, dst in names.items():
            if parts[2].startswith(src):
                return f"blocks.{parts[1]}.{dst}{parts[2][len(src):]}"
    return key


def to_resmlp_keys(state_dict: dict[str, torch.Tensor], fmt: str | None = None) -> dict[str, torch.Tensor]:
    """Convert a state dict from any of FORMATS to this project's names and shapes."""
    fmt = fmt or detect_format(state_dict)
    if fmt == "resmlp":
        return dict(state_dict)
    names = {v: k for k, v in _BLOCK_NAMES[fmt].items()}
    top = {v: k for k, v in _TOP_NAMES.get(fmt, {}).items()}
    out = {}
    for key, value in state_dict.items():
        if fmt in _AFFINE_3D and key.endswith((".alpha", ".beta")):
            value = value.reshape(-1)
        out[_rename(key, names, top)] = value
    return out


def from_resmlp_keys(state_dict: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Convert a state dict in this project's names to `fmt` ('timm_resmlp', 'deit_resmlp', 'timm_mixer')."""
    if fmt == "resmlp":
        return dict(state_dict)
    out = {}
    for key, value in state_dict.items():
        if fmt in _AFFINE_3D and key.endswith((".alpha", ".beta")):
            value = value.reshape(1, 1, -1)
        out[_rename(key, _BLOCK_NAMES[fmt], _TOP_NAMES.get(fmt, {}))] = value
    return out


# ------------------------------------------------------------------------------------------ configs
def infer_config(state_dict: dict[str, torch.Tensor], **overrides: Any) -> ResMLPConfig:
    """Read the architecture off a state dict in this project's names (for files without a config)."""
    sd = state_dict
    if "stem.proj.weight" not in sd:
        raise CheckpointError("cannot infer the architecture: the state dict has no stem.proj.weight")
    dim, in_chans, patch, _ = sd["stem.proj.weight"].shape
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("blocks."))
    b0 = "blocks.0."
    values: dict[str, Any] = dict(dim=dim, in_chans=in_chans, patch_size=patch, depth=depth)
    if b0 + "cross_patch.weight" in sd:
        values["cross_patch"], num_patches = "linear", sd[b0 + "cross_patch.weight"].shape[0]
    elif b0 + "cross_patch.fc1.weight" in sd:
        hidden, num_patches = sd[b0 + "cross_patch.fc1.weight"].shape
        values.update(cross_patch="mlp", cross_patch_hidden=None if hidden == 4 * num_patches else hidden)
    else:
        num_patches = None
        if b0 + "cross_patch.conv.weight" in sd:
            depthwise = sd[b0 + "cross_patch.conv.weight"].shape[1] == 1
            dwsep = b0 + "cross_patch.pointwise.weight" in sd
            values["cross_patch"] = "dwsep3x3" if dwsep else "dwconv3x3" if depthwise else "conv3x3"
        else:
            values["cross_patch"] = "none"
    if num_patches is not None:
        grid = math.isqrt(num_patches)
        values["img_size"] = grid * patch
    elif "img_size" not in overrides:
        raise CheckpointError("this checkpoint's image size can't be read off its weights; pass img_size=...")
    norm_key = b0 + "channel_norm."
    if norm_key + "alpha" in sd:
        values["norm"] = "affine"
    elif norm_key + "running_mean" in sd:
        values["norm"] = "batchnorm"
    elif norm_key + "affine.alpha" in sd:
        values["norm"] = "l2"
    elif norm_key + "weight" in sd:
        values["norm"] = "layernorm"
    else:
        values["norm"] = "none"
    values["layerscale"] = b0 + "channel_scale.gamma" in sd
    values["mlp_ratio"] = sd[b0 + "channel_mlp.fc1.weight"].shape[0] / dim
    values["pooling"] = "class_mlp" if "class_mlp.cls_token" in sd else "avg"
    values["pos_embed"] = "pos_embed" in sd
    values["num_classes"] = sd["head.weight"].shape[0] if "head.weight" in sd else 0
    return ResMLPConfig.from_dict({**values, **overrides})


# ------------------------------------------------------------------------------------------ loading
def load_checkpoint(model: ResMLP, path: str | Path, reset_head: bool = False) -> ResMLP:
    """Load weights of any supported format into `model` in place; `reset_head` keeps the model's head."""
    tensors, _ = read_checkpoint(path)
    state_dict = to_resmlp_keys(tensors)
    if reset_head:
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("head.")}
    _check_fits(model, state_dict, path, ignore_head=reset_head)
    model.load_state_dict(state_dict, strict=not reset_head)
    return model


def _check_fits(model: ResMLP, state_dict: dict[str, torch.Tensor], path: str | Path, ignore_head: bool) -> None:
    expected = {k: v.shape for k, v in model.state_dict().items() if not (ignore_head and k.startswith("head."))}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state_dict) if state_dict[k].shape != expected[k])
    if not (missing or unexpected or wrong):
        return
    lines = [f"{path} does not fit this model ({_describe(model.config)}):"]
    try:
        try:
            theirs = infer_config(state_dict)
        except CheckpointError:  # convolutional/none cross-patch: the size isn't in the weights
            theirs = infer_config(state_dict, img_size=model.config.img_size)
        diffs = [f"{f}: checkpoint {getattr(theirs, f)!r}, model {getattr(model.config, f)!r}"
                 for f in ("dim", "depth", "patch_size", "img_size", "in_chans", "num_classes", "cross_patch",
                           "norm", "pooling", "pos_embed", "mlp_ratio")
                 if getattr(theirs, f) != getattr(model.config, f)]
        lines += [f"  {d}" for d in diffs]
    except (CheckpointError, ValueError, KeyError):
        pass
    for label, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            lines.append(f"  {label} keys ({len(keys)}): {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}")
    for k in wrong[:5]:
        lines.append(f"  {k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected[k])}")
    lines.append("Build the model from the file with resmlp.load(path), pass the matching preset, or use "
                 "reset_head=True / num_classes=... when only the classifier differs.")
    raise CheckpointError("\n".join(lines))


def _describe(cfg: ResMLPConfig) -> str:
    return f"dim {cfg.dim}, depth {cfg.depth}, {cfg.img_size}px/{cfg.patch_size}, {cfg.num_classes} classes"


def load(path: str | Path, **overrides: Any) -> torch.nn.Module:
    """Rebuild a model from a checkpoint alone: ours (config in the metadata), timm's or DeiT's.

    A file written by `save` for a timm model (e.g. a convnet teacher) rebuilds that timm model.
    """
    tensors, meta = read_checkpoint(path)
    if "timm" in meta:
        return _load_timm_model(path, tensors, meta["timm"], overrides)
    state_dict = to_resmlp_keys(tensors)
    if "config" in meta:
        config = ResMLPConfig.from_dict({**meta["config"], **overrides})
    else:
        config = infer_config(state_dict, **overrides)
    model = ResMLP(config)
    _check_fits(model, state_dict, path, ignore_head=False)
    model.load_state_dict(state_dict)
    return model


def _load_timm_model(path: str | Path, tensors: dict[str, torch.Tensor], spec: dict[str, Any],
                     overrides: dict[str, Any]) -> torch.nn.Module:
    import timm

    model = timm.create_model(spec["name"], pretrained=False, **{**spec["kwargs"], **overrides})
    try:
        model.load_state_dict(tensors)
    except RuntimeError as e:
        raise CheckpointError(f"{path} does not fit timm's {spec['name']} with {spec['kwargs']}: {e}") from None
    return model


# ------------------------------------------------------------------------------------------ saving
def save(model: torch.nn.Module, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
    """Write weights as safetensors with the config (and JSON-able `metadata`) inside; atomically.

    Takes this project's models and timm models (built by timm.create_model, whose name and arguments are
    stored so that `load` rebuilds them).
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"resmlp.save writes safetensors; name the file *.safetensors, not {path.name}")
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if isinstance(model, ResMLP):
        raw_meta = {"format": "resmlp", "config": json.dumps(model.config.to_dict())}
    elif getattr(model, "pretrained_cfg", {}).get("architecture"):
        spec = {"name": model.pretrained_cfg["architecture"], "kwargs": getattr(model, "_model_args", {})}
        raw_meta = {"format": "resmlp", "timm": json.dumps(spec)}
    else:
        raise ValueError(f"resmlp.save stores ResMLP/Mixer models and timm models (made by timm.create_model), "
                         f"not {type(model).__name__}; use torch.save(model.state_dict(), ...) for others")
    if metadata:
        raw_meta["extra"] = json.dumps(metadata)
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=raw_meta))


def export_checkpoint(model: ResMLP, path: str | Path, format: str = "timm") -> Path:
    """Write `model`'s weights for other code bases: format 'timm', 'deit' or 'resmlp'.

    A .safetensors suffix writes safetensors, anything else a torch file (DeiT's files hold {'model': ...}).
    """
    cfg = model.config
    if format == "resmlp":
        return save(model, path)
    is_resmlp = (cfg.cross_patch == "linear" and cfg.norm == "affine" and cfg.layerscale)
    is_mixer = (cfg.cross_patch == "mlp" and cfg.norm == "layernorm" and not cfg.layerscale)
    expressible = cfg.pooling == "avg" and not cfg.pos_embed and cfg.act == "gelu"
    if format == "timm" and expressible and (is_resmlp or is_mixer):
        fmt = "timm_resmlp" if is_resmlp else "timm_mixer"
    elif format == "deit" and expressible and is_resmlp:
        fmt = "deit_resmlp"
    elif format in ("timm", "deit"):
        raise CheckpointError(
            f"this model (cross_patch={cfg.cross_patch}, norm={cfg.norm}, pooling={cfg.pooling}, "
            f"pos_embed={cfg.pos_embed}, act={cfg.act}) has no equivalent in {format}'s ResMLP/Mixer code; "
            "save it in this project's format instead (format='resmlp')"
        )
    else:
        raise ValueError(f"unknown export format {format!r}; choose timm, deit or resmlp")
    tensors = from_resmlp_keys({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, fmt)
    path = Path(path)
    if path.suffix == ".safetensors":
        return atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))
    payload = {"model": tensors} if fmt == "deit_resmlp" else tensors
    return atomic_write(path, lambda tmp: torch.save(payload, tmp))


# ------------------------------------------------------------------------------------------ downloads
def download_published(url: str, timeout_s: float = 30.0) -> Path:
    """Path of a published weight file in torch.hub's cache, downloading it if it isn't there yet."""
    target = Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]
    if target.is_file():
        return target
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout_s)
    try:
        atomic_write(target, lambda tmp: torch.hub.download_url_to_file(url, str(tmp), progress=True))
    except Exception as e:  # any network failure (DNS, refused, timeout, HTTP error) means the same here
        raise WeightsUnavailableError(
            f"could not download {url} ({type(e).__name__}: {e}). Without network access, fetch that file "
            f"elsewhere and place it at {target}, or pass checkpoint_path=... to load a local copy"
        ) from None
    finally:
        socket.setdefaulttimeout(previous)
    return target

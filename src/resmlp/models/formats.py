"""Key layouts of ResMLP / Mixer weights in other code bases, and conversion to and from this project's.

Formats (detected from the keys):
- ``resmlp``: this project's names (``cross_patch``, ``channel_mlp``, ``*_scale.gamma``).
- ``timm_resmlp``: timm's ResMLP (``linear_tokens``, ``ls1``, ``stem.proj``, Affine shaped (1, 1, dim)).
- ``deit_resmlp``: the DeiT repository's (``attn``, ``gamma_1``, ``patch_embed.proj``), every Affine and
  LayerScale 1-D, flat or under ``model``.
- ``timm_mixer``: timm's MLP-Mixer (``mlp_tokens``, ``mlp_channels``).
Training checkpoints wrap the weights: timm's (``state_dict``, ``state_dict_ema``: the EMA is taken), DeiT's
(``model``, ``model_ema``: ``model`` is taken, as DeiT evaluates), DINO's (``teacher`` / ``student``, keys
under ``backbone.`` and ``module.``); `unwrap_state_dict` finds them.
"""

from __future__ import annotations

from typing import Any

import torch

from resmlp.errors import CheckpointError

FORMATS = ("resmlp", "timm_resmlp", "deit_resmlp", "timm_mixer")

# per-block key prefixes: this project's name -> the other format's name
BLOCK_NAMES: dict[str, dict[str, str]] = {
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
TOP_NAMES: dict[str, dict[str, str]] = {"deit_resmlp": {"stem.": "patch_embed."}}
# timm stores Affine parameters as (1, 1, dim); DeiT (and this project) as (dim,)
AFFINE_3D = ("timm_resmlp",)

# where training checkpoints keep the weights, in the order they are preferred: each code base's own choice.
# timm's train.py files (state_dict, state_dict_ema): the EMA, as timm.create_model(checkpoint_path=...) takes
# it (load_checkpoint's default use_ema=True); timm's validate.py takes state_dict unless given --use-ema.
# DeiT's main.py files (model, model_ema): `model`, the weights DeiT's --eval and --resume load and report;
# their `model_ema` only by name (checkpoint_key="model_ema"). DINO's: the teacher (the network DINO
# evaluates) before its student.
WRAPPER_KEYS = ("state_dict_ema", "state_dict", "model", "model_ema", "teacher", "student", "module")


class UnrecognisedFormat(CheckpointError):
    """Keys of no ResMLP / Mixer layout this project knows."""


def is_state_dict(obj: Any) -> bool:
    """A non-empty dict of tensors named by strings."""
    return (isinstance(obj, dict) and bool(obj)
            and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()))


def unwrap_state_dict(obj: Any, checkpoint_key: str | None = None) -> dict[str, torch.Tensor] | None:
    """The model weights inside a loaded checkpoint object (None if there are none).

    checkpoint_key picks the entry (e.g. DINO's 'student'); otherwise the first of WRAPPER_KEYS present.
    Prefixes of distributed wrappers ('module.') and DINO's backbone ('backbone.', its projection head
    dropped) are stripped.
    """
    if checkpoint_key is not None:
        if not isinstance(obj, dict) or checkpoint_key not in obj:
            keys = list(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
            raise KeyError(f"the checkpoint has no entry {checkpoint_key!r} (it has {keys})")
        obj = obj[checkpoint_key]
    elif isinstance(obj, dict) and not is_state_dict(obj):
        obj = next((obj[k] for k in WRAPPER_KEYS if is_state_dict(obj.get(k))), None)
    if not is_state_dict(obj):
        return None
    return strip_wrapper_prefixes(obj)


def torch_file_origin(obj: Any) -> dict[str, Any]:
    """What a torch file is, as far as its evaluation preprocessing goes: a resmlp training state ("state", with
    the run's config), a DINO checkpoint ("dino": a student/teacher entry or 'backbone.' weights), or plain
    weights ("weights")."""
    if isinstance(obj, dict) and "version" in obj and isinstance(obj.get("config"), dict) and "model" in obj:
        return {"kind": "state", "run_config": obj["config"]}
    inner = obj
    if isinstance(obj, dict) and not is_state_dict(obj):
        if any(is_state_dict(obj.get(k)) for k in ("teacher", "student")):
            return {"kind": "dino"}
        inner = next((obj[k] for k in WRAPPER_KEYS if is_state_dict(obj.get(k))), None)
    if is_state_dict(inner) and any(k.removeprefix("module.").startswith("backbone.") for k in inner):
        return {"kind": "dino"}
    return {"kind": "weights"}


def strip_wrapper_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove 'module.' (DDP) and keep only a DINO wrapper's 'backbone.' weights, without the prefix."""
    out = {k.removeprefix("module."): v for k, v in state_dict.items()}
    if any(k.startswith("backbone.") for k in out):
        out = {k.removeprefix("backbone."): v for k, v in out.items() if k.startswith("backbone.")}
    return out


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
    raise UnrecognisedFormat(
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
    names = {v: k for k, v in BLOCK_NAMES[fmt].items()}
    top = {v: k for k, v in TOP_NAMES.get(fmt, {}).items()}
    out = {}
    for key, value in state_dict.items():
        if key.endswith((".alpha", ".beta")):
            value = value.reshape(-1)
        out[_rename(key, names, top)] = value
    return out


def from_resmlp_keys(state_dict: dict[str, torch.Tensor], fmt: str) -> dict[str, torch.Tensor]:
    """Convert a state dict in this project's names to `fmt` ('timm_resmlp', 'deit_resmlp', 'timm_mixer')."""
    if fmt == "resmlp":
        return dict(state_dict)
    out = {}
    for key, value in state_dict.items():
        if key.endswith((".alpha", ".beta")):
            value = value.reshape(1, 1, -1) if fmt in AFFINE_3D else value.reshape(-1)
        out[_rename(key, BLOCK_NAMES[fmt], TOP_NAMES.get(fmt, {}))] = value
    return out


def adapt_state_dict(state_dict: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """`state_dict` (possibly a whole training checkpoint, in any known layout) as `model`'s names and shapes.

    Returns the very same object when there is nothing to do or the keys are of no known layout (then
    load_state_dict reports the mismatch as usual). Grid-tied weights for another patch grid are refitted
    (resmlp.models.resize).
    """
    from resmlp.models.resize import fit_state_dict

    inner = state_dict if is_state_dict(state_dict) else unwrap_state_dict(state_dict)
    if inner is None:
        return state_dict
    inner = strip_wrapper_prefixes(inner)
    try:
        converted = to_resmlp_keys(inner)
    except UnrecognisedFormat:
        return state_dict
    target = {k: v.shape for k, v in model.state_dict().items()}
    fitted = fit_state_dict(converted, target)
    unchanged = fitted.keys() == state_dict.keys() and all(fitted[k] is state_dict[k] for k in fitted)
    return state_dict if unchanged else fitted

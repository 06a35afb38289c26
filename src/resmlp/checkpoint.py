"""Checkpoint files: this project's safetensors format, timm / DeiT / DINO files, conversion both ways.

This project's safetensors file carries the model config (and any extra metadata) so it rebuilds the model
alone. The other code bases' key layouts, and how training checkpoints wrap them, are described (and
converted) in `resmlp.models.formats`.
"""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from resmlp.checkpoint_reader import (
    check_float,
    check_str,
    decode_metadata,
    read_safetensors_header,
    read_state_dict,
    read_torch_file,
)
from resmlp.fileio import atomic_write  # noqa: F401 (moved to resmlp.fileio; importable here as before)
from resmlp.models.constructor_args import check_constructor_args, class_scores_problem
from resmlp.models.formats import (  # noqa: F401 (the key maps are part of this module's API)
    FORMATS,
    CheckpointError,
    detect_format,
    from_resmlp_keys,
    to_resmlp_keys,
    unwrap_state_dict,
)
from resmlp.models.resmlp import ResMLP, ResMLPConfig


class WeightsUnavailableError(RuntimeError):
    """Published weights could not be fetched; the message names the file to place by hand."""


# ------------------------------------------------------------------------------------------ files
# the one reader of checkpoint files is resmlp.checkpoint_reader; these names are this module's API
torch_load = read_torch_file


def read_checkpoint(path: str | Path, allow_nonfinite: bool = False, checkpoint_key: str | None = None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Tensors of a checkpoint file (.safetensors, or a torch zip read weights-only) and its metadata.

    Refuses (CheckpointError) malformed files, tensors and metadata and NaN/infinite values, naming the
    first bad tensor; `allow_nonfinite=True` only warns about them (see resmlp.checkpoint_reader).
    checkpoint_key: the entry of a training checkpoint to read (e.g. timm's 'state_dict_ema').
    """
    return read_state_dict(path, allow_nonfinite, checkpoint_key)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The extra metadata saved with `save(..., metadata=...)` (class names, preprocessing...).

    Reads only the file's header for safetensors files, not its tensors.
    """
    path = Path(path)
    if path.suffix != ".safetensors":
        return read_checkpoint(path)[1].get("extra", {})
    return read_header(path).get("extra", {})


def read_header(path: str | Path) -> dict[str, Any]:
    """The decoded metadata ('config', 'timm', 'extra') of a .safetensors file, from its header alone."""
    return decode_metadata(read_safetensors_header(path), path)


# ------------------------------------------------------------------------------------------ configs
def infer_config(state_dict: dict[str, torch.Tensor], **overrides: Any) -> ResMLPConfig:
    """Read the architecture off a state dict in this project's names (for files without a config)."""
    if "stem.proj.weight" not in state_dict:
        raise CheckpointError("cannot infer the architecture: the state dict has no stem.proj.weight")
    try:
        values = _architecture_of(state_dict, overrides)
    except CheckpointError:
        raise
    except (KeyError, ValueError, IndexError) as e:  # a tensor missing or of another rank: not a whole trunk
        raise CheckpointError(f"cannot infer the architecture: the state dict is not a whole ResMLP/Mixer trunk "
                              f"({type(e).__name__}: {e})") from None
    return ResMLPConfig.from_dict({**values, **overrides})


def _architecture_of(sd: dict[str, torch.Tensor], overrides: dict[str, Any]) -> dict[str, Any]:
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
    return values


# ------------------------------------------------------------------------------------------ loading
def load_checkpoint(model: ResMLP, path: str | Path, reset_head: bool = False,
                    allow_nonfinite: bool = False) -> ResMLP:
    """Load weights of any supported format into `model` in place; `reset_head` keeps the model's head."""
    tensors, _ = read_checkpoint(path, allow_nonfinite)
    return load_state_into(model, to_resmlp_keys(tensors), path, reset_head)


def load_state_into(model: ResMLP, state_dict: dict[str, torch.Tensor], source: str | Path,
                    reset_head: bool = False, as_read: dict[str, torch.Tensor] | None = None) -> ResMLP:
    """Load a state dict in this project's names into `model`, saying what differs (from `source`) if it
    doesn't fit; `reset_head` keeps the model's head. `as_read`: the file's tensors before any grid was
    refitted to the model, which the message describes (a refitted grid would report a size the file is not)."""
    if reset_head:
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("head.")}
    check_fits(model, state_dict, source, ignore_head=reset_head, as_read=as_read)
    model.load_state_dict(state_dict, strict=not reset_head)
    return model


def check_fits(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], path: str | Path,
               ignore_head: bool = False, as_read: dict[str, torch.Tensor] | None = None) -> None:
    """A CheckpointError saying what differs where `state_dict` (read from `path`) does not fit `model`."""
    expected = {k: v for k, v in model.state_dict().items() if not (ignore_head and k.startswith("head."))}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    common = sorted(set(expected) & set(state_dict))
    wrong = [k for k in common if state_dict[k].shape != expected[k].shape]
    # load_state_dict would cast int8/bool values into float parameters without a word: a garbage model
    not_float = [k for k in common if expected[k].is_floating_point() and not state_dict[k].is_floating_point()]
    if not (missing or unexpected or wrong or not_float):
        return
    lines = [f"{path} does not fit this model ({_describe(model)}):"]
    if isinstance(model, ResMLP):
        differences = _config_differences(as_read or state_dict, model.config) or []
        lines += [f"  {d}" for d in differences if not (ignore_head and d.startswith("num_classes:"))]
    for label, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            lines.append(f"  {label} keys ({len(keys)}): {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''}")
    for k in wrong[:5]:
        lines.append(f"  {k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected[k].shape)}")
    for k in not_float[:5]:
        lines.append(f"  {k}: checkpoint holds {state_dict[k].dtype} values where the model has "
                     f"{expected[k].dtype} weights")
    if isinstance(model, ResMLP):
        only_head = all(k.startswith("head.") for k in (*missing, *unexpected, *wrong))
        lines.append("Only the classifier differs: resmlp.load_checkpoint(model, path, reset_head=True) keeps the "
                     "model's head." if only_head else "Build the model from the file with resmlp.load(path), or "
                     "pass the preset and sizes it was trained with.")
    else:
        lines.append("Its metadata names an architecture its tensors are not: the file is corrupt or was edited.")
    raise CheckpointError("\n".join(lines))


def _config_differences(state_dict: dict[str, torch.Tensor], config: ResMLPConfig) -> list[str] | None:
    """'field: checkpoint X, model Y' for the architecture fields where the tensors and `config` differ;
    None when the tensors don't form a ResMLP/Mixer that can be read."""
    try:
        try:
            theirs = infer_config(state_dict)
        except CheckpointError:  # convolutional/none cross-patch: the size isn't in the weights
            theirs = infer_config(state_dict, img_size=config.img_size)
    except (CheckpointError, ValueError, KeyError, TypeError, IndexError):
        return None
    return [f"{f}: checkpoint {getattr(theirs, f)!r}, model {getattr(config, f)!r}"
            for f in ("dim", "depth", "patch_size", "img_size", "in_chans", "num_classes", "cross_patch",
                      "norm", "pooling", "pos_embed", "mlp_ratio")
            if getattr(theirs, f) != getattr(config, f)]


def _describe(model: torch.nn.Module) -> str:
    cfg = getattr(model, "config", None)
    if not isinstance(cfg, ResMLPConfig):
        return type(model).__name__
    return f"dim {cfg.dim}, depth {cfg.depth}, {cfg.img_size}px/{cfg.patch_size}, {cfg.num_classes} classes"


def load(path: str | Path, allow_nonfinite: bool = False, **overrides: Any) -> torch.nn.Module:
    """Rebuild a model from a checkpoint alone: ours (config in the metadata), timm's or DeiT's.

    A file written by `save` for a timm model (e.g. a convnet teacher) rebuilds that timm model.
    The architecture the metadata describes is checked against the file's tensors (names, shapes,
    dtypes) on PyTorch's meta device, which allocates nothing, before the model is built: a tiny file
    claiming a gigantic config is refused, not allocated. NaN/infinite weights are refused unless
    `allow_nonfinite` (then a warning).
    """
    return load_with_metadata(path, allow_nonfinite, **overrides)[0]


def load_with_metadata(path: str | Path, allow_nonfinite: bool = False,
                       **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """`load` and `read_metadata` from one read of the file: the model and the metadata saved with it."""
    model, header = load_with_header(path, allow_nonfinite, **overrides)
    return model, header.get("extra", {})


def load_with_header(path: str | Path, allow_nonfinite: bool = False, checkpoint_key: str | None = None,
                     **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The model and everything the file says about itself: read_checkpoint's metadata ('config', 'timm',
    'torchvision', 'extra'; 'torch' for torch files) and 'layout', the key layout of its weights (one of
    resmlp.models.formats.FORMATS, None for timm/torchvision models): what the evaluation preprocessing of a
    file without preprocessing metadata is chosen by (resmlp.preprocess.preprocess_of_file)."""
    tensors, meta = read_checkpoint(path, allow_nonfinite, checkpoint_key)
    try:
        layout = None if "timm" in meta or "torchvision" in meta else detect_format(tensors)
    except CheckpointError:
        layout = None  # _build_from_tensors refuses the file with its own message
        state = meta.get("torch", {})
        if state.get("kind") == "state":  # a timm:/torchvision: run's state holds no architecture to rebuild
            model = (state.get("run_config") or {}).get("model")
            name = model.get("name") if isinstance(model, dict) else None
            raise CheckpointError(f"{path} is the training state of a {name!s:.60} run, which it cannot rebuild; "
                                  f"evaluate the run's {Path(path).with_name('last.safetensors')} (the same weights, "
                                  "with the run's preprocessing)") from None
    return _build_from_tensors(path, tensors, meta, overrides), {**meta, "layout": layout}


def _build_from_tensors(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                        overrides: dict[str, Any]) -> torch.nn.Module:
    if "timm" in meta:
        return _load_timm_model(path, tensors, meta["timm"], overrides)
    if "torchvision" in meta:
        return _load_torchvision_model(path, tensors, meta["torchvision"])
    state_dict = to_resmlp_keys(tensors)
    if "config" in meta:
        try:
            config = ResMLPConfig.from_dict({**meta["config"], **overrides})
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: the model config in its metadata is invalid ({e}); re-save the "
                                  "file or build the model yourself and use load_checkpoint") from None
    else:
        config = infer_config(state_dict, **overrides)
    _check_config_bounds(config, state_dict, path)
    with torch.device("meta"):
        skeleton = ResMLP(config)
    check_fits(skeleton, state_dict, path, ignore_head=False)
    model = ResMLP(config)
    model.load_state_dict(state_dict)
    model.pretrained_cfg = describe_checkpoint(model, meta.get("extra", {}))
    return model


def describe_checkpoint(model: ResMLP, metadata: dict[str, Any]) -> dict[str, Any]:
    """timm's pretrained_cfg of a model read from a file: its size and classes, and the evaluation
    preprocessing (mean, std, crop, interpolation) stored in the file's metadata where there is one."""
    cfg = dict(model.pretrained_cfg)
    pre = metadata.get("preprocess")
    where = "checkpoint preprocess metadata"
    if isinstance(pre, dict):
        for key in ("mean", "std"):
            if isinstance(pre.get(key), (list, tuple)):
                cfg[key] = tuple(check_float(v, key, where, -1e6, 1e6) for v in pre[key])
        if "crop_pct" in pre:
            cfg["crop_pct"] = check_float(pre["crop_pct"], "crop_pct", where, 0.1, 1.0)
        if "interpolation" in pre:
            cfg["interpolation"] = check_str(pre["interpolation"], "interpolation", where)
    if isinstance(metadata.get("class_names"), list):
        cfg["label_names"] = [str(n) for n in metadata["class_names"]]
    return cfg


def _check_config_bounds(config: ResMLPConfig, state_dict: dict[str, torch.Tensor], path: str | Path) -> None:
    """The sizes that drive a model's memory (depth, width, classes, patches) must be those of the file's
    tensors; checked on numbers alone so that even building on the meta device stays cheap."""
    differences = _config_differences(state_dict, config)
    if differences is None:
        raise CheckpointError(f"{path}: its tensors (first: {list(state_dict)[:4]}) do not form a ResMLP or "
                              "Mixer whose architecture can be read; the file is corrupt or of another model")
    sizes = ("dim", "depth", "patch_size", "img_size", "in_chans", "num_classes")
    mismatched = [d for d in differences if d.split(":")[0] in sizes]
    if mismatched:
        raise CheckpointError(f"{path}: the model config in its metadata does not match its tensors "
                              f"({'; '.join(mismatched)}); the file is corrupt or was edited")


def _load_timm_model(path: str | Path, tensors: dict[str, torch.Tensor], spec: dict[str, Any],
                     overrides: dict[str, Any]) -> torch.nn.Module:
    """The timm model that `spec` names, only if the file's tensors are exactly that model's."""
    import timm

    name, kwargs = spec["name"], {**spec["kwargs"], **overrides}
    if not timm.is_model(name):
        raise CheckpointError(f"{path}: its metadata names timm model {name!r}, which timm "
                              f"{timm.__version__} does not know")
    bound = _size_bound(tensors)
    oversized = [k for k, v in kwargs.items() if _largest_number(v) > bound]
    if oversized:
        raise CheckpointError(f"{path}: timm arguments {', '.join(f'{k}={kwargs[k]!r}' for k in oversized)} "
                              f"exceed every size in the file's tensors ({bound}); the metadata was edited")
    check_constructor_args(kwargs, f"{path}: timm model {name}", CheckpointError)  # no paths, loaders, overlays
    try:
        with torch.device("meta"):
            skeleton = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as e:  # timm raises TypeError/ValueError/AssertionError... for arguments it can't take
        raise CheckpointError(f"{path}: timm can't build {name} with {kwargs} ({type(e).__name__}: {e})") from None
    check_fits(skeleton, tensors, path, ignore_head=False)
    _check_class_scores(skeleton, kwargs.get("in_chans", 3), kwargs.get("img_size"), path)
    model = timm.create_model(name, pretrained=False, **kwargs)
    model.load_state_dict(tensors)
    return model


def _load_torchvision_model(path: str | Path, tensors: dict[str, torch.Tensor],
                            spec: dict[str, Any]) -> torch.nn.Module:
    """The torchvision classifier that `spec` names, only if the file's tensors are exactly that model's."""
    from resmlp.models.torchvision_models import build_torchvision

    if not (isinstance(spec, dict) and isinstance(spec.get("name"), str) and isinstance(spec.get("kwargs"), dict)
            and spec.get("in_chans") in (None, 1, 3)):
        raise CheckpointError(f"{path}: its torchvision metadata is malformed; the file is corrupt or was edited")
    bound = _size_bound(tensors)
    if _largest_number(spec["kwargs"]) > bound:
        raise CheckpointError(f"{path}: torchvision arguments {spec['kwargs']} exceed every size in the file's "
                              f"tensors ({bound}); the metadata was edited")
    check_constructor_args(spec["kwargs"], f"{path}: torchvision model {spec['name']}", CheckpointError)
    try:
        with torch.device("meta"):
            skeleton = build_torchvision(spec["name"], spec["in_chans"], **spec["kwargs"])
    except Exception as e:  # torchvision raises TypeError/ValueError... for arguments it can't take
        raise CheckpointError(f"{path}: torchvision can't build {spec['name']} with {spec['kwargs']} "
                              f"({type(e).__name__}: {e})") from None
    check_fits(skeleton, tensors, path, ignore_head=False)
    _check_class_scores(skeleton, spec["in_chans"] or 3, spec["kwargs"].get("image_size"), path)
    model = build_torchvision(spec["name"], spec["in_chans"], **spec["kwargs"])
    model.load_state_dict(tensors)
    return model


def _check_class_scores(skeleton: torch.nn.Module, in_chans: Any, img_size: Any, path: str | Path) -> None:
    """The rebuilt model (on the meta device: nothing computed) gives (N, num_classes) class scores: metadata
    such as global_pool='' keeps every tensor's shape but makes the output a feature map."""
    size = img_size if isinstance(img_size, int) else \
        getattr(skeleton, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[-1]
    try:
        with torch.device("meta"), torch.no_grad():
            out = skeleton.eval()(torch.empty(2, in_chans if in_chans in (1, 3) else 3, size, size))
    except Exception as e:  # a model refuses its input in its own words
        raise CheckpointError(f"{path}: the model its metadata describes can't classify a {size}px image "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); the metadata was edited"
                              ) from None
    problem = class_scores_problem(out, getattr(skeleton, "num_classes", None))
    if problem:
        raise CheckpointError(f"{path}: the model its metadata describes {problem}; the metadata was edited")


def _size_bound(tensors: dict[str, torch.Tensor]) -> int:
    """No architecture argument (a depth, a width, an image size) of a model can sensibly exceed the
    largest dimension among its tensors and their count by much; 4x plus a floor leaves room for image
    sizes of small convnets."""
    largest = max((max(t.shape, default=1) for t in tensors.values()), default=1)
    return 4 * max(largest, len(tensors)) + 1024


def _largest_number(value: Any) -> float:
    if isinstance(value, bool):
        return 0
    if isinstance(value, (int, float)):
        return abs(value)
    if isinstance(value, (list, tuple)):
        return max((_largest_number(v) for v in value), default=0)
    if isinstance(value, dict):
        return max((_largest_number(v) for v in value.values()), default=0)
    return 0


# ------------------------------------------------------------------------------------------ saving
def save(model: torch.nn.Module, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
    """Write weights as safetensors with the config (and JSON-able `metadata`) inside; atomically.

    Takes this project's models, timm models (built by timm.create_model) and torchvision classifiers built by
    `resmlp.build` (torchvision:NAME), whose name and arguments are stored so that `load` rebuilds them.
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
    elif getattr(model, "torchvision_spec", None):
        raw_meta = {"format": "resmlp", "torchvision": json.dumps(model.torchvision_spec)}
    else:
        raise ValueError(f"resmlp.save stores ResMLP/Mixer, timm (made by timm.create_model) and torchvision models "
                         f"(made by resmlp.build.build_model('torchvision:NAME')), "
                         f"not {type(model).__name__}; use torch.save(model.state_dict(), ...) for others")
    if metadata:
        raw_meta["extra"] = json.dumps(metadata)
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=raw_meta))


EXPORT_FORMATS = ("timm", "deit", "dino", "resmlp")


def export_checkpoint(model: ResMLP, path: str | Path, format: str = "timm") -> Path:
    """Write `model`'s weights for other code bases: format 'timm', 'deit', 'dino' or 'resmlp'.

    - timm: timm's key names and shapes (load with timm.create_model(..., checkpoint_path=...)).
    - deit: the DeiT repository's (resmlp_models.py: 1-D Affine and LayerScale), as {'model': ...}.
    - dino: a DINO backbone file, {'teacher': {'backbone.<DeiT keys>': ...}} without the classifier, the
      layout DINO's eval_knn.py / eval_linear.py read with --checkpoint_key teacher.
    A .safetensors suffix writes safetensors (flat DeiT keys for 'deit'), anything else a torch file.
    """
    if format == "resmlp":
        return save(model, path)
    if format not in EXPORT_FORMATS:
        raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    fmt = _foreign_layout(model.config, format)
    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if format == "dino":
        state = {k: v for k, v in state.items() if not k.startswith("head.")}
    tensors = from_resmlp_keys(state, fmt)
    path = Path(path)
    if path.suffix == ".safetensors":
        return atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))
    if format == "dino":
        payload: dict[str, Any] = {"teacher": {f"backbone.{k}": v for k, v in tensors.items()}}
    else:
        payload = {"model": tensors} if format == "deit" else tensors
    return atomic_write(path, lambda tmp: torch.save(payload, tmp))


def _foreign_layout(cfg: ResMLPConfig, format: str) -> str:
    """The key layout `format` writes this configuration in; CheckpointError if that code base can't express it."""
    is_resmlp = cfg.cross_patch == "linear" and cfg.norm == "affine" and cfg.layerscale
    is_mixer = cfg.cross_patch == "mlp" and cfg.norm == "layernorm" and not cfg.layerscale
    expressible = cfg.pooling == "avg" and not cfg.pos_embed and cfg.act == "gelu"
    if expressible and format == "timm" and (is_resmlp or is_mixer):
        return "timm_resmlp" if is_resmlp else "timm_mixer"
    if expressible and format in ("deit", "dino") and is_resmlp:
        return "deit_resmlp"
    raise CheckpointError(
        f"this model (cross_patch={cfg.cross_patch}, norm={cfg.norm}, pooling={cfg.pooling}, "
        f"pos_embed={cfg.pos_embed}, act={cfg.act}) has no equivalent in {format}'s ResMLP/Mixer code; "
        "save it in this project's format instead (format='resmlp')"
    )


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

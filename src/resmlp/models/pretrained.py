"""The presets as timm models: pretrained configs, building through timm's builder, fetching weights.

Every preset is registered with timm (`timm.create_model(name)` after `import resmlp`), with a pretrained
config per published weight tag (`timm.list_pretrained("resmlp*")`), built by timm's `build_model_with_cfg`
so that `features_only`, `pretrained_cfg_overlay`, `in_chans` stem adaptation and head replacement behave as
for timm's own models. Weights resolve through timm's Hugging Face Hub copy where timm publishes one (the
Hugging Face cache; HF_HUB_OFFLINE=1 uses only the cache), else the original DeiT / Google URL (torch.hub's
cache). Any file is read weights-only by this project's reader, so DeiT, DINO and timm training checkpoints
load too.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs

from resmlp.models.formats import adapt_state_dict
from resmlp.models.registry import PRESETS, PUBLISHED, PublishedWeights, model_config, published_weights
from resmlp.models.resmlp import ResMLP, describe_model, scaled_token_mlp_width

_PAPERS = {"resmlp": "arXiv:2105.03404", "mixer": "arXiv:2105.01601", "dino": "arXiv:2104.14294"}
_ORIGINS = {"resmlp": "https://github.com/facebookresearch/deit",
            "mixer": "https://github.com/google-research/vision_transformer"}


def weights_cfg(name: str, tag: str, weights: PublishedWeights) -> dict[str, Any]:
    """timm pretrained_cfg of preset `name`'s weights `tag`."""
    cfg = model_config(name)
    family = "mixer" if name.startswith("mixer") else "resmlp"
    papers = [_PAPERS[family]] + ([_PAPERS["dino"]] if "dino" in tag else [])
    return dict(
        url=weights.url, hf_hub_id=weights.hf_hub_id, architecture=name, tag=tag,
        num_classes=weights.num_classes, input_size=(cfg.in_chans, cfg.img_size, cfg.img_size),
        fixed_input_size=True, pool_size=None, crop_pct=weights.crop_pct, interpolation="bicubic",
        mean=weights.mean, std=weights.std, first_conv="stem.proj", classifier="head",
        license="apache-2.0", origin_url=_ORIGINS[family], paper_ids=", ".join(papers),
    )


def _untrained_cfg(name: str) -> dict[str, Any]:
    cfg = describe_model(model_config(name))
    if name.startswith("mixer"):
        cfg.update(mean=(0.5,) * 3, std=(0.5,) * 3)
    return {**cfg, "architecture": name, "license": "apache-2.0",
            "paper_ids": _PAPERS["mixer" if name.startswith("mixer") else "resmlp"]}


def _registered_cfgs() -> dict[str, Any]:
    cfgs: dict[str, dict[str, Any]] = {}
    for name in PRESETS:
        tags = PUBLISHED.get(name)
        if not tags:
            cfgs[f"{name}.untrained"] = _untrained_cfg(name)
        for tag, weights in (tags or {}).items():
            cfgs[f"{name}.{tag}"] = weights_cfg(name, tag, weights)
    return generate_default_cfgs(cfgs)


# timm's register_model reads the configs from the entrypoint's module under this name
default_cfgs = _registered_cfgs()


# ------------------------------------------------------------------------------------------ weights
def resolve_weights_file(cfg: dict[str, Any], cache_dir: str | Path | None = None) -> Path:
    """A local file holding the weights of `cfg`: its 'file', timm's Hub copy or torch.hub's copy of the original
    URL as cached, else downloaded where the network allows (resmlp.models.weight_tags: no ~58 s of retries
    offline, and HF_HUB_OFFLINE=1 reads both caches)."""
    from resmlp.checkpoint import WeightsUnavailableError, download_published
    from resmlp.models.weight_tags import hub_reachable, missing_weights, no_network_reason, torch_hub_file

    if cfg.get("file"):
        return Path(cfg["file"])
    repo, url = cfg.get("hf_hub_id"), cfg.get("url")
    path, hub_failure = _from_hub(repo, cache_dir, local_only=True) if repo else (None, "")
    if path is not None:
        return path
    if url and torch_hub_file(url).is_file():
        return torch_hub_file(url)
    if not (repo or url):
        raise WeightsUnavailableError(f"no weights known for {cfg.get('architecture')}")
    why = no_network_reason(url)
    if why is not None:  # the same line as the CLI's (weight_tags.tagged_weights), naming the tag
        spec = ".".join(str(p) for p in (cfg.get("architecture"), cfg.get("tag")) if p)
        raise WeightsUnavailableError(missing_weights(spec, repo, url, why, "pass checkpoint_path=... to load a "
                                                                           "local copy"))
    if repo and hub_reachable():
        path, hub_failure = _from_hub(repo, cache_dir, local_only=False)
        if path is not None:
            return path
    if url:
        try:
            return download_published(url)
        except WeightsUnavailableError as e:
            raise WeightsUnavailableError(f"{e}{hub_failure}") from None
    raise WeightsUnavailableError(f"no weights known for {cfg.get('architecture')}{hub_failure}")


def _from_hub(repo_id: str, cache_dir: str | Path | None, local_only: bool) -> tuple[Path | None, str]:
    from huggingface_hub import hf_hub_download

    failure = ""
    for filename in ("model.safetensors", "pytorch_model.bin"):
        try:
            return Path(hf_hub_download(repo_id, filename, cache_dir=cache_dir, local_files_only=local_only)), ""
        except Exception as e:  # offline, not cached, no such file, network down: try the next source
            failure = f" (Hugging Face Hub {repo_id}: {type(e).__name__})"
    return None, failure


def read_weights(path: str | Path, checkpoint_key: str | None = None) -> dict[str, torch.Tensor]:
    """The state dict in a weight file (any supported layout, read weights-only); checkpoint_key picks an
    entry of a training checkpoint (DINO's 'teacher' or 'student', DeiT's 'model_ema'...)."""
    from resmlp.checkpoint import CheckpointError, read_checkpoint, torch_load
    from resmlp.models.formats import unwrap_state_dict

    if checkpoint_key is None:
        return read_checkpoint(path)[0]
    try:
        state_dict = unwrap_state_dict(torch_load(path), checkpoint_key)
    except KeyError as e:
        raise CheckpointError(f"{path}: {e.args[0]}") from None
    if state_dict is None:
        raise CheckpointError(f"{path}[{checkpoint_key!r}] holds no state dict")
    return state_dict


def checkpoint_filter_fn(state_dict: dict[str, Any], model: ResMLP) -> dict[str, Any]:
    """timm's pretrained filter: any known key layout -> this model's names and shapes (grid refitted)."""
    return dict(adapt_state_dict(state_dict, model))


# ------------------------------------------------------------------------------------------ building
def _model_factory(name: str):
    base = model_config(name)

    def make(**kwargs: Any) -> ResMLP:
        device, dtype = kwargs.pop("device", None), kwargs.pop("dtype", None)
        for key in ("img_size", "patch_size"):  # timm passes sizes from input_size as (H, W)
            if isinstance(kwargs.get(key), (tuple, list)):
                height, width = kwargs[key]
                if height != width:
                    raise ValueError(f"{key}={tuple(kwargs[key])}: this model needs a square patch grid")
                kwargs[key] = int(height)
        if base.cross_patch == "mlp" and "cross_patch_hidden" not in kwargs:
            grid = kwargs.get("img_size", base.img_size) // kwargs.get("patch_size", base.patch_size)
            kwargs["cross_patch_hidden"] = scaled_token_mlp_width(base, grid)
        model = ResMLP(model_config(name, **kwargs))
        return model.to(device=device, dtype=dtype) if (device or dtype) else model

    return make


def build_preset(
    name: str,
    pretrained: bool = False,
    pretrained_cfg: str | dict[str, Any] | Any | None = None,
    pretrained_cfg_overlay: dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    **kwargs: Any,
) -> torch.nn.Module:
    """Preset `name` built by timm's builder; `pretrained_cfg` a weight tag, a config, or None (the default tag).

    pretrained_cfg_overlay may name a local `file` (and a `checkpoint_key` inside it, e.g. DINO's 'student').
    """
    overlay = dict(pretrained_cfg_overlay or {})
    checkpoint_key = overlay.pop("checkpoint_key", None)
    cfg = _resolve_cfg(name, pretrained_cfg, overlay, pretrained)
    if pretrained:
        path = resolve_weights_file(cfg, cache_dir)
        cfg = {**cfg, "file": str(path), "state_dict": read_weights(path, checkpoint_key)}
    model = build_model_with_cfg(
        _model_factory(name), name, pretrained, pretrained_cfg=cfg,
        feature_cfg=dict(feature_cls="getter", out_indices=kwargs.pop("out_indices", 3)),
        pretrained_filter_fn=checkpoint_filter_fn, cache_dir=cache_dir, **kwargs,
    )
    inner = getattr(model, "model", model)  # features_only wraps the model
    if isinstance(inner, ResMLP):
        model.pretrained_cfg = _describing(dict(model.pretrained_cfg), inner)
        if model is not inner:
            inner.pretrained_cfg = model.pretrained_cfg
        handle = inner.register_load_state_dict_pre_hook(_refuse_another_architecture)
        inner._load_state_dict_pre_hooks.move_to_end(handle.id, last=False)  # before ResMLP's adapting hook
    return model


def _refuse_another_architecture(module: ResMLP, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """load_state_dict pre-hook of a preset built here (resmlp.create_model, timm.create_model), run before
    ResMLP's own adapting hook: weights of another architecture loaded into the whole model
    (timm.create_model(..., checkpoint_path=...) loads them so), whose shapes differ, which torch refuses strict
    or not, are refused as resmlp.create_model(checkpoint_path=...) refuses them (resmlp.checkpoint.check_fits:
    the fields that differ, read off the file's own sizes), not with torch's list of every key."""
    if prefix or not state_dict or not all(isinstance(v, torch.Tensor) for v in state_dict.values()):
        return
    adapted = adapt_state_dict(dict(state_dict), module)  # what ResMLP's hook will load
    own = module.state_dict()
    if not any(k in own and v.shape != own[k].shape for k, v in adapted.items()):
        return
    from resmlp.checkpoint import check_fits
    from resmlp.models.formats import to_resmlp_keys

    try:
        as_read = to_resmlp_keys(dict(state_dict))  # our names, the file's sizes (before a grid is refitted)
    except Exception:  # noqa: BLE001 (no known layout: check_fits names the keys)
        as_read = None
    check_fits(module, adapted, "the weights given to load_state_dict", as_read=as_read)


def _resolve_cfg(name: str, pretrained_cfg: Any, overlay: dict[str, Any], pretrained: bool) -> dict[str, Any]:
    if pretrained_cfg is not None and not isinstance(pretrained_cfg, str):
        cfg = pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else dict(pretrained_cfg)
    elif pretrained_cfg == "untrained" or (not PUBLISHED.get(name) and not (pretrained and "file" not in overlay)):
        cfg = _untrained_cfg(name)
    else:  # raises, naming the choices, for a preset without weights or an unknown tag
        weights = published_weights(name, pretrained_cfg or True)
        cfg = weights_cfg(name, pretrained_cfg or next(iter(PUBLISHED[name])), weights)
    return {**cfg, **overlay}


def _describing(cfg: dict[str, Any], model: ResMLP) -> dict[str, Any]:
    """`cfg` made true to `model`: its input size and classes; no state dict kept."""
    cfg.pop("state_dict", None)
    c = model.config
    cfg.update(input_size=(c.in_chans, c.img_size, c.img_size), num_classes=c.num_classes)
    if len(cfg.get("mean", ())) != c.in_chans:  # stem adapted to other channels: per-channel average stats
        mean, std = (sum(cfg["mean"]) / len(cfg["mean"]),), (sum(cfg["std"]) / len(cfg["std"]),)
        cfg.update(mean=mean * c.in_chans, std=std * c.in_chans)
    return cfg


def _timm_entrypoint(name: str):
    def entrypoint(pretrained: bool = False, **kwargs: Any) -> torch.nn.Module:
        return build_preset(name, pretrained=pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = f"resmlp preset {name} ({PRESETS[name]})"
    return entrypoint


def register_with_timm() -> None:
    """Make every preset, with its pretrained configs, available to timm.create_model / list_pretrained."""
    from timm.models import is_model, register_model

    module = sys.modules[__name__]
    for name in PRESETS:
        if not is_model(name):
            entrypoint = _timm_entrypoint(name)
            setattr(module, name, entrypoint)
            register_model(entrypoint)


# ------------------------------------------------------------------------------------------ class names
def imagenet_class_names(num_classes: int) -> list[str] | None:
    """Readable ImageNet class names (e.g. 'golden retriever') for a 1k / 21k / 22k head, from timm's
    ImageNet metadata; None for other class counts."""
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = infer_imagenet_subset({"num_classes": num_classes})
    if subset is None:
        return None
    return [d.split(",")[0] for d in ImageNetInfo(subset).label_descriptions()]


register_with_timm()  # `import resmlp` + `import timm`, in either order, make every preset a timm model


def create_model(
    name: str,
    pretrained: bool | str = False,
    checkpoint_path: str | Path | None = None,
    **overrides: Any,
) -> ResMLP:
    """Build preset `name`; optionally load published weights (`pretrained=True` or a tag) or a file.

    The same builder as timm.create_model(name, ...). With weights, `num_classes` defaults to theirs and their
    head is kept whenever its shape fits; only a `num_classes` that differs from theirs starts a freshly
    initialised head (the usual fine-tuning start; a file's head left out says so in one warning). Another
    `img_size` (or `patch_size`) than the weights' refits the grid-tied weights (resmlp.models.resize).
    """
    from resmlp.checkpoint import to_resmlp_keys

    model_config(name)  # unknown names fail here, with suggestions
    state_dict = None
    if checkpoint_path is not None:
        state_dict = to_resmlp_keys(read_weights(checkpoint_path))
        overrides.setdefault("num_classes", head_classes(state_dict))
    tag = pretrained if isinstance(pretrained, str) else None
    model = build_preset(name, pretrained=bool(pretrained), pretrained_cfg=tag, **overrides)
    if state_dict is not None:
        _load_file_weights(model, state_dict, checkpoint_path)
    return model


def head_classes(state_dict: dict[str, Any]) -> int:
    """The classes a state dict's head predicts (this project's key names); 0 for a headless backbone."""
    head = state_dict.get("head.weight")
    return int(head.shape[0]) if head is not None else 0


def _load_file_weights(model: ResMLP, state_dict: dict[str, Any], path: str | Path) -> None:
    """Load a file's weights, its grid refitted to the model's; its head unless the model's has another size."""
    import warnings

    from resmlp.checkpoint import load_state_into
    from resmlp.models.resize import fit_state_dict

    theirs, ours = head_classes(state_dict), model.config.num_classes
    reset_head = theirs != ours
    if reset_head:
        warnings.warn(f"{path}: its {theirs}-class head is not loaded (num_classes={ours}); the model's head "
                      "starts freshly initialised", stacklevel=3)
    target = {k: v.shape for k, v in model.state_dict().items()}
    load_state_into(model, fit_state_dict(state_dict, target), path, reset_head=reset_head, as_read=state_dict)

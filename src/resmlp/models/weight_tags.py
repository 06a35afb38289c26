"""Published weights named as timm names them, `PRESET.TAG` (`resmlp_s12.fb_in1k`; `--pretrained` means the
preset's first tag), resolved to a local file wherever a model or checkpoint is named: train/finetune starts,
eval, predict, export, analyze, benchmark.

The file comes from timm's copy on the Hugging Face Hub, through the Hugging Face cache (HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub, read when the tag is resolved); online, a weight missing there is
downloaded once, and a Hub failure falls back to the original DeiT / Google URL (torch.hub's cache, TORCH_HOME).
With HF_HUB_OFFLINE=1 nothing is downloaded: a weight not in the cache is one line naming the folder it was
looked for in, as timm's create_model refuses offline.
"""

from __future__ import annotations

import os
from pathlib import Path

from resmlp.errors import ConfigError

HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # timm's weight file names on the Hub, preferred first


def split_tag(spec: str) -> tuple[str, str] | None:
    """('resmlp_s12', 'fb_in1k') for 'resmlp_s12.fb_in1k'; None when `spec` is not PRESET.TAG (a file name such
    as best.safetensors included: its stem is no preset)."""
    from resmlp.models.registry import PRESETS

    name, dot, tag = str(spec).partition(".")
    return (name, tag) if dot and name in PRESETS and tag and "/" not in tag else None


def default_tag(preset: str) -> str:
    """The tag `--pretrained` means for `preset`: its first published weights."""
    from resmlp.models.registry import PUBLISHED

    tags = PUBLISHED.get(preset)
    if not tags:
        with_weights = ", ".join(sorted(PUBLISHED))
        raise ConfigError(f"--pretrained: {preset} has no published weights (presets with weights: {with_weights}); "
                          "start from a checkpoint file instead (--model FILE / resmlp finetune FILE)")
    return next(iter(tags))


def hub_cache() -> Path:
    """The Hugging Face cache folder, from the environment as it is now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "huggingface"
    return Path(home) / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def tagged_weights(spec: str) -> Path | None:
    """The local file of the weights `spec` names (PRESET.TAG), fetched if needed and allowed; None when `spec`
    is not a weight tag. An unknown tag names the preset's tags."""
    parts = split_tag(spec)
    if parts is None:
        return None
    from resmlp.models.registry import published_weights

    preset, tag = parts
    weights = published_weights(preset, tag)  # raises for an unknown tag, naming the tags there are
    if weights.hf_hub_id:
        path = _from_hub_cache(weights.hf_hub_id)
        if path is not None:
            return path
    if offline():
        folder = hub_cache() / f"models--{weights.hf_hub_id.replace('/', '--')}" if weights.hf_hub_id else None
        where = f"the Hugging Face cache ({folder})" if folder else "no cache"
        raise ConfigError(f"weights {spec} are not in {where} and HF_HUB_OFFLINE=1 forbids downloading them; run "
                          "once with network access (unset HF_HUB_OFFLINE), or name a local checkpoint file")
    from resmlp.checkpoint import download_published

    return download_published(weights.url)


def _from_hub_cache(repo_id: str) -> Path | None:
    """The Hub file of `repo_id`: from the cache, or downloaded into it when online; None when neither works."""
    from huggingface_hub import hf_hub_download

    for filename in HUB_FILES:
        try:
            return Path(hf_hub_download(repo_id, filename, cache_dir=hub_cache(), local_files_only=offline()))
        except Exception:  # not cached, offline, no such file, network down: the next file, then the URL
            continue
    return None


def pretrained_name(model: str) -> str:
    """`--pretrained` applied to model name `model`: a preset becomes its default weight tag; a tag stays."""
    if split_tag(model) is not None:
        return model
    from resmlp.models.registry import PRESETS

    if model in PRESETS:
        return f"{model}.{default_tag(model)}"
    raise ConfigError(f"--pretrained takes a preset's published weights (resmlp_s12 -> resmlp_s12.fb_in1k), not "
                      f"{model}; for a timm or torchvision model's weights save the pretrained model with "
                      "resmlp.save and start from that file (--model FILE)")

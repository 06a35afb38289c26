"""Published weights named as timm names them, `PRESET.TAG` (`resmlp_s12.fb_in1k`; `--pretrained` means the
preset's first tag), resolved to a local file wherever a model or checkpoint is named: train/finetune starts,
eval, predict, export, analyze, benchmark.

The file comes from timm's copy on the Hugging Face Hub, through the Hugging Face cache (HF_HUB_CACHE, else
HF_HOME/hub, else ~/.cache/huggingface/hub, read when the tag is resolved); online, a weight missing there is
downloaded once, and a Hub failure falls back to the original DeiT / Google URL (torch.hub's cache, TORCH_HOME).
Both caches are read first, online or not, as timm reads them. With HF_HUB_OFFLINE=1, or where neither the Hub
nor the original URL can be reached within PROBE_SECONDS (no network: huggingface_hub's own retries took ~58 s to
give up), nothing is downloaded: a weight in neither cache is one line naming both places, the torch.hub file to
put there by hand, within a few seconds.
"""

from __future__ import annotations

import os
import socket
import threading
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from resmlp.errors import ConfigError

HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # timm's weight file names on the Hub, preferred first
PROBE_SECONDS = 2.0  # a connection to the Hub that takes longer than this counts as no network


def split_tag(spec: str) -> tuple[str, str] | None:
    """('resmlp_s12', 'fb_in1k') for 'resmlp_s12.fb_in1k'; None when `spec` is not PRESET.TAG (a file name such
    as best.safetensors included: its stem is no preset)."""
    from resmlp.models.registry import PRESET_ALIASES, PRESETS

    name, dot, tag = str(spec).partition(".")
    name = PRESET_ALIASES.get(name, name)  # timm's resmlp_12_224.fb_in1k is resmlp_s12.fb_in1k
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
    """HF_HUB_OFFLINE as it is now, or as huggingface_hub read it at its import (its constants)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")
            or bool(constants.HF_HUB_OFFLINE))


def reachable(url: str) -> bool:
    """Whether a TCP connection to `url`'s host (to the HTTPS proxy where one is set) opens within PROBE_SECONDS,
    name resolution included: the probe runs in a thread, since a DNS lookup takes no timeout."""
    target = urlparse(os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy") or url)
    return _connects(target.hostname or "", target.port or (443 if target.scheme == "https" else 80))


def hub_reachable() -> bool:
    """Whether the Hugging Face Hub (HF_ENDPOINT) can be reached (`reachable`)."""
    from huggingface_hub import constants

    return reachable(constants.ENDPOINT)


@lru_cache(maxsize=8)  # once per process: a command resolves a tag more than once
def _connects(host: str, port: int) -> bool:
    opened: list[bool] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            opened.append(True)
        except OSError:
            pass

    probe = threading.Thread(target=connect, daemon=True)
    probe.start()
    probe.join(PROBE_SECONDS)
    return bool(opened)


def torch_hub_file(url: str) -> Path:
    """Where torch.hub (and so timm's URL fallback and resmlp.checkpoint.download_published) keeps `url`'s file:
    TORCH_HOME's hub/checkpoints/<file name>."""
    import torch

    return Path(torch.hub.get_dir()) / "checkpoints" / url.rsplit("/", 1)[-1]


def no_network_reason(url: str | None) -> str | None:
    """Why nothing may be downloaded now (HF_HUB_OFFLINE, or neither the Hub nor `url`, the original file, in
    reach); None when something may."""
    if offline():
        return "HF_HUB_OFFLINE=1 forbids downloading them"
    if not hub_reachable() and not (url and reachable(url)):
        return f"neither the Hub ({os.environ.get('HF_ENDPOINT') or 'huggingface.co'}) nor the original URL can be " \
               "reached (no network?)"
    return None


def tagged_weights(spec: str) -> Path | None:
    """The local file of the weights `spec` names (PRESET.TAG): the Hugging Face cache, torch.hub's, else
    downloaded where the network allows; None when `spec` is not a weight tag. An unknown tag names the preset's
    tags."""
    parts = split_tag(spec)
    if parts is None:
        return None
    from resmlp.models.registry import published_weights

    preset, tag = parts
    weights = published_weights(preset, tag)  # raises for an unknown tag, naming the tags there are
    cached = _from_hub_cache(weights.hf_hub_id, local_only=True) if weights.hf_hub_id else None
    hub_file = torch_hub_file(weights.url) if weights.url else None
    if cached is None and hub_file is not None and hub_file.is_file():
        cached = hub_file
    if cached is not None:
        return cached
    why = no_network_reason(weights.url)
    if why is not None:
        raise ConfigError(missing_weights(spec, weights.hf_hub_id, weights.url, why,
                                          f"name a local weight file in place of {spec}"))
    path = _from_hub_cache(weights.hf_hub_id, local_only=False) if weights.hf_hub_id and hub_reachable() else None
    if path is not None:
        return path
    from resmlp.checkpoint import download_published

    return download_published(weights.url)


def missing_weights(spec: str, hf_hub_id: str | None, url: str | None, why: str, instead: str) -> str:
    """The one line said where published weights `spec` (PRESET.TAG) are in neither cache and may not be
    downloaded (`why`), the same from every entry point (the CLI, resmlp.create_model, timm.create_model): the
    Hugging Face cache folder and torch.hub's file, where each would be read, and `instead`, the entry point's
    own way to name a local copy."""
    folder = hub_cache() / f"models--{hf_hub_id.replace('/', '--')}" if hf_hub_id else None
    where = f"the Hugging Face cache ({folder})" if folder else "no cache"
    hub_file = torch_hub_file(url) if url else None
    place = f", download {url} elsewhere and place it at {hub_file}" if hub_file else ""
    return f"weights {spec} are not in {where} and {why}: run once with network access{place}, or {instead}"


def _from_hub_cache(repo_id: str, local_only: bool) -> Path | None:
    """The Hub file of `repo_id`: from the cache, or (not `local_only`) downloaded into it; None when neither
    works."""
    from huggingface_hub import hf_hub_download

    for filename in HUB_FILES:
        try:
            return Path(hf_hub_download(repo_id, filename, cache_dir=hub_cache(), local_files_only=local_only))
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


HF_HUB_PREFIX = "hf-hub:"  # timm's spelling of a Hub repository as a model name (hf-hub:timm/resmlp_12_224.fb_in1k)


def hub_model_file(spec: str) -> Path | None:
    """The weight file of `hf-hub:ORG/NAME` in the local Hugging Face cache (never downloaded: the cache is read
    as with HF_HUB_OFFLINE=1); None when `spec` is no hf-hub: name. Absent, one line names the folder and the
    file to place there."""
    if not spec.startswith(HF_HUB_PREFIX):
        return None
    repo_id = spec.removeprefix(HF_HUB_PREFIX)
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ConfigError(f"model {spec!r}: write hf-hub:ORG/NAME, e.g. hf-hub:timm/resmlp_12_224.fb_in1k")
    found = _from_hub_cache(repo_id, local_only=True)
    if found is not None:
        return found
    folder = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    raise ConfigError(f"{spec} is not in the Hugging Face cache ({folder}), which is read offline: place the "
                      f"repository's {HUB_FILES[0]} at {folder}/snapshots/REVISION/{HUB_FILES[0]} with REVISION in "
                      f"{folder}/refs/main (`hf download {repo_id} {HUB_FILES[0]}` does this on a machine with "
                      "network; copy the folder), or name a local weight file")

"""Model definitions: the ResMLP trunk, its presets and MLP-Mixer.

The names load on first use, so the torch-free parts (resmlp.models.config, resmlp.models.registry's presets,
resmlp.models.counts) stay cheap to import: `resmlp models` prints its table without loading torch. Our presets
are registered with timm by resmlp.models.pretrained (imported by `resmlp` as soon as timm is).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"TABLE3_ROWS": "registry", "create_model": "pretrained", "list_models": "registry",
            "model_config": "registry", "ResMLP": "resmlp", "ResMLPBlock": "resmlp", "ResMLPConfig": "config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'resmlp.models' has no attribute {name!r}")
    if name in ("ResMLP", "ResMLPBlock", "create_model"):  # a model is built: timm must know our presets
        importlib.import_module("resmlp.models.pretrained")
    value = getattr(importlib.import_module(f"resmlp.models.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value

"""Model definitions: the ResMLP trunk, its presets and MLP-Mixer."""

import resmlp.models.pretrained  # noqa: F401 (registers the presets with timm)
from resmlp.models.registry import TABLE3_ROWS, create_model, list_models, model_config
from resmlp.models.resmlp import ResMLP, ResMLPBlock, ResMLPConfig

__all__ = [
    "TABLE3_ROWS",
    "ResMLP",
    "ResMLPBlock",
    "ResMLPConfig",
    "create_model",
    "list_models",
    "model_config",
]

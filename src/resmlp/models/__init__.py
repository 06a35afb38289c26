"""Model definitions: the ResMLP trunk, its presets and MLP-Mixer."""

from resmlp.models.registry import TABLE3_ROWS, create_model, list_models, model_config
from resmlp.models.resmlp import ResMLP, ResMLPBlock, ResMLPConfig

import resmlp.models.pretrained  # noqa: E402,F401 (registers the presets with timm; needs the two above)

__all__ = [
    "TABLE3_ROWS",
    "ResMLP",
    "ResMLPBlock",
    "ResMLPConfig",
    "create_model",
    "list_models",
    "model_config",
]

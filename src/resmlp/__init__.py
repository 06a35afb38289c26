"""resmlp: ResMLP and MLP-Mixer in PyTorch, with the paper's training, analyses and fast inference."""

from resmlp.checkpoint import export_checkpoint, load, load_checkpoint, read_metadata, save
from resmlp.fuse import fuse
from resmlp.models import ResMLP, ResMLPConfig, create_model, list_models
from resmlp.models.pretrained import register_with_timm

register_with_timm()

__version__ = "0.1.0"
__all__ = [
    "ResMLP",
    "ResMLPConfig",
    "create_model",
    "export_checkpoint",
    "fuse",
    "list_models",
    "load",
    "load_checkpoint",
    "read_metadata",
    "save",
]

"""Fine-tuning and transfer: start a training run from a checkpoint (ours, timm, DeiT, a DINO backbone).

The run is an ordinary training run whose `finetune` section names the checkpoint: the engine builds the
model from the checkpoint (moved to finetune.img_size with resmlp.transfer.change_resolution, a new head
for the dataset's classes, optional freezing), and optim.layer_decay turns on timm's layer-wise lr decay
over ResMLP.group_matcher(). Everything else (data, schedule, resume, DDP, outputs) is the engine's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from resmlp.checkpoint import load
from resmlp.models.resmlp import ResMLP
from resmlp.train.config import TrainConfig, load_config
from resmlp.transfer import change_resolution

# ResMLPConfig fields that are training hyper-parameters: a recipe may set them, the checkpoint does not
TRAINING_FIELDS = ("drop_rate", "drop_path_rate")


def load_start(checkpoint: str | Path, img_size: int | None = None) -> ResMLP:
    """The checkpoint as a ResMLP/Mixer at `img_size`; clear errors for other architectures or sizes."""
    model = load(checkpoint)
    if not isinstance(model, ResMLP):
        raise ValueError(f"{checkpoint} holds a {type(model).__name__} (timm), not a ResMLP or MLP-Mixer; "
                         "finetune starts from ResMLP/Mixer checkpoints (ours, timm's or DeiT's)")
    if img_size is not None and img_size != model.config.img_size:
        model = change_resolution(model, img_size)  # raises for a grid the resize cannot reach
    return model


def model_section(start: ResMLP, recipe_model: dict[str, Any]) -> dict[str, Any]:
    """The recipe's `model` section for a run starting from `start`: its architecture, the recipe's dropout."""
    arch = {k: v for k, v in start.config.to_dict().items() if k not in ("num_classes", *TRAINING_FIELDS)}
    kept = {k: v for k, v in recipe_model.items() if k in TRAINING_FIELDS}
    return {"name": "resmlp_s12", **arch, **kept}  # every field is set, so the preset only names the family


def freeze_layers(model: ResMLP, freeze: int | str | None) -> ResMLP:
    """freeze=N: the stem and the first N blocks stop learning; 'all-but-head': only the classifier learns."""
    if freeze is None:
        return model
    if freeze == "all-but-head":
        frozen = [m for name, m in model.named_children() if name != "head"]
    else:
        if not 0 <= int(freeze) <= len(model.blocks):
            raise ValueError(f"finetune.freeze={freeze}: the model has {len(model.blocks)} blocks")
        frozen = [model.stem, *model.blocks[: int(freeze)]]
        if model.pos_embed is not None:
            model.pos_embed.requires_grad_(False)
    for module in frozen:
        module.requires_grad_(False)
    return model


def build_finetune_model(cfg: TrainConfig, num_classes: int) -> nn.Module:
    """The engine's model for a fine-tuning run: checkpoint weights, new head, freezing applied."""
    ft = cfg.finetune
    model = load_start(ft.checkpoint, ft.img_size)
    target = cfg.model_config(num_classes)
    if model.config.replace(num_classes=num_classes, drop_rate=target.drop_rate,
                            drop_path_rate=target.drop_path_rate) != target:
        raise ValueError(f"the recipe's model section does not describe {ft.checkpoint}; start fine-tuning "
                         "runs with resmlp.train.finetune.finetune (or `resmlp finetune`), which sets it")
    finetuned = ResMLP(target)
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("head.")}
    missing, unexpected = finetuned.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("head.") for k in missing), (missing, unexpected)
    return freeze_layers(finetuned, ft.freeze)


def finetune(checkpoint: str | Path, recipe: str | Path | dict | TrainConfig, output_dir: str | Path,
             overrides: dict[str, Any] | list[str] | None = None, img_size: int | None = None,
             freeze: int | str | None = None, layer_decay: float | None = None,
             resume: bool | str | Path = False) -> dict[str, Any]:
    """Fine-tune `checkpoint` with `recipe` on the recipe's data; returns summary.json's content.

    img_size: new resolution (ResMLP: cross-patch matrices resized; Mixer: block-diagonal expansion).
    freeze: number of leading blocks to freeze, or 'all-but-head'. layer_decay: e.g. 0.75.
    """
    from resmlp.train.engine import train

    if not Path(checkpoint).is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    cfg = load_config(recipe, overrides)
    start = load_start(checkpoint, img_size)  # every error about the checkpoint before any data is read
    raw = cfg.to_dict()
    raw["model"] = model_section(start, cfg.model)
    raw["finetune"] = dict(checkpoint=str(Path(checkpoint).resolve()), img_size=img_size, freeze=freeze)
    if layer_decay is not None:
        raw["optim"]["layer_decay"] = layer_decay
    return train(raw, output_dir, resume=resume)

"""torchvision classifiers as this project builds, saves and rebuilds them: `build_torchvision` records the
name and arguments on the model (`torchvision_spec`), which `resmlp.save` stores and `resmlp.load` rebuilds
from, as timm's `_model_args` do for timm models."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class RepeatChannels(nn.Module):
    """Grayscale input for an RGB model: the channel repeated three times."""

    def __init__(self, model: nn.Module, times: int = 3) -> None:
        super().__init__()
        self.model, self.times = model, times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.repeat(1, self.times, 1, 1) if x.shape[1] == 1 else x)


def build_torchvision(name: str, in_chans: int | None = None, **kwargs: Any) -> nn.Module:
    """torchvision classifier `name` with random weights and constructor `kwargs` (num_classes, ...);
    in_chans=1 repeats a grayscale image into the RGB channels torchvision's classifiers take."""
    import torchvision

    if name not in torchvision.models.list_models(module=torchvision.models):
        raise ValueError(f"torchvision has no classification model {name!r}")
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    if in_chans == 1:
        model = RepeatChannels(model)
    model.torchvision_spec = {"name": name, "in_chans": in_chans, "kwargs": kwargs}
    model.num_classes = kwargs.get("num_classes", 1000)  # as timm's models say it (torchvision's default: 1000)
    return model


def library_of(model: nn.Module) -> str:
    """Which library a model read from a checkpoint comes from, for messages: torchvision or timm."""
    return "torchvision" if getattr(model, "torchvision_spec", None) else "timm"

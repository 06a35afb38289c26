"""Knowledge distillation (DeiT's hard distillation, or Hinton's soft KL) as a loss for the training engine.

timm ships `timm.task.LogitDistillationTask`, but it is a training-task wrapper that runs the student
itself and offers only the soft KL term; the paper's hard distillation and this engine's pluggable
`loss_fn` need the small loss below. Teachers come from resmlp.load, timm.create_model or torchvision.

Loss with student logits s, teacher logits t, base supervised loss L (CE on labels, or on Mixup/CutMix
soft targets):
- hard: 1/2 L(s) + 1/2 CE(s, argmax t)                             (DeiT, used by the ResMLP paper)
- soft: (1 - alpha) L(s) + alpha tau^2 KL(softmax(t / tau) || softmax(s / tau))   (batch mean)
The teacher sees exactly the (mixed) images the student sees, as in DeiT. With `distill.cache` (only for
a fixed augmentation, checked by the config) each distinct image's teacher output is kept, keyed by a hash
of its pixels, so the teacher runs once per image (and flip) instead of once per epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from resmlp.checkpoint import load, torch_load
from resmlp.train.config import TrainConfig


def hard_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """1/2 base + 1/2 CE(student, teacher's argmax)."""
    return 0.5 * base + 0.5 * F.cross_entropy(student, teacher.argmax(dim=-1))


def soft_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, base: torch.Tensor, alpha: float,
                           tau: float) -> torch.Tensor:
    """(1 - alpha) base + alpha tau^2 KL(teacher/tau || student/tau), averaged over the batch."""
    kl = F.kl_div(F.log_softmax(student / tau, dim=-1), F.log_softmax(teacher / tau, dim=-1),
                  reduction="batchmean", log_target=True)
    return (1 - alpha) * base + alpha * tau**2 * kl


class DistillationLoss:
    """Engine loss_fn: the supervised loss (with its Mixup/CutMix) plus a frozen teacher's term."""

    def __init__(self, base, teacher: nn.Module, kind: str = "hard", alpha: float = 0.5, tau: float = 1.0,
                 cache: bool = False) -> None:
        self.base, self.teacher, self.kind, self.alpha, self.tau = base, freeze(teacher), kind, alpha, tau
        self.cache: dict[bytes, torch.Tensor] | None = {} if cache else None
        self.teacher_images = 0  # images the teacher actually ran on (the cache's saving shows here)

    def __call__(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        images, targets = self.base.mix(images, targets)
        student = model(images).float()
        teacher = self.teacher_logits(images)
        base = self.base.criterion(student, targets)
        if self.kind == "hard":
            return hard_distillation_loss(student, teacher, base)
        return soft_distillation_loss(student, teacher, base, self.alpha, self.tau)

    @torch.no_grad()  # the engine's autocast is active here: bf16 where enabled
    def teacher_logits(self, images: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            self.teacher_images += len(images)
            return self.teacher(images).float()
        pixels = images.detach().float().cpu().contiguous().flatten(1).numpy()
        keys = [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in pixels]
        missing = [i for i, key in enumerate(keys) if key not in self.cache]
        if missing:  # the teacher is in eval mode, so a sub-batch gives each image the same output
            self.teacher_images += len(missing)
            new = self.teacher(images[missing]).float().cpu()
            self.cache.update((keys[i], row) for i, row in zip(missing, new, strict=True))
        return torch.stack([self.cache[key] for key in keys]).to(images.device)


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode (dropout, BatchNorm statistics) and no gradients, for good."""
    model.eval()  # the teacher is no part of the trained model, so the engine's .train() never reaches it
    for p in model.parameters():
        p.requires_grad_(False)
    return model


class RepeatChannels(nn.Module):
    """Grayscale input for an RGB model: the channel repeated three times."""

    def __init__(self, model: nn.Module, times: int = 3) -> None:
        super().__init__()
        self.model, self.times = model, times

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x.repeat(1, self.times, 1, 1) if x.shape[1] == 1 else x)


def load_teacher(spec: str, num_classes: int, in_chans: int, weights: str | None = None) -> nn.Module:
    """A teacher from `spec`: a checkpoint file (resmlp.load), timm:NAME or torchvision:NAME (+ weights)."""
    kind, _, name = spec.partition(":")
    if kind == "timm" and name:
        import timm

        if not timm.is_model(name):
            raise ValueError(f"distill.teacher: timm has no model {name!r} (see timm.list_models())")
        model = timm.create_model(name, pretrained=False, num_classes=num_classes, in_chans=in_chans)
        return _load_weights(model, weights, spec, num_classes) if weights else model
    if kind == "torchvision" and name:
        import torchvision

        if name not in torchvision.models.list_models(module=torchvision.models):
            raise ValueError(f"distill.teacher: torchvision has no classification model {name!r}")
        model = torchvision.models.get_model(name, weights=None, num_classes=num_classes)
        if weights:
            model = _load_weights(model, weights, spec, num_classes)
        return RepeatChannels(model) if in_chans == 1 else model  # torchvision classifiers take RGB
    if not Path(spec).is_file():
        raise FileNotFoundError(f"distill.teacher: {spec} is neither a checkpoint file nor timm:NAME / "
                                "torchvision:NAME")
    if weights:
        raise ValueError("distill.weights goes with a timm:NAME or torchvision:NAME teacher; a checkpoint file "
                         "already holds its weights")
    return load(spec)


def _load_weights(model: nn.Module, path: str, spec: str, num_classes: int) -> nn.Module:
    if str(path).endswith(".safetensors"):
        from safetensors.torch import load_file

        state = load_file(path)
    else:
        state = torch_load(path)
        for key in ("model", "state_dict"):  # common wrappers of training scripts
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"teacher weights {path} do not fit {spec} with {num_classes} classes (the dataset's): "
                         f"{str(e).splitlines()[0]} ...; a teacher must predict the dataset's classes") from None
    return model


def check_teacher(teacher: nn.Module, spec: str, num_classes: int, in_chans: int, img_size: int,
                  device: torch.device) -> None:
    """One forward on a dummy batch: the teacher takes the data's images and predicts its classes."""
    with torch.no_grad():
        try:
            out = teacher(torch.zeros(2, in_chans, img_size, img_size, device=device))
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"distillation teacher {spec} cannot take {in_chans}x{img_size}x{img_size} images: "
                             f"{e}") from None
    if out.ndim != 2 or out.shape[1] != num_classes:
        raise ValueError(f"distillation teacher {spec} predicts {out.shape[-1]} classes but the dataset has "
                         f"{num_classes}; distil from a teacher trained on this dataset")


def build_distillation_loss(cfg: TrainConfig, base: Callable, num_classes: int,
                            device: torch.device) -> DistillationLoss:
    """The engine's loss for a config whose `distill` section names a teacher; checks it before any step."""
    kd = cfg.distill
    in_chans, img_size = cfg.input_shape()
    teacher = freeze(load_teacher(kd.teacher, num_classes, in_chans, kd.weights).to(device))
    check_teacher(teacher, kd.teacher, num_classes, in_chans, img_size, device)
    return DistillationLoss(base, teacher, kd.type, kd.alpha, kd.tau, kd.cache)

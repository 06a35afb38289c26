"""The training objectives that are not a paradigm's own model: supervised and distillation losses.

A loss is called as loss(model, images, targets) -> scalar, under the trainer's autocast.

Supervised (the paper's): cross-entropy with Mixup/CutMix soft targets, or label smoothing.
Distillation (timm ships `timm.task.LogitDistillationTask`, but it is a training-task wrapper that runs the
student itself and offers only the soft KL term; the paper's hard distillation needs the small loss below),
with student logits s, teacher logits t, base supervised loss L (CE on labels, or on Mixup/CutMix targets):
- hard: 1/2 L(s) + 1/2 CE(s, argmax t)                             (DeiT, used by the ResMLP paper)
- soft: (1 - alpha) L(s) + alpha tau^2 KL(softmax(t / tau) || softmax(s / tau)) / (batch x classes)   (DeiT)
The teacher sees the (mixed) images the student sees, as in DeiT (at its own resolution and normalisation where
its checkpoint records them: resmlp.train.teacher.TeacherInput). With `distill.cache` (only for
a fixed augmentation, checked by the config) each distinct image's teacher output is kept, keyed by a hash
of its pixels, so the teacher runs once per image (and flip) instead of once per epoch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import nn

from resmlp.train.config import TrainConfig

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class SupervisedLoss:
    """Cross-entropy with Mixup/CutMix soft targets or label smoothing (the paper's supervised objective)."""

    mixup: Mixup | None
    criterion: nn.Module

    def __call__(self, model: nn.Module, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        images, targets = self.mix(images, targets)
        return self.criterion(model(images), targets)

    def mix(self, images: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mixup/CutMix the batch (soft targets) when enabled; shared with the distillation loss."""
        if self.mixup is None:
            return images, targets
        if len(images) % 2:  # timm's Mixup pairs images; an odd batch (skipped images) drops one
            images, targets = images[:-1], targets[:-1]
        return self.mixup(images, targets)


def supervised_loss(cfg: TrainConfig, num_classes: int) -> SupervisedLoss:
    d, smoothing = cfg.data, cfg.loss.label_smoothing
    if d.mixup > 0 or d.cutmix > 0:
        mixup = Mixup(mixup_alpha=d.mixup, cutmix_alpha=d.cutmix, prob=d.mixup_prob, label_smoothing=smoothing,
                      num_classes=num_classes)
        return SupervisedLoss(mixup, SoftTargetCrossEntropy())
    criterion = LabelSmoothingCrossEntropy(smoothing) if smoothing > 0 else nn.CrossEntropyLoss()
    return SupervisedLoss(None, criterion)


def hard_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """1/2 base + 1/2 CE(student, teacher's argmax)."""
    return 0.5 * base + 0.5 * F.cross_entropy(student, teacher.argmax(dim=-1))


def soft_distillation_loss(student: torch.Tensor, teacher: torch.Tensor, base: torch.Tensor, alpha: float,
                           tau: float) -> torch.Tensor:
    """(1 - alpha) base + alpha tau^2 KL(teacher/tau || student/tau), the KL summed and divided by batch x
    classes as DeiT's losses.py does (kl_div(..., reduction='sum') * T * T / outputs_kd.numel()): at the same
    alpha, 1/classes of a per-sample (batchmean) KL."""
    kl = F.kl_div(F.log_softmax(student / tau, dim=-1), F.log_softmax(teacher / tau, dim=-1),
                  reduction="sum", log_target=True) / student.numel()
    return (1 - alpha) * base + alpha * tau**2 * kl


class DistillationLoss:
    """The supervised loss (with its Mixup/CutMix) plus a frozen teacher's term."""

    def __init__(self, base: SupervisedLoss, teacher: nn.Module, kind: str = "hard", alpha: float = 0.5,
                 tau: float = 1.0, cache: bool = False) -> None:
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

    @torch.no_grad()  # the trainer's autocast is active here: bf16 where enabled
    def teacher_logits(self, images: torch.Tensor) -> torch.Tensor:
        if self.cache is None:
            self.teacher_images += len(images)
            return self.teacher(images).float()
        # the host wait of the cache (documented at distill.cache): the keys are hashes of the pixels
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
    model.eval()  # the teacher is no part of the trained model, so the trainer's .train() never reaches it
    for p in model.parameters():
        p.requires_grad_(False)
    return model

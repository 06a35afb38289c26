"""DINO pre-training on the training engine: `pretrain_dino(recipe, output_dir)`.

`DINOTrainer` is the engine's Trainer with DINO's pieces in its hooks, so the loop, checkpointing, exact
resume and DDP are the engine's: multi-crop training transform, student = backbone + DINO head, teacher =
the engine's EMA (timm ModelEmaV3) with its decay set per step from the cosine momentum schedule, weight
decay rising on DINO's cosine schedule (optim.weight_decay to dino.weight_decay_end), the DINO
loss (centering, teacher-temperature warm-up), the last layer's gradients dropped during the first
`dino.freeze_last_layer_epochs` epochs, gradient clipping by train.clip_grad (one global norm, where DINO
clips each parameter), and a weighted k-NN (k=20, T=0.07) of the teacher backbone on the labelled test
set after each epoch, with the training set (evaluation transform) as memory. The teacher backbone is
what best/last.safetensors hold (head removed); `knn_top1` goes to summary.json.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from resmlp.data import build_dataset, build_transform
from resmlp.train import reporting
from resmlp.train.dino import DINOHead, DINOLoss, DINOModel, MultiCropTransform, cosine_schedule
from resmlp.train.engine import Trainer, train
from resmlp.train.probe import extract_features, knn_accuracy


class DINOTrainer(Trainer):
    """The engine's Trainer with DINO's model, loss, teacher and evaluation (see the module docstring)."""

    def __init__(self, cfg, out, info, resume, loss_fn) -> None:
        if loss_fn is not None:
            raise ValueError("DINO pre-training has its own loss; do not pass loss_fn")
        cfg.train.ema = True  # the engine's EMA is DINO's teacher
        cfg.train.ema_decay = cfg.dino.momentum_teacher
        super().__init__(cfg, out, info, resume, loss_fn)
        self.ema.module.requires_grad_(False)  # the teacher only ever moves by the EMA
        total_steps = cfg.schedule.epochs * self.steps_per_epoch
        self.momentum = cosine_schedule(cfg.dino.momentum_teacher, 1.0, total_steps)
        end = cfg.dino.weight_decay_end
        self.weight_decay = cosine_schedule(cfg.optim.weight_decay, end, total_steps) if end is not None else None
        d, in_chans = cfg.data, cfg.input_shape()[0]
        memory_tf = build_transform(self.data.preprocess, training=False)
        self.knn_memory = build_dataset(d.kind, "train", d.dir, in_chans, memory_tf, tuple(d.synthetic_size),
                                        d.synthetic_classes, self.data.preprocess.img_size, cfg.train.seed)

    # -------------------------------------------------------------------------------- model and loss
    def _train_transform(self):
        d = self.cfg.dino
        return lambda pre: MultiCropTransform(pre.img_size, pre.mean, pre.std, d.num_local, tuple(d.global_scale),
                                              tuple(d.local_scale), d.local_size, grayscale=pre.in_chans == 1)

    def _build_model(self, num_classes: int) -> nn.Module:
        backbone = super()._build_model(num_classes)
        backbone.reset_classifier(0)  # DINO learns features; the classifier comes with fine-tuning
        d = self.cfg.dino
        head = DINOHead(backbone.num_features, d.out_dim, d.hidden_dim, d.bottleneck_dim,
                        norm_last_layer=d.norm_last_layer)
        return DINOModel(backbone, head)

    def _build_loss(self, num_classes: int):
        d = self.cfg.dino
        self.dino_loss = DINOLoss(d.out_dim, 2 + d.num_local, d.teacher_temp, d.warmup_teacher_temp,
                                  d.warmup_teacher_temp_epochs, self.cfg.schedule.epochs, d.student_temp,
                                  d.center_momentum).to(self.info.device)
        return self._dino_step_loss

    def _dino_step_loss(self, model: nn.Module, crops: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        if not isinstance(crops, list):
            raise ValueError("DINO needs the multi-crop transform: a list of crops per image")
        student = model(crops)
        with torch.no_grad():
            teacher = self.ema.module(crops[:2])  # the teacher sees the two global crops only
        return self.dino_loss(student, teacher, self.epoch)

    # -------------------------------------------------------------------------------- step hooks
    def _before_optimizer_step(self) -> None:
        if self.epoch < self.cfg.dino.freeze_last_layer_epochs:  # DINO: stabilises the start
            for p in self.model.head.last_layer.parameters():
                p.grad = None
        if self.weight_decay is not None:  # the groups exempt from decay (1-D parameters) keep 0
            decay = self.weight_decay[min(self.global_step, len(self.weight_decay) - 1)]
            for group in self.optimizer.param_groups:
                if group["weight_decay"] > 0:
                    group["weight_decay"] = decay

    def _update_ema(self) -> None:
        self.ema.decay = self.momentum[min(self.global_step, len(self.momentum) - 1)]
        self.ema.update(self.model)

    def _snapshot(self) -> dict[str, Any]:
        return {**super()._snapshot(), "dino_center": self.dino_loss.center.clone()}

    def _restore(self, state: dict[str, Any]) -> None:
        super()._restore(state)
        self.dino_loss.center.copy_(state["dino_center"])

    # -------------------------------------------------------------------------------- evaluation and outputs
    def _model_to_save(self) -> nn.Module:
        return self.ema.module.backbone

    def _evaluate(self, model: nn.Module) -> tuple[dict[str, Any], float]:
        top1 = knn_top1(model, self.knn_memory, self.data.val, self.micro_batch, self.cfg.data.num_workers,
                        self.info.device, self.amp == "bf16", self.cfg.dino.knn_k, self.cfg.dino.knn_temperature)
        return dict(knn_top1=top1, skipped_val_images=0), top1

    def _epoch_message(self, row: dict[str, Any]) -> str:
        return (f"epoch {row['epoch']}/{self.cfg.schedule.epochs}: DINO loss {row['train_loss']:.4f}, "
                f"k-NN top-1 {row['knn_top1']:.2f}%")

    def _plot(self, path: Path) -> None:
        rows = [dict(r, val_loss=math.nan, val_top1=r["knn_top1"]) for r in self.history]  # no val loss in DINO
        reporting.plot_learning_curves(path, rows)

    def _scores(self, best: dict[str, Any]) -> dict[str, Any]:
        return dict(knn_top1=best["knn_top1"], final_knn_top1=self.history[-1]["knn_top1"])


def knn_top1(backbone: nn.Module, memory, test, batch_size: int, num_workers: int, device: torch.device,
             bf16: bool = False, k: int = 20, temperature: float = 0.07) -> float:
    """DINO's weighted k-NN top-1 (%) of `backbone`'s pooled features: `memory` labelled, `test` classified."""
    def features(dataset):
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=num_workers)
        return extract_features(backbone, loader, device, bf16)

    train_x, train_y = features(memory)
    test_x, test_y = features(test)
    return knn_accuracy(train_x, train_y, test_x, test_y, k, temperature)


def pretrain_dino(recipe: str | Path | dict = "dino-fashion-mnist", output_dir: str | Path = "runs/dino",
                  overrides: dict[str, Any] | list[str] | None = None,
                  resume: bool | str | Path = False) -> dict[str, Any]:
    """DINO self-supervised pre-training from a recipe; returns summary.json's content (with knn_top1)."""
    return train(recipe, output_dir, overrides, resume, trainer_class=DINOTrainer)

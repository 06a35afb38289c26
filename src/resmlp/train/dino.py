"""DINO self-supervised pre-training (Caron et al., 2021) for ResMLP and Mixer: its pieces and `DINOTask`.

DINOTask is a task of the trainer (resmlp.train.tasks), so the loop, checkpointing, exact resume and DDP are
the trainer's: multi-crop training transform, student = backbone + DINO head, teacher = an EMA of the student
(timm's ModelEmaV3) owned by the task, its momentum rising on a cosine schedule, weight decay rising on DINO's
cosine schedule (optim.weight_decay to dino.weight_decay_end), the DINO loss (centering, teacher-temperature
warm-up), the last layer's gradients dropped during the first `dino.freeze_last_layer_epochs` epochs, gradient
clipping by train.clip_grad (train.clip_mode per_param: each parameter's norm, as DINO), and a weighted k-NN (k=20,
T=0.07) of the teacher backbone on the labelled val split after each epoch, with the training set
(evaluation transform) as memory. The teacher backbone is what best/last.safetensors hold (head removed);
`knn_top1` goes to summary.json.

timm and torch have no DINO head, loss or multi-crop transform, so they are written here, following the
DINO paper: projection head with a weight-normalised last layer, centred and sharpened teacher targets
with a temperature warm-up, and a student/teacher pair whose teacher is an EMA of the student.

Local crops: the cross-patch matrix fixes the number of patches, so a network of this family only takes
its training resolution. We resize local crops to the global crop size (option (a)) rather than
resampling every cross-patch matrix for the local grid (option (b)): (a) trains exactly the weights used
at test time and keeps one code path, while (b) would back-propagate through an interpolation of A and
teach the student a second, approximate network. The price is that local crops cost as much compute as
global ones; with few local crops on small images that is affordable.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from PIL import Image, ImageFilter
from timm.utils import ModelEmaV3
from torch import nn
from torchvision import transforms as T

from resmlp import reporting
from resmlp.data import ArrayDataset
from resmlp.data.device.multi_crop import MultiCropAugment
from resmlp.evaluation import eval_batches_or_loader
from resmlp.inference import optimize_features
from resmlp.train.config import TrainConfig
from resmlp.train.probe import extract_features, knn_accuracy
from resmlp.train.tasks import SupervisedTask

if TYPE_CHECKING:
    from resmlp.train.view import TrainerView


class DINOHead(nn.Module):
    """MLP (in -> hidden -> hidden -> bottleneck), l2-normalisation, weight-normalised last layer."""

    def __init__(self, in_dim: int, out_dim: int = 4096, hidden_dim: int = 512, bottleneck_dim: int = 128,
                 num_layers: int = 3, norm_last_layer: bool = True) -> None:
        super().__init__()
        dims = [in_dim] + [hidden_dim] * (num_layers - 1) + [bottleneck_dim]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:], strict=True)):
            layers.append(nn.Linear(a, b))
            if i < num_layers - 1:
                layers.append(nn.GELU())
        self.mlp = nn.Sequential(*layers)
        for m in self.mlp:
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
        self.last_layer = nn.utils.parametrizations.weight_norm(nn.Linear(bottleneck_dim, out_dim, bias=False))
        self.last_layer.parametrizations.weight.original0.data.fill_(1.0)  # the norm g
        if norm_last_layer:  # DINO's stabiliser: the output vectors stay unit-norm
            self.last_layer.parametrizations.weight.original0.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(F.normalize(self.mlp(x), dim=-1))


class DINOModel(nn.Module):
    """Backbone (pooled pre-logits features) followed by the DINO head; takes a list of crops."""

    def __init__(self, backbone: nn.Module, head: DINOHead) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, crops: list[torch.Tensor]) -> torch.Tensor:
        # crops of one size share a batch: one backbone call for all of them
        feats = self.backbone.forward_head(self.backbone.forward_features(torch.cat(crops)), pre_logits=True)
        return self.head(feats)


class DINOLoss(nn.Module):
    """Cross-entropy between sharpened, centred teacher outputs (global crops) and student outputs (all)."""

    def __init__(self, out_dim: int, num_crops: int, teacher_temp: float = 0.04, warmup_teacher_temp: float = 0.04,
                 warmup_epochs: int = 0, epochs: int = 100, student_temp: float = 0.1,
                 center_momentum: float = 0.9) -> None:
        super().__init__()
        self.num_crops = num_crops
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.register_buffer("center", torch.zeros(1, out_dim))
        warmup = torch.linspace(warmup_teacher_temp, teacher_temp, warmup_epochs) if warmup_epochs else torch.empty(0)
        self.teacher_temps = torch.cat([warmup, torch.full((max(epochs - warmup_epochs, 1),), teacher_temp)])

    def forward(self, student_out: torch.Tensor, teacher_out: torch.Tensor, epoch: int) -> torch.Tensor:
        temp = float(self.teacher_temps[min(epoch, len(self.teacher_temps) - 1)])
        student = (student_out.float() / self.student_temp).log_softmax(-1).chunk(self.num_crops)
        teacher = F.softmax((teacher_out.float() - self.center) / temp, dim=-1).detach().chunk(2)
        total, pairs = 0.0, 0
        for t_idx, t in enumerate(teacher):
            for s_idx, s in enumerate(student):
                if s_idx == t_idx:  # a crop is never its own target
                    continue
                total = total + torch.sum(-t * s, dim=-1).mean()
                pairs += 1
        self.update_center(teacher_out)
        return total / pairs

    @torch.no_grad()
    def update_center(self, teacher_out: torch.Tensor) -> None:
        batch_center = teacher_out.float().sum(dim=0, keepdim=True)
        count = batch_center.new_full((), len(teacher_out))  # filled on the device: no copy from the host
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(batch_center)
            dist.all_reduce(count)
        self.center.mul_(self.center_momentum).add_(batch_center / count, alpha=1 - self.center_momentum)


def cosine_schedule(start: float, end: float, total_steps: int) -> list[float]:
    """One value per step, cosine from `start` towards `end` as DINO's utils.cosine_scheduler without warm-up
    (its teacher momentum and weight decay): end + (start - end) * (1 + cos(pi * i / total_steps)) / 2, so the
    last step stops one step short of `end`, as DINO's does."""
    return [end + (start - end) * (1 + math.cos(math.pi * i / total_steps)) / 2 for i in range(max(total_steps, 1))]


class DINOGaussianBlur:
    """DINO's Gaussian blur (its utils.GaussianBlur without the coin flip, which T.RandomApply does here): PIL's
    ImageFilter.GaussianBlur, whose kernel covers the whole radius, at a radius drawn uniformly from
    [radius_min, radius_max] pixels of the crop it is applied to (DINO: 0.1 to 2). The radius is drawn from
    torch's generator, which the DataLoader seeds per worker, where DINO uses Python's `random`."""

    def __init__(self, radius_min: float = 0.1, radius_max: float = 2.0) -> None:
        self.radius_min, self.radius_max = radius_min, radius_max

    def __call__(self, image: Image.Image) -> Image.Image:
        radius = self.radius_min + (self.radius_max - self.radius_min) * float(torch.rand(()))
        return image.filter(ImageFilter.GaussianBlur(radius=radius))


class MultiCropTransform:
    """2 global crops + `num_local` local crops of one PIL image, all returned at the global size (the timm
    path's workers; data.pipeline=device runs the same as batch ops: resmlp.data.device.multi_crop)."""

    def __init__(self, img_size: int, mean: tuple[float, ...], std: tuple[float, ...], num_local: int = 4,
                 global_scale: tuple[float, float] = (0.4, 1.0), local_scale: tuple[float, float] = (0.05, 0.4),
                 local_size: int | None = None, grayscale: bool = False) -> None:
        local_size = local_size or max(img_size * 3 // 7, 8)
        # Grayscale images keep DINO's brightness and contrast jitter: without any photometric change two
        # crops of one image share its intensity histogram, a shortcut that matches views without shape.
        jitter = T.ColorJitter(0.4, 0.4) if grayscale else T.ColorJitter(0.4, 0.4, 0.2, 0.1)
        color = [T.RandomApply([jitter], p=0.8)] + ([] if grayscale else [T.RandomGrayscale(p=0.2)])
        finish = [T.ToTensor(), T.Normalize(mean, std)]
        flip = T.RandomHorizontalFlip()
        blur = DINOGaussianBlur(0.1, 2.0)  # DINO's utils.GaussianBlur radius range
        self.global_views = [  # DINO's two global views: blurred always / rarely, the second solarised at 0.2
            T.Compose([T.RandomResizedCrop(img_size, scale=global_scale, interpolation=T.InterpolationMode.BICUBIC),
                       flip, *color, T.RandomApply([blur], p=p_blur), T.RandomSolarize(128, p=p_solarize), *finish])
            for p_blur, p_solarize in ((1.0, 0.0), (0.1, 0.2))
        ]
        # option (a): crop small and augment at that size as DINO does (the blur radius is in the small crop's
        # pixels), then resize to the global size the cross-patch matrix expects
        self.local_view = T.Compose([
            T.RandomResizedCrop(local_size, scale=local_scale, interpolation=T.InterpolationMode.BICUBIC),
            flip, *color, T.RandomApply([blur], p=0.5),
            T.Resize(img_size, interpolation=T.InterpolationMode.BICUBIC), *finish])
        self.num_local = num_local

    def __call__(self, image: Image.Image) -> list[torch.Tensor]:
        return [view(image) for view in self.global_views] + [self.local_view(image) for _ in range(self.num_local)]


class DINOTask(SupervisedTask):
    """DINO as a training task (see the module docstring)."""

    name = "dino"

    def __init__(self, cfg: TrainConfig) -> None:
        if cfg.train.ema:
            raise ValueError("DINO's teacher is its own EMA of the student (dino.momentum_teacher); set "
                             "train.ema: false")
        super().__init__(cfg)

    # -------------------------------------------------------------------------------- model and loss
    def train_transform(self):
        """(preprocess, batched=False) -> DINO's multi-crop: the PIL transform of the loader workers, or
        (batched, data.pipeline=device) the same as batch ops where the images are."""
        d = self.cfg.dino

        def transform(pre, batched: bool = False):
            if batched:
                return MultiCropAugment(pre.img_size, pre.in_chans, pre.mean, pre.std, d.num_local,
                                        tuple(d.global_scale), tuple(d.local_scale), d.local_size)
            return MultiCropTransform(pre.img_size, pre.mean, pre.std, d.num_local, tuple(d.global_scale),
                                      tuple(d.local_scale), d.local_size, grayscale=pre.in_chans == 1)

        return transform

    def build_model(self, trainer: TrainerView, num_classes: int) -> nn.Module:
        backbone = super().build_model(trainer, num_classes)
        backbone.reset_classifier(0)  # DINO learns features; the classifier comes with fine-tuning
        d = self.cfg.dino
        head = DINOHead(backbone.num_features, d.out_dim, d.hidden_dim, d.bottleneck_dim,
                        norm_last_layer=d.norm_last_layer)
        return DINOModel(backbone, head)

    def build_loss(self, trainer: TrainerView, num_classes: int):
        d = self.cfg.dino
        self.loss = DINOLoss(d.out_dim, 2 + d.num_local, d.teacher_temp, d.warmup_teacher_temp,
                             d.warmup_teacher_temp_epochs, self.cfg.schedule.epochs, d.student_temp,
                             d.center_momentum).to(trainer.info.device)
        self.trainer = trainer  # the loss needs the epoch (teacher temperature warm-up)
        return self._step_loss

    def setup(self, trainer: TrainerView) -> None:
        cfg = self.cfg
        self.teacher = ModelEmaV3(trainer.model, decay=cfg.dino.momentum_teacher)
        self.teacher.module.requires_grad_(False)  # the teacher only ever moves by the EMA
        total_steps = cfg.schedule.epochs * trainer.steps_per_epoch
        self.momentum = cosine_schedule(cfg.dino.momentum_teacher, 1.0, total_steps)
        end = cfg.dino.weight_decay_end
        self.weight_decay = cosine_schedule(cfg.optim.weight_decay, end, total_steps) if end is not None else None

    def _step_loss(self, model: nn.Module, crops: list[torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        if not isinstance(crops, list):
            raise ValueError("DINO needs the multi-crop transform: a list of crops per image")
        student = model(crops)
        with torch.no_grad():
            teacher = self.teacher.module(crops[:2])  # the teacher sees the two global crops only
        return self.loss(student, teacher, self.trainer.epoch)

    # -------------------------------------------------------------------------------- step hooks
    def before_optimizer_step(self, trainer: TrainerView) -> None:
        if trainer.epoch < self.cfg.dino.freeze_last_layer_epochs:  # DINO: stabilises the start
            for p in trainer.model.head.last_layer.parameters():
                p.grad = None
        if self.weight_decay is not None:  # the groups exempt from decay (1-D parameters) keep 0
            decay = self.weight_decay[min(trainer.global_step, len(self.weight_decay) - 1)]
            for group in trainer.optimizer.param_groups:
                if group["weight_decay"] > 0:
                    group["weight_decay"] = decay

    def after_optimizer_step(self, trainer: TrainerView) -> None:
        # trainer.global_step still counts the steps before this one
        self.teacher.decay = self.momentum[min(trainer.global_step, len(self.momentum) - 1)]
        self.teacher.update(trainer.model)

    def state_dict(self) -> dict[str, Any]:
        return dict(teacher=self.teacher.state_dict(), center=self.loss.center.clone())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.teacher.load_state_dict(state["teacher"])
        self.loss.center.copy_(state["center"])

    # -------------------------------------------------------------------------------- evaluation and outputs
    def model_to_save(self, trainer: TrainerView) -> nn.Module:
        return self.teacher.module.backbone

    def evaluate(self, trainer: TrainerView, model: nn.Module) -> tuple[dict[str, Any], float]:
        top1 = self._knn(trainer, model, trainer.data.val, trainer.data.val_batched)
        return dict(knn_top1=top1, skipped_val_images=0), top1

    def test_scores(self, trainer: TrainerView, model: nn.Module) -> dict[str, float]:
        return dict(knn_top1=self._knn(trainer, model, trainer.data.test, trainer.data.test_batched))

    def _knn(self, trainer: TrainerView, model: nn.Module, queries, queries_batched) -> float:
        """k-NN top-1 of `queries` with the training images (evaluation transform) as the memory."""
        data = trainer.data
        memory_batched = data.val_batched if isinstance(data.train_eval, ArrayDataset) else None
        fast = optimize_features(model, "bf16" if trainer.amp == "bf16" else "fp32").to(trainer.info.device)

        def features(dataset, batched, name: str):
            batches = eval_batches_or_loader(dataset, batched, trainer.micro_batch, self.cfg.data.num_workers)
            if trainer.cfg.train.progress and trainer.info.is_main:
                from resmlp.progress import progress_bar

                batches = progress_bar(batches, total=math.ceil(len(dataset) / trainer.micro_batch), unit="batch",
                                       desc=f"k-NN features ({name})", leave=False)
            return extract_features(fast, batches, trainer.info.device)

        return knn_accuracy(*features(data.train_eval, memory_batched, "memory"),
                            *features(queries, queries_batched, "queries"),
                            self.cfg.dino.knn_k, self.cfg.dino.knn_temperature)

    def epoch_message(self, row: dict[str, Any], epochs: int) -> str:
        return f"epoch {row['epoch']}/{epochs}: DINO loss {row['train_loss']:.4f}, k-NN top-1 {row['knn_top1']:.2f}%"

    def plot(self, path: Path, history: list[dict[str, Any]]) -> None:
        rows = [dict(r, val_loss=math.nan, val_top1=r["knn_top1"]) for r in history]  # no val loss in DINO
        reporting.plot_learning_curves(path, rows)

    def scores(self, best: dict[str, Any], selected_test: dict[str, float] | None,
               final_test: dict[str, float] | None) -> dict[str, Any]:
        return dict(knn_top1=best["knn_top1"], test_knn_top1=selected_test and selected_test["knn_top1"],
                    final_test_knn_top1=final_test and final_test["knn_top1"])


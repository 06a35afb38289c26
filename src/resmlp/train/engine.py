"""The training loop: recipe in, checkpoints, metrics, plots and summary.json out.

The loss is pluggable (`loss_fn(model, images, targets) -> loss`), so distillation, DINO or fine-tuning
reuse this loop with their own objective; `SupervisedLoss` is the paper's supervised one. Distillation
(config section `distill`) and fine-tuning (`finetune`) are options of this Trainer; DINO is a subclass
(resmlp.train.dino_trainer) overriding the hooks marked "hook" below. `images` may be a list of crops.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from resmlp.checkpoint import save
from resmlp.data import (
    ArrayDataset,
    PixelPermutation,
    Preprocess,
    ResumableSampler,
    SeededDataset,
    ShardSampler,
    build_dataset,
    build_transform,
    collate_skipping,
    dataset_stats,
)
from resmlp.data.batch_augment import BatchAugment, array_batches, eval_batches
from resmlp.models.resmlp import ResMLP
from resmlp.train import reporting
from resmlp.train.config import TrainConfig, load_config
from resmlp.train.distributed import DistInfo, all_reduce_sum, barrier, init_distributed, shutdown
from resmlp.train.state import STATE_FILE, load_state, save_state

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left as it was."""


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
        mixup = Mixup(mixup_alpha=d.mixup, cutmix_alpha=d.cutmix, label_smoothing=smoothing,
                      num_classes=num_classes)
        return SupervisedLoss(mixup, SoftTargetCrossEntropy())
    criterion = LabelSmoothingCrossEntropy(smoothing) if smoothing > 0 else nn.CrossEntropyLoss()
    return SupervisedLoss(None, criterion)


def resolve_amp(amp: str, device: torch.device) -> str:
    """'auto' -> bf16 on GPUs and on CPUs with native bf16 (AVX-512 BF16 / AMX), else none.

    Without native support, CPU bf16 matmuls are emulated and far slower than fp32 (on an AVX2-only
    CPU we measured 0.9 vs 54 GFLOP/s), so 'auto' keeps fp32 there.
    """
    if amp != "auto":
        return amp
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return "bf16" if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported() else "none"


def autocast(device: torch.device, amp: str):
    """bf16 autocast on CPU or GPU, fp16 on GPU, or nothing."""
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed every RNG the step touches (dropout, drop-path, Mixup) from (seed, step, rank): exact resume."""
    # only ints: a str in the tuple would hash differently in every process (PYTHONHASHSEED); the 4-tuple
    # keeps step seeds apart from the per-image seeds (seed, epoch, position)
    step_seed = hash((seed, step, rank, 0)) & 0x7FFF_FFFF
    random.seed(step_seed)
    np.random.seed(step_seed)
    torch.manual_seed(step_seed)  # all devices: dropout and drop-path run where the model is


@dataclass
class RunData:
    train: Any
    val: Any
    class_names: list[str]
    preprocess: Preprocess
    train_augment: BatchAugment | None = None  # set: train is an ArrayDataset augmented batch by batch
    val_preprocess: BatchAugment | None = None  # set: val is an ArrayDataset preprocessed batch by batch


def build_data(cfg: TrainConfig, in_chans: int, img_size: int,
               train_transform: Callable[[Preprocess], Any] | None = None) -> RunData:
    """Train and val datasets with their transforms; errors (missing files, empty classes) come first.

    train_transform(preprocess) replaces the recipe's training augmentation (DINO's multi-crop).
    """
    d = cfg.data
    mean, std = (tuple(d.mean), tuple(d.std)) if d.mean else dataset_stats(d.kind, in_chans)
    if len(mean) != in_chans:
        raise ValueError(f"data.mean has {len(mean)} values but the model takes {in_chans} channels")
    pre = Preprocess(img_size, in_chans, mean, std, d.crop_pct, d.interpolation)
    aug = dict(scale=d.scale, ratio=d.ratio, hflip=d.hflip, color_jitter=d.color_jitter,
               auto_augment=d.auto_augment, reprob=d.reprob)
    common = dict(data_dir=d.dir, in_chans=in_chans, synthetic_size=tuple(d.synthetic_size),
                  synthetic_classes=d.synthetic_classes, img_size=img_size, seed=cfg.train.seed,
                  permute=d.permute, permute_patch=d.permute_patch, permute_seed=d.permute_seed)
    train_tf = train_transform(pre) if train_transform else build_transform(pre, True, aug)
    train = build_dataset(d.kind, "train", transform=train_tf, **common)
    val = build_dataset(d.kind, "val", transform=build_transform(pre, False), **common)
    if train.class_names != val.class_names:
        raise ValueError(f"train and val classes differ: {len(train.class_names)} vs {len(val.class_names)} "
                         "classes; both splits need the same class folders")
    batched = (d.batch_augment and train_transform is None and isinstance(train, ArrayDataset)
               and not d.auto_augment and not d.color_jitter)
    augment = val_preprocess = None
    if batched:
        permutation = (PixelPermutation(d.permute, img_size, d.permute_patch, d.permute_seed)
                       if d.permute != "none" else None)
        augment = BatchAugment(img_size, in_chans, mean, std, d.scale, d.ratio, d.hflip, d.reprob, d.interpolation,
                               after=permutation)
        if d.crop_pct == 1.0 and val.images.shape[1:3] == (img_size, img_size):
            # the evaluation transform is then ToTensor + Normalize (+ permutation): exact in batches too
            val_preprocess = BatchAugment(img_size, in_chans, mean, std, (1, 1), (1, 1), 0.0, 0.0, d.interpolation,
                                          after=permutation)
    return RunData(train, val, list(train.class_names), pre, augment, val_preprocess)


# ------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def run_eval(model: nn.Module, loader: DataLoader, num_classes: int, device: torch.device, amp: str,
             info: DistInfo | None = None) -> dict[str, Any]:
    """Loss, top-1, top-5 (percent) and the confusion matrix, summed over all ranks."""
    model.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)
    totals = torch.zeros(4, dtype=torch.float64)  # loss sum, top-5 hits, images, skipped
    k = min(5, num_classes)
    for images, targets, skipped in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(images)
        logits = logits.float()
        totals[0] += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        totals[1] += (logits.topk(k, dim=1).indices == targets[:, None]).any(dim=1).sum().item()
        totals[2] += len(targets)
        totals[3] += skipped
        pred = logits.argmax(dim=1).cpu()
        confusion += torch.bincount(targets.cpu() * num_classes + pred, minlength=num_classes**2).view(
            num_classes, num_classes)
    if info is not None:
        all_reduce_sum(confusion, info)
        all_reduce_sum(totals, info)
    n = max(totals[2].item(), 1)
    return dict(loss=totals[0].item() / n, top1=100.0 * confusion.trace().item() / n,
                top5=100.0 * totals[1].item() / n, images=int(totals[2].item()), skipped=int(totals[3].item()),
                confusion=confusion.numpy())


def eval_loader(dataset, batch_size: int, num_workers: int, info: DistInfo | None = None) -> DataLoader:
    world, rank = (info.world_size, info.rank) if info else (1, 0)
    return DataLoader(dataset, batch_size=batch_size, sampler=ShardSampler(len(dataset), world, rank),
                      num_workers=num_workers, collate_fn=collate_skipping)


# ------------------------------------------------------------------------------------------ training
def train(recipe: str | Path | dict | TrainConfig = "fashion-mnist-quick", output_dir: str | Path = "runs/train",
          overrides: dict[str, Any] | list[str] | None = None, resume: bool | str | Path = False,
          loss_fn: LossFn | None = None, trainer_class: type[Trainer] | None = None) -> dict[str, Any]:
    """Train a model from a recipe (name, YAML path, dict or TrainConfig); return summary.json's content.

    overrides: {"optim.lr": 1e-3} or ["optim.lr=1e-3"]. resume: True continues OUTPUT/last.pth, a path
    continues that state file. loss_fn(model, images, targets) replaces the supervised loss; trainer_class
    a Trainer subclass (e.g. DINOTrainer).
    Launched by torchrun, every process calls this; only rank 0 writes files.
    """
    cfg = load_config(recipe, overrides)
    # process-wide torch settings, restored afterwards so a Python caller's session is left as it was
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    info = init_distributed(cfg.train.device)
    try:
        return (trainer_class or Trainer)(cfg, Path(output_dir), info, resume, loss_fn).fit()
    finally:
        shutdown(info)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


class Trainer:
    """One training run; `fit()` does it. Kept as an object so sub-steps stay short and named."""

    def __init__(self, cfg: TrainConfig, out: Path, info: DistInfo, resume: bool | str | Path,
                 loss_fn: LossFn | None) -> None:
        self.cfg, self.out, self.info = cfg, out, info
        t, device = cfg.train, info.device
        self.state_path = self._state_to_resume(resume)
        self.amp = resolve_amp(t.amp, device)
        if self.amp == "fp16" and device.type != "cuda":
            raise ValueError("train.amp=fp16 needs a GPU (its gradient scaler is CUDA-only); use bf16 on the CPU")
        world_micro = info.world_size * t.grad_accum
        if t.batch_size % world_micro:
            raise ValueError(f"train.batch_size={t.batch_size} (global) must be divisible by processes x "
                             f"grad_accum = {info.world_size} x {t.grad_accum}")
        self.micro_batch = t.batch_size // world_micro
        torch.manual_seed(t.seed)  # model initialisation

        in_chans, img_size = cfg.input_shape()
        self.data = build_data(cfg, in_chans, img_size, self._train_transform())
        num_classes = len(self.data.class_names)
        if "num_classes" in cfg.model and cfg.model["num_classes"] != num_classes:
            raise ValueError(f"model.num_classes={cfg.model['num_classes']} but the dataset has {num_classes} "
                             "classes; drop model.num_classes to take it from the data")
        self.model: nn.Module = self._build_model(num_classes).to(device)
        if t.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.sampler = ResumableSampler(self.data.train, t.seed, info.world_size, info.rank, cfg.data.repeated_aug)
        self.steps_per_epoch = len(self.sampler) // (self.micro_batch * t.grad_accum)
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training set ({len(self.data.train)} images) is smaller than one global "
                             f"batch ({t.batch_size}); lower train.batch_size")
        self.lr = cfg.optim.lr * (t.batch_size / cfg.optim.reference_batch if cfg.optim.reference_batch else 1)
        opt_name = {"sgd": "momentum", "lamb": "lamb", "adamw": "adamw"}[cfg.optim.name]  # plain momentum SGD
        # filter_bias_and_bn: no weight decay on 1-D parameters (Affine alpha/beta, LayerScale, biases)
        # nor on model.no_weight_decay() names
        # layer_decay: timm's layer-wise lr decay over model.group_matcher(); frozen parameters are left out
        self.optimizer = create_optimizer_v2(self.model, opt=opt_name, lr=self.lr,
                                             weight_decay=cfg.optim.weight_decay, momentum=cfg.optim.momentum,
                                             filter_bias_and_bn=True, layer_decay=cfg.optim.layer_decay)
        s = cfg.schedule
        self.scheduler, _ = create_scheduler_v2(
            self.optimizer, sched=s.name, num_epochs=s.epochs, decay_epochs=s.decay_epochs, decay_rate=s.decay_rate,
            min_lr=s.min_lr, warmup_lr=s.warmup_lr, warmup_epochs=s.warmup_epochs, step_on_epochs=False,
            updates_per_epoch=self.steps_per_epoch)
        self.ema = ModelEmaV3(self.model, decay=t.ema_decay) if t.ema else None
        self.scaler = torch.amp.GradScaler("cuda") if self.amp == "fp16" else None
        self.loss_fn = loss_fn or self._build_loss(num_classes)
        self.train_model: nn.Module = torch.compile(self.model) if t.compile else self.model
        if info.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.train_model, device_ids=ids)
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.history: list[dict[str, Any]] = []
        self.best_top1, self.best_epoch = -1.0, -1
        self.epoch_totals = torch.zeros(3, dtype=torch.float64)  # loss sum, optimizer steps, skipped images
        self.wall_before = 0.0  # training seconds spent before a resume
        if self.state_path is not None:
            self._restore(load_state(self.state_path))

    # -------------------------------------------------------------------------------- hooks
    def _train_transform(self) -> Callable[[Preprocess], Any] | None:
        """hook: the training transform built from the preprocessing; None: the recipe's augmentation."""
        return None

    def _build_model(self, num_classes: int) -> nn.Module:
        """hook: a preset ResMLP/Mixer, a timm model (model.name not a preset), or a fine-tuning start."""
        cfg = self.cfg
        if cfg.finetune.checkpoint:
            from resmlp.train.finetune import build_finetune_model

            return build_finetune_model(cfg, num_classes)
        if cfg.is_timm_model:
            import timm

            kwargs = {k: v for k, v in cfg.model.items() if k not in ("name", "img_size", "num_classes")}
            return timm.create_model(cfg.model["name"], pretrained=False, num_classes=num_classes, **kwargs)
        return ResMLP(cfg.model_config(num_classes))

    def _build_loss(self, num_classes: int) -> LossFn:
        """hook: the supervised loss, wrapped by distillation when the distill section names a teacher."""
        base = supervised_loss(self.cfg, num_classes)
        if not self.cfg.distill.teacher:
            return base
        from resmlp.train.distill import build_distillation_loss

        return build_distillation_loss(self.cfg, base, num_classes, self.info.device)

    def _before_optimizer_step(self) -> None:
        """hook: runs after backward and clipping, before the optimizer step (DINO freezes its last layer)."""

    def _update_ema(self) -> None:
        """hook: the EMA update after each optimizer step (DINO: teacher momentum schedule)."""
        self.ema.update(self.model, step=self.global_step + 1)

    def _evaluate(self, model: nn.Module) -> tuple[dict[str, Any], float]:
        """hook: end-of-epoch metrics (row entries) and the score that picks the best checkpoint."""
        if self.data.val_preprocess is not None:
            shard = ShardSampler(len(self.data.val), self.info.world_size, self.info.rank)
            loader = eval_batches(self.data.val, shard, self.micro_batch, self.data.val_preprocess)
        else:
            loader = eval_loader(self.data.val, self.micro_batch, self.cfg.data.num_workers, self.info)
        result = run_eval(model, loader, len(self.data.class_names), self.info.device, self.amp, self.info)
        return dict(val_loss=result["loss"], val_top1=result["top1"], val_top5=result["top5"],
                    skipped_val_images=result["skipped"]), result["top1"]

    def _model_to_save(self) -> nn.Module:
        """hook: the network evaluated and written to best/last.safetensors."""
        return self.ema.module if self.ema is not None else self.model

    def _epoch_message(self, row: dict[str, Any]) -> str:
        """hook: the line printed after each epoch."""
        skipped = row["skipped_train_images"] + row["skipped_val_images"]
        return (f"epoch {row['epoch']}/{self.cfg.schedule.epochs}: train loss {row['train_loss']:.4f}, "
                f"val loss {row['val_loss']:.4f}, top-1 {row['val_top1']:.2f}%, top-5 {row['val_top5']:.2f}%"
                + (f", {skipped} unreadable images skipped" if skipped else ""))

    def _plot(self, path: Path) -> None:
        """hook: learning curves."""
        reporting.plot_learning_curves(path, self.history)

    def _scores(self, best: dict[str, Any]) -> dict[str, Any]:
        """hook: the accuracy keys of summary.json, from the best epoch's row."""
        return dict(test_top1=best["val_top1"], test_top5=best["val_top5"],
                    final_top1=self.history[-1]["val_top1"])

    # -------------------------------------------------------------------------------- resume
    def _state_to_resume(self, resume: bool | str | Path) -> Path | None:
        existing = self.out / STATE_FILE
        if resume is False:
            if existing.exists():
                raise ValueError(f"{self.out} already holds a run ({existing}); continue it with --resume, or "
                                 "choose another --output")
            return None
        path = existing if resume is True else Path(resume)
        if not path.is_file():
            raise FileNotFoundError(f"nothing to resume: {path} does not exist")
        return path

    def _snapshot(self) -> dict[str, Any]:
        return dict(
            config=self.cfg.to_dict(), model=self.model.state_dict(), optimizer=self.optimizer.state_dict(),
            scheduler=self.scheduler.state_dict(), ema=self.ema.state_dict() if self.ema else None,
            scaler=self.scaler.state_dict() if self.scaler else None, epoch=self.epoch,
            step_in_epoch=self.step_in_epoch, global_step=self.global_step, history=self.history,
            best_top1=self.best_top1, best_epoch=self.best_epoch, epoch_totals=self.epoch_totals.clone(),
            world_size=self.info.world_size, wall_seconds=self.wall_before + time.perf_counter() - self.t0,
        )

    def _restore(self, state: dict[str, Any]) -> None:
        saved, now = state["config"], self.cfg.to_dict()
        changed = [key for key in ("model", "optim", "schedule", "loss", "distill", "finetune", "dino")
                   if saved.get(key, now[key]) != now[key]]
        changed += [f"train.{key}" for key in ("batch_size", "grad_accum", "seed")
                    if saved["train"][key] != now["train"][key]]
        if changed:
            raise ValueError(f"{self.state_path} was trained with different {', '.join(changed)}; resume with the "
                             "same recipe and overrides (device, threads, workers and progress may change)")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ema is not None and state["ema"] is not None:
            self.ema.load_state_dict(state["ema"])
        if self.scaler is not None and state["scaler"] is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.epoch, self.step_in_epoch = state["epoch"], state["step_in_epoch"]
        self.global_step, self.history = state["global_step"], state["history"]
        self.best_top1, self.best_epoch = state["best_top1"], state["best_epoch"]
        self.epoch_totals = state["epoch_totals"]
        self.wall_before = state["wall_seconds"]
        self.scheduler.step_update(self.global_step)

    # -------------------------------------------------------------------------------- the run
    def fit(self) -> dict[str, Any]:
        self.t0 = time.perf_counter()
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            reporting.write_json(self.out / "config.json", self.cfg.to_dict())
            self.tb = reporting.TensorBoardLog(self.out / "tensorboard")
        epochs = self.cfg.schedule.epochs
        try:
            while self.epoch < epochs:
                self._train_epoch()
                self._end_epoch()
        finally:
            if self.info.is_main:
                self.tb.close()
        return self._finish()

    def _train_epoch(self) -> None:
        t, info = self.cfg.train, self.info
        per_step = self.micro_batch * t.grad_accum
        self.sampler.set_position(self.epoch, self.step_in_epoch * per_step)
        self.train_model.train()
        bar = self._progress_bar()
        micro_batches = self._micro_batches()
        epoch_start, images_seen = time.perf_counter(), 0
        while self.step_in_epoch < self.steps_per_epoch:
            seed_step(t.seed, self.global_step, info.rank)
            step_loss = torch.zeros((), dtype=torch.float64)
            for micro in range(t.grad_accum):
                images, targets, skipped = next(micro_batches)
                images = _to_device(images, info.device, t.channels_last)  # a tensor, or a list of crops
                targets = targets.to(info.device, non_blocking=True)
                sync = micro == t.grad_accum - 1 or not info.enabled
                with (contextlib.nullcontext() if sync else self.train_model.no_sync()), \
                        autocast(info.device, self.amp):
                    loss = self.loss_fn(self.train_model, images, targets)
                    scaled = loss / t.grad_accum
                    (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                step_loss += loss.detach().double().cpu()
                self.epoch_totals[2] += skipped
                images_seen += len(targets)
            self._check_finite(step_loss)
            self._optimizer_step()
            self.epoch_totals[0] += step_loss.item() / t.grad_accum
            self.epoch_totals[1] += 1
            self.step_in_epoch += 1
            self.global_step += 1
            if bar is not None:
                elapsed = time.perf_counter() - epoch_start
                bar.set_postfix(loss=f"{step_loss.item() / t.grad_accum:.4f}",
                                lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                                img_s=f"{images_seen * info.world_size / max(elapsed, 1e-9):.0f}", refresh=False)
                bar.update(1)
            every = t.checkpoint_every_steps
            if every and self.global_step % every == 0 and self.step_in_epoch < self.steps_per_epoch:
                self._save_state()
        if bar is not None:
            bar.close()
        self.epoch_seconds = time.perf_counter() - epoch_start
        self.epoch_images = images_seen * info.world_size

    def _micro_batches(self) -> Iterator[tuple[Any, torch.Tensor, int]]:
        """(images, targets, skipped) of this rank from the sampler's position: whole in-memory batches
        augmented in this process, or a DataLoader applying the per-image transform in workers."""
        if self.data.train_augment is not None:
            return array_batches(self.data.train, self.sampler, self.micro_batch, self.data.train_augment)
        return iter(DataLoader(SeededDataset(self.data.train), batch_size=self.micro_batch, sampler=self.sampler,
                               num_workers=self.cfg.data.num_workers, collate_fn=collate_skipping, drop_last=True,
                               pin_memory=self.info.device.type == "cuda", persistent_workers=False))

    def _progress_bar(self):
        if not (self.cfg.train.progress and self.info.is_main):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.steps_per_epoch, initial=self.step_in_epoch, dynamic_ncols=True,
                    desc=f"epoch {self.epoch + 1}/{self.cfg.schedule.epochs}")

    def _check_finite(self, step_loss: torch.Tensor) -> None:
        # every rank must stop together, so the verdict is summed over ranks
        bad = all_reduce_sum(torch.tensor([0.0 if math.isfinite(step_loss.item()) else 1.0]), self.info)
        if bad.item() > 0:
            where = f"epoch {self.epoch + 1}, step {self.step_in_epoch + 1} (global step {self.global_step + 1})"
            last = self.out / STATE_FILE
            kept = f"the last good checkpoint {last} is intact" if last.exists() else "no checkpoint was written yet"
            raise NonFiniteLossError(
                f"the loss became {step_loss.item()} at {where}, lr {self.optimizer.param_groups[0]['lr']:.3g}; "
                f"training stopped and {kept}. Lower optim.lr, set train.clip_grad (e.g. 1.0) or use "
                "train.amp=none, then resume with --resume or start again")

    def _optimizer_step(self) -> None:
        t = self.cfg.train
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if t.clip_grad:
            nn.utils.clip_grad_norm_(self.model.parameters(), t.clip_grad)
        self._before_optimizer_step()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step_update(self.global_step + 1)
        if self.ema is not None:
            self._update_ema()

    def _end_epoch(self) -> None:
        eval_model = self._model_to_save()
        metrics, score = self._evaluate(eval_model)
        totals = all_reduce_sum(self.epoch_totals.clone(), self.info)
        row = dict(epoch=self.epoch + 1, train_loss=totals[0].item() / max(totals[1].item(), 1),
                   lr=self.optimizer.param_groups[0]["lr"], **metrics, skipped_train_images=int(totals[2].item()),
                   epoch_seconds=round(self.epoch_seconds, 2),
                   train_images_per_s=round(self.epoch_images / max(self.epoch_seconds, 1e-9), 1))
        self.history.append(row)
        improved = score > self.best_top1
        if improved:
            self.best_top1, self.best_epoch = score, self.epoch + 1
        self.epoch += 1
        self.step_in_epoch = 0
        self.epoch_totals = torch.zeros(3, dtype=torch.float64)
        if self.info.is_main:
            print(self._epoch_message(row), flush=True)
            save(eval_model, self.out / "last.safetensors", self._metadata(row))
            if improved:
                save(eval_model, self.out / "best.safetensors", self._metadata(row))
            reporting.write_metrics_csv(self.out / "metrics.csv", self.history)
            self._plot(self.out / "learning_curves.png")
            self.tb.log(row)
        self._save_state()

    def _save_state(self) -> None:
        if self.info.is_main:
            save_state(self.out / STATE_FILE, self._snapshot())
        barrier(self.info)

    def _metadata(self, row: dict[str, Any]) -> dict[str, Any]:
        scores = {k: v for k, v in row.items() if k in ("val_top1", "val_top5", "knn_top1")}
        return dict(class_names=self.data.class_names, preprocess=self.data.preprocess.to_dict(),
                    dataset=self.cfg.data.kind, recipe=self.cfg.recipe, epoch=row["epoch"], **scores)

    def _finish(self) -> dict[str, Any]:
        best = next(r for r in self.history if r["epoch"] == self.best_epoch)
        summary = dict(
            **self._scores(best), epochs=self.epoch,
            wall_seconds=round(self.wall_before + time.perf_counter() - self.t0, 1),
            checkpoint=str((self.out / "best.safetensors").resolve()), best_epoch=self.best_epoch,
            last_checkpoint=str((self.out / "last.safetensors").resolve()),
            state=str((self.out / STATE_FILE).resolve()), recipe=self.cfg.recipe, model=self.cfg.model,
            dataset=self.cfg.data.kind, global_batch=self.cfg.train.batch_size, lr=self.lr, amp=self.amp,
            world_size=self.info.world_size,
            metrics=str((self.out / "metrics.csv").resolve()),
            learning_curves=str((self.out / "learning_curves.png").resolve()),
        )
        if self.info.is_main:
            reporting.write_json(self.out / "summary.json", summary)
        return summary


def _to_device(images: torch.Tensor | list[torch.Tensor], device: torch.device,
               channels_last: bool) -> torch.Tensor | list[torch.Tensor]:
    if isinstance(images, (list, tuple)):
        return [_to_device(crop, device, channels_last) for crop in images]
    images = images.to(device, non_blocking=True)
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images

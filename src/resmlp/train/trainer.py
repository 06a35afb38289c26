"""The training loop: a config and a task in; checkpoints, metrics, plots and summary.json out.

The front doors (resmlp.train.run: train, finetune, pretrain_dino) pick the config's task (resmlp.train.tasks:
supervised, distillation, fine-tuning, DINO) and run the Trainer. The Trainer owns what every paradigm shares: devices,
precision, DDP, the optimizer and schedule, the optional weight EMA, the step loop, exact resume, checkpoints
and logging. The task owns what differs (model, loss, evaluation, extra state). `images` may be a list of
crops (DINO).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from timm.optim import create_optimizer_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from resmlp import reporting
from resmlp.checkpoint import save
from resmlp.data.loading.assemble import build_data
from resmlp.data.loading.batches import TrainBatches
from resmlp.models.fused_block import set_fused_training
from resmlp.runtime import (
    DistInfo,
    all_reduce_sum,
    autocast,
    barrier,
    compile_module,
    grad_scaler,
    resolve_amp,
)
from resmlp.train.config import TrainConfig
from resmlp.train.controls import should_stop, stop_early
from resmlp.train.outputs import checkpoint_metadata, run_summary, score_test_split, side_outputs
from resmlp.train.state import STATE_FILE, load_state, restore, save_state, seed_step, snapshot, state_to_resume
from resmlp.train.step import (
    CompileChoice,
    RunningTotals,
    UpdateGuard,
    all_finite,
    lr_scheduler,
    optimizer_options,
    schedule_to,
    total_grad_norm,
)
from resmlp.train.tasks import Task


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; the last good checkpoint is left as it was."""


class Trainer:
    """One training run; `fit()` does it. Public attributes are what tasks may read (see resmlp.train.tasks)."""

    def __init__(self, cfg: TrainConfig, out: Path, info: DistInfo, resume: bool | str | Path, task: Task,
                 max_steps: int | None = None) -> None:  # max_steps: resmlp.train.controls
        self.cfg, self.out, self.info, self.task, self.max_steps = cfg, out, info, task, max_steps
        t, device = cfg.train, info.device
        self.state_path = state_to_resume(out, resume)
        self.amp = resolve_amp(t.amp, device)
        world_micro = info.world_size * t.grad_accum
        if t.batch_size % world_micro:
            raise ValueError(f"train.batch_size={t.batch_size} (global) must be divisible by processes x "
                             f"grad_accum = {info.world_size} x {t.grad_accum}")
        self.micro_batch = t.batch_size // world_micro
        torch.manual_seed(t.seed)  # model initialisation

        in_chans, img_size = cfg.input_shape()
        self.data = build_data(cfg.data, in_chans, img_size, t.seed, task.train_transform(), out)
        num_classes = len(self.data.class_names)
        if "num_classes" in cfg.model and cfg.model["num_classes"] != num_classes:
            raise ValueError(f"model.num_classes={cfg.model['num_classes']} but the dataset has {num_classes} "
                             "classes; drop model.num_classes (it is taken from the data)")
        self.model: nn.Module = task.build_model(self, num_classes).to(device)
        set_fused_training(self.model, t.fused_step)
        if t.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)
        self.train_batches = TrainBatches(self.data, t.seed, info.world_size, info.rank, cfg.data.repeated_aug,
                                          self.micro_batch, cfg.data.num_workers, device, t.channels_last)
        self.sampler = self.train_batches.sampler  # resmlp.train.state reads a stream's position from it
        self.steps_per_epoch = len(self.train_batches) // (self.micro_batch * t.grad_accum)
        if self.steps_per_epoch == 0:
            raise ValueError(f"the training set ({len(self.data.train)} images) is smaller than one global "
                             f"batch ({t.batch_size}); lower train.batch_size")
        self._build_optimization()
        self.loss_fn = task.build_loss(self, num_classes)
        self.compile_choice = CompileChoice(str(t.compile).lower(), device, info.world_size, max_steps)
        self.train_model: nn.Module = self._compiled(self.model) if self.compile_choice.decided else self.model
        if self.compile_choice.decided and info.is_main:  # the bar waits at its first step while torch compiles
            print(f"{self.compile_choice.reason}: the first step compiles the model (a minute or more on a CPU)",
                  flush=True)
        if info.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.train_model = DistributedDataParallel(self.train_model, device_ids=ids)
        self.guard = UpdateGuard(self.model, self.optimizer, device)
        self.totals = RunningTotals(device)  # on the device; read once per log interval
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.history: list[dict[str, Any]] = []
        self.best_top1, self.best_epoch = -1.0, -1
        self.epoch_totals = torch.zeros(3, dtype=torch.float64)  # loss sum, optimizer steps, skipped images
        self.wall_before = 0.0  # training seconds spent before a resume
        task.setup(self)
        if self.state_path is not None:
            restore(self, load_state(self.state_path))

    def _build_optimization(self) -> None:
        """Optimizer (timm), lr schedule (timm, per step), weight EMA (timm) and gradient scaler (fp16)."""
        cfg, t = self.cfg, self.cfg.train
        self.lr = cfg.optim.lr * (t.batch_size / cfg.optim.reference_batch if cfg.optim.reference_batch else 1)
        opt_name = {"sgd": "momentum", "lamb": "lamb", "adamw": "adamw"}[cfg.optim.name]  # plain momentum SGD
        # filter_bias_and_bn: no weight decay on 1-D parameters (Affine alpha/beta, LayerScale, biases)
        # nor on model.no_weight_decay() names
        # layer_decay: timm's layer-wise lr decay over model.group_matcher(); frozen parameters are left out
        self.optimizer = create_optimizer_v2(self.model, opt=opt_name, lr=self.lr,
                                             weight_decay=cfg.optim.weight_decay, momentum=cfg.optim.momentum,
                                             filter_bias_and_bn=True, layer_decay=cfg.optim.layer_decay,
                                             **optimizer_options(opt_name, self.info.device),
                                             **({} if cfg.optim.eps is None else {"eps": cfg.optim.eps}))
        self.scheduler = lr_scheduler(self.optimizer, cfg.schedule, self.steps_per_epoch)
        self.ema = ModelEmaV3(self.model, decay=t.ema_decay) if t.ema else None
        self.scaler = grad_scaler(self.amp, self.info.device)

    # -------------------------------------------------------------------------------- the run
    def fit(self) -> dict[str, Any]:
        self.t0 = time.perf_counter()
        if self.info.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            reporting.write_json(self.out / "config.json", self.cfg.to_dict())
            self.tb = reporting.RunLogs(self.out, self.cfg.to_dict())  # TensorBoard, W&B, MLflow
            if self.history:  # a resume: the files a kill during the last epoch's side outputs left unwritten
                side_outputs(self, self.history[-1], logs=False)
        self.train_batches.choose(self.info)  # data.pipeline auto: measured here, before the first step
        try:
            while self.epoch < self.cfg.schedule.epochs and not should_stop(self):
                self._train_epoch()
                if self.step_in_epoch == self.steps_per_epoch:  # not stopped within the epoch (--max-steps, a signal)
                    self._end_epoch()
            if self.epoch < self.cfg.schedule.epochs:
                return stop_early(self, self._save_state)
        finally:
            if self.info.is_main:
                self.tb.close()
        return self._finish()

    def _train_epoch(self) -> None:
        t = self.cfg.train
        self.train_model.train()
        bar = self._progress_bar()
        micro_batches = self.train_batches.batches(self.epoch, self.step_in_epoch * self.micro_batch * t.grad_accum)
        epoch_start, images_seen = time.perf_counter(), 0
        self.totals.reset()
        self.loss_before = self.epoch_totals[0].item()  # a resumed epoch's loss sum so far (host tensor)
        self.last_read, self.steps_at_read, self.loss_at_read = time.perf_counter(), self.step_in_epoch, 0.0
        while self.step_in_epoch < self.steps_per_epoch and not should_stop(self):
            seed_step(t.seed, self.global_step, self.info.rank)
            step_loss, images = self._forward_backward(micro_batches)
            images_seen += images
            self._optimizer_step(step_loss)
            self.epoch_totals[1] += 1
            self.step_in_epoch += 1
            self.global_step += 1
            self._maybe_compile()
            if bar is not None:
                bar.update(1)
            every = t.checkpoint_every_steps
            save_now = every and self.global_step % every == 0 and self.step_in_epoch < self.steps_per_epoch
            if save_now or self._read_due():
                self._read(bar, images_seen, epoch_start)
            if save_now:
                self._save_state()
        if self.steps_at_read != self.step_in_epoch or self.step_in_epoch == 0:
            self._read(bar, images_seen, epoch_start)
        if bar is not None:
            bar.close()
        self.epoch_seconds = time.perf_counter() - epoch_start
        self.epoch_images = images_seen * self.info.world_size

    def _read_due(self) -> bool:
        """Read the device totals every train.log_every_steps steps, or (0: auto) every half second."""
        every = self.cfg.train.log_every_steps
        if every:
            return (self.step_in_epoch - self.steps_at_read) >= every
        return time.perf_counter() - self.last_read >= 0.5

    def _read(self, bar, images_seen: int, epoch_start: float) -> None:
        """The one host read of a log interval: the loss sum and the first non-finite step (then stop)."""
        loss_sum, first_bad, bad_steps = self.totals.read()
        if first_bad >= 0:
            if self.scaler is None:  # fp16: the GradScaler skipped those steps before the optimizer ran
                self.guard.undo_host_counters(bad_steps)
            self._stop_non_finite(f"the loss or gradients became NaN/infinite at {self._where(first_bad)}")
        self.epoch_totals[0] = self.loss_before + loss_sum
        steps = self.step_in_epoch - self.steps_at_read
        if bar is not None and steps:
            elapsed = time.perf_counter() - epoch_start
            bar.set_postfix(loss=f"{(loss_sum - self.loss_at_read) / steps:.4f}",
                            lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                            img_s=f"{images_seen * self.info.world_size / max(elapsed, 1e-9):.0f}", refresh=False)
        self.last_read, self.steps_at_read, self.loss_at_read = time.perf_counter(), self.step_in_epoch, loss_sum

    def _forward_backward(self, micro_batches: Iterator) -> tuple[torch.Tensor, int]:
        """Forward and backward over grad_accum micro-batches: (loss sum on the device, images)."""
        t, info = self.cfg.train, self.info
        step_loss, images_seen = torch.zeros((), dtype=torch.float32, device=info.device), 0
        for micro in range(t.grad_accum):
            images, targets, skipped = next(micro_batches)  # already on the device (DevicePrefetcher)
            if self.compile_choice.cuda_graphs:
                torch.compiler.cudagraph_mark_step_begin()
            sync = micro == t.grad_accum - 1 or not info.enabled
            with (contextlib.nullcontext() if sync else self.train_model.no_sync()), autocast(info.device, self.amp):
                loss = self.loss_fn(self.train_model, images, targets)
                scaled = loss / t.grad_accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            step_loss += loss.detach().float()
            self.epoch_totals[2] += skipped
            images_seen += len(targets)
        return step_loss, images_seen

    def _progress_bar(self):
        if not (self.cfg.train.progress and self.info.is_main):
            return None
        from resmlp.progress import LINE_SECONDS, progress_bar

        # a plain line per read where stderr is no terminal: each log_every_steps, or every LINE_SECONDS (auto)
        return progress_bar(total=self.steps_per_epoch, initial=self.step_in_epoch, unit="step",
                            desc=f"epoch {self.epoch + 1}/{self.cfg.schedule.epochs}",
                            min_interval_s=0 if self.cfg.train.log_every_steps else LINE_SECONDS)

    def _where(self, global_step: int) -> str:
        epoch, step = divmod(global_step, self.steps_per_epoch)
        return f"epoch {epoch + 1}, step {step + 1} (global step {global_step + 1})"

    def _stop_non_finite(self, what: str) -> None:
        last = self.out / STATE_FILE
        kept = f"the last good checkpoint {last} is intact" if last.exists() else "no checkpoint was written yet"
        raise NonFiniteLossError(
            f"{what}, lr {self.optimizer.param_groups[0]['lr']:.3g}; training stopped (that step's update was "
            f"skipped) and {kept}. Resume it with a lower learning rate (--resume --set optim.lr=...), set "
            "train.clip_grad (e.g. 1.0) or train in fp32 (--amp fp32)")

    def _check_weights(self) -> None:
        """Non-finite weights at the end of an epoch (one read): a checkpoint of them is no good checkpoint."""
        finite = torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all()
        bad = all_reduce_sum((~finite).to(torch.float64).view(1), self.info)  # every rank stops together
        if bad.item() > 0:
            self._stop_non_finite(f"the weights became NaN/infinite by the end of epoch {self.epoch + 1}")

    def _optimizer_step(self, step_loss: torch.Tensor) -> None:
        """Unscale, clip (every precision, as timm's NativeScaler and DINO), step, schedule, EMA; the update undone
        on the device if the loss or gradients are not finite (fp16: the GradScaler skips those steps itself)."""
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        t = self.cfg.train
        grad_norm = total_grad_norm(self.model, t.clip_grad, t.clip_mode) if t.clip_grad or not self.scaler else None
        ok = all_finite(step_loss, None if self.scaler else grad_norm)  # fp16: the scaler skips overflowed steps
        if self.info.enabled:  # one verdict for all ranks (no host read: a collective on the device)
            ok = all_reduce_sum((~ok).to(torch.int32).view(1), self.info)[0] == 0
        self.task.before_optimizer_step(self)
        before = self.guard.before_step()
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.guard.after_step(before, ok)
        self.optimizer.zero_grad(set_to_none=True)
        self.totals.add(step_loss / self.cfg.train.grad_accum, ok, self.global_step)  # the step's mean loss
        self.scheduler.step_update(self.global_step + 1)  # per update; a no-op for step_on: epoch (timm)
        if self.ema is not None:
            self.ema.update(self.model, step=self.global_step + 1)
        self.task.after_optimizer_step(self)

    def _compiled(self, module: nn.Module) -> nn.Module:
        # on one GPU the compiled graphs are replayed as CUDA graphs (static shapes: drop_last)
        return compile_module(module, **({"mode": "reduce-overhead"} if self.compile_choice.cuda_graphs else {}))

    def _maybe_compile(self) -> None:
        """train.compile=auto: compile once the eager steps say the rest of the run pays for it."""
        remaining = (self.cfg.schedule.epochs - self.epoch) * self.steps_per_epoch - self.step_in_epoch
        sync = torch.cuda.synchronize if self.info.device.type == "cuda" else (lambda: None)
        if self.compile_choice.after_step(remaining, sync, self.global_step):
            self.train_model = self._compiled(self.train_model)
            if self.info.is_main:
                print(self.compile_choice.reason + ": compiling (the next step takes a minute or more on a CPU)",
                      flush=True)

    def _end_epoch(self) -> None:
        self._check_weights()
        eval_model = self.task.model_to_save(self)
        metrics, score = self.task.evaluate(self, eval_model)
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
        schedule_to(self.scheduler, self.cfg.schedule, self.global_step, self.epoch)  # DeiT: step(epoch) per epoch
        self.epoch_totals = torch.zeros(3, dtype=torch.float64)
        # the state right after the checkpoints it vouches for; the slow side outputs after it (a resume redraws them)
        if self.info.is_main:
            print(self.task.epoch_message(row, self.cfg.schedule.epochs), flush=True)
            save(eval_model, self.out / "last.safetensors", checkpoint_metadata(self, row))
            if improved:
                save(eval_model, self.out / "best.safetensors", checkpoint_metadata(self, row))
        self._save_state()
        if self.info.is_main:
            side_outputs(self, row, eval_model, score)

    def _save_state(self) -> None:
        if self.info.is_main:
            save_state(self.out / STATE_FILE, snapshot(self))
        barrier(self.info)

    def _finish(self) -> dict[str, Any]:
        summary = run_summary(self, *score_test_split(self))
        if self.info.is_main:
            reporting.write_json(self.out / "summary.json", summary)
        return summary

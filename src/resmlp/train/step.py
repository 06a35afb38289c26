"""What a training step keeps on the device, so that a GPU never waits for the host between steps.

- `RunningTotals`: the loss sum and the first non-finite step, accumulated on the device and read once per
  log interval (`read`) instead of once per step.
- `UpdateGuard`: the optimizer step skips its own update on the device when the loss or the gradients are not
  finite (as GradScaler skips fp16 steps, but without reading the verdict on the host): the parameters and the
  optimizer state, step counters included, are put back as they were before the step. The run stops at the
  next read, naming the step.
- `lr_scheduler`, `total_grad_norm`: the per-step learning rate and gradient clipping.
- `CompileChoice`: `train.compile: auto` measures the eager step, then compiles when the rest of the run is
  long enough to pay for the compilation.

torch and timm have no step guard that works for every optimizer without a host read (GradScaler reads
`found_inf` on the host; only torch's fused Adam/SGD take it as a tensor), hence UpdateGuard.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from torch import nn

from resmlp.runtime import canonical_device
from resmlp.train.sections import ScheduleConfig

# what a compilation costs: the quickstart's first epoch ran 1-16 s longer than its others on a 2-core AVX-512
# BF16 CPU in bf16 (inductor's cache warm or cold; docs/benchmarks.md); on an H100 18.5 s (default mode) and 7.6 s
# (CUDA graphs) (shared/measurements/gpu-h100-2026-11-24.md). `auto` compiles when the eager estimate of the
# rest of the run exceeds COMPILE_PAYS_AFTER seconds: a few times the cost, so a short run never pays more
# for compiling than it saves.
COMPILE_PAYS_AFTER = {"cpu": 90.0, "cuda": 60.0}
TIMED_STEPS = 6  # eager steps timed by `auto` (after two warm-up steps)


class RunningTotals:
    """Loss sum and first non-finite step of the current epoch, on the device until `read`. Every total is zero
    when nothing went wrong (the first bad step is kept as step + 1), so a fresh epoch is all zeros."""

    def __init__(self, device: torch.device) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        self.first_bad_step_plus_one = torch.zeros((), dtype=torch.int64, device=device)
        self.bad_steps = torch.zeros((), dtype=torch.int64, device=device)

    def add(self, step_loss: torch.Tensor, finite: torch.Tensor, global_step: int) -> None:
        """A step's loss (only when finite: the epoch's mean stays readable) and its verdict."""
        self.loss_sum += torch.where(finite, step_loss.double(), 0.0)
        first = self.first_bad_step_plus_one
        first.copy_(torch.where((first == 0) & ~finite, global_step + 1, first))
        self.bad_steps += ~finite

    def read(self) -> tuple[float, int, int]:
        """(loss sum, first non-finite global step or -1, non-finite steps): one host read for all three."""
        loss_sum, first_plus_one, bad = torch.stack([self.loss_sum, self.first_bad_step_plus_one.double(),
                                                     self.bad_steps.double()]).tolist()
        return loss_sum, int(first_plus_one) - 1, int(bad)

    def reset(self) -> None:
        self.loss_sum.zero_()
        self.first_bad_step_plus_one.zero_()
        self.bad_steps.zero_()


class UpdateGuard:
    """Undo, on the device, an optimizer step taken with a non-finite loss or gradient.

    Every parameter and floating-point optimizer-state tensor on the training device (moments, and the step
    counters where torch keeps them there: capturable AdamW, see `optimizer_options`) is copied before the step
    and put back where the verdict `ok` is False, with no host read. Counters the optimizer keeps on the host
    while training on a GPU (timm LAMB's `param_groups[i]["step"]`, a CPU tensor it reads for bias correction)
    cannot be put back without reading the verdict: `undo_host_counters` does it at the trainer's next read,
    which is a host read anyway and stops the run (steps in between see a counter one ahead per skipped step;
    the run ends there, so nothing trained with it is kept).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.model, self.optimizer = model, optimizer
        self.device = canonical_device(device)  # tensors say `cuda:0`; an unindexed `cuda` would match none
        self.backup: list[torch.Tensor] = []
        self._state_ids: set[int] = set()  # the optimizer-state tensors that existed before the last step
        self._with_state = 0  # parameters the optimizer held state for after the last step

    def _on_device(self, tensor: object) -> bool:
        return torch.is_tensor(tensor) and tensor.is_floating_point() and tensor.device == self.device

    def _state_tensors(self) -> list[torch.Tensor]:
        tensors = [v for state in self.optimizer.state.values() for v in state.values()]
        tensors += [group["step"] for group in self.optimizer.param_groups if "step" in group]
        return tensors

    def _tensors(self) -> list[torch.Tensor]:
        """Every parameter and floating-point optimizer-state tensor on the training device."""
        return [p.data for p in self.model.parameters()] + [t for t in self._state_tensors() if self._on_device(t)]

    def host_counters(self) -> list[torch.Tensor]:
        """Optimizer tensors kept on the host while the run is on another device (LAMB's step counts)."""
        if self.device.type == "cpu":
            return []
        return [t for t in self._state_tensors() if torch.is_tensor(t) and t.device.type == "cpu"]

    def before_step(self) -> list[torch.Tensor]:
        tensors = self._tensors()
        if len(self.backup) != len(tensors):  # the first step creates the optimizer's state; then it stays
            self.backup = [torch.empty_like(t) for t in tensors]
            self._state_ids = {id(t) for t in self._state_tensors()}  # state objects persist across steps
        if tensors:
            torch._foreach_copy_(self.backup, tensors)
        return tensors

    def after_step(self, before: list[torch.Tensor], ok: torch.Tensor) -> None:
        """Keep the step where `ok`, else restore what `before_step` saw; state the step created (the first
        step's moments) goes back to zero, what Adam, LAMB and SGD start from."""
        for tensor, saved in zip(before, self.backup, strict=True):
            torch.where(ok, tensor, saved, out=tensor)
        if len(self.optimizer.state) == self._with_state:  # no parameter got its first state in this step
            return
        self._with_state = len(self.optimizer.state)
        for tensor in self._state_tensors():
            if id(tensor) not in self._state_ids and self._on_device(tensor):
                torch.where(ok, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device), out=tensor)

    def undo_host_counters(self, skipped_steps: int) -> None:
        """Take back the `skipped_steps` advances of the host-side step counters (read by the caller)."""
        for counter in self.host_counters():
            counter.sub_(skipped_steps)


def optimizer_options(name: str, device: torch.device) -> dict[str, object]:
    """Extra keyword arguments for timm's optimizer factory on `device`. On a GPU, AdamW is made capturable:
    torch then keeps its step counters on the device (not the host), computes the bias correction there, and
    UpdateGuard can put them back with the rest of the state without reading the verdict."""
    return {"capturable": True} if name == "adamw" and device.type == "cuda" else {}


def lr_scheduler(optimizer: torch.optim.Optimizer, s: ScheduleConfig, updates_per_epoch: int) -> Scheduler:
    """timm's scheduler for the schedule section, stepped per update (step_on: update) or per epoch (step_on:
    epoch, as DeiT's main.py; see schedule_to). warmup_prefix: the cosine starts after the warm-up and spans the
    remaining epochs (DINO's utils.cosine_scheduler); else it spans all epochs, warm-up included."""
    scheduler, _ = create_scheduler_v2(
        optimizer, sched=s.name, num_epochs=s.epochs - s.warmup_epochs if s.warmup_prefix else s.epochs,
        decay_epochs=s.decay_epochs, decay_rate=s.decay_rate, min_lr=s.min_lr, warmup_lr=s.warmup_lr,
        warmup_epochs=s.warmup_epochs, warmup_prefix=s.warmup_prefix, step_on_epochs=s.step_on == "epoch",
        updates_per_epoch=updates_per_epoch)
    return scheduler


def schedule_to(scheduler: Scheduler, s: ScheduleConfig, global_step: int, epochs_done: int) -> None:
    """Set the lr for the run's position (after `global_step` updates, `epochs_done` whole epochs): on a start,
    a resume and after each update and epoch. step_on update: timm's step_update(global_step) (a no-op for an
    epoch scheduler). step_on epoch: DeiT's main.py calls lr_scheduler.step(epoch) after training epoch `epoch`
    (0-based), so epoch 0 trains at the scheduler's initial value (warmup_lr) and epoch e >= 1 at its value for
    e - 1; a rebuilt scheduler (a resume) is put where that left it."""
    if s.step_on == "epoch":
        if epochs_done >= 1:
            scheduler.step(epochs_done - 1)
    else:
        scheduler.step_update(global_step)


def all_finite(loss: torch.Tensor, grad_norm: torch.Tensor | None) -> torch.Tensor:
    """A device bool: the loss and (when given) the total gradient norm are finite."""
    finite = torch.isfinite(loss)
    return finite & torch.isfinite(grad_norm) if grad_norm is not None else finite


def total_grad_norm(model: nn.Module, clip: float | None, mode: str = "norm") -> torch.Tensor | None:
    """The total gradient norm before clipping: NaN/inf when any gradient is. With `clip`, mode "norm" scales
    all gradients by one factor so that their global norm is at most `clip` (torch's clip_grad_norm_), mode
    "per_param" scales each parameter's gradient so that its own norm is at most `clip`, as DINO's
    utils.clip_gradients does (factor clip / (norm + 1e-6) where below 1). No host read in either."""
    params = [p for p in model.parameters() if p.grad is not None]
    grads = [p.grad for p in params]
    if not grads:
        return None
    if clip and mode == "norm":  # clip_grad_norm_ takes the parameters (handed their grads, it finds none to clip)
        return nn.utils.clip_grad_norm_(params, clip)
    norms = torch._foreach_norm(grads)
    if clip:  # per_param; torch has no per-tensor clip, so the factors are DINO's, applied in one foreach pass
        factors = [(clip / (n + 1e-6)).clamp(max=1.0) for n in norms]
        torch._foreach_mul_(grads, factors)
    return torch.linalg.vector_norm(torch.stack(norms))


@dataclass
class CompileChoice:
    """`train.compile` auto / true / false for one process. auto: eager for 2 warm-up and TIMED_STEPS timed steps,
    then compile when the rest of the run, at the eager speed, would last longer than COMPILE_PAYS_AFTER.
    On one GPU the compiled step is captured as CUDA graphs (mode reduce-overhead: training shapes are static,
    drop_last), which removes the launch overhead that dominates small models. step_limit: --max-steps (optimizer
    steps over the whole run, resmlp.train.controls): the steps left are counted to it where it comes first."""

    setting: str
    device: torch.device
    world_size: int = 1
    step_limit: int | None = None
    decided: bool | None = None
    reason: str = ""
    _start: float = 0.0
    _steps: int = 0

    def __post_init__(self) -> None:
        if self.setting != "auto":
            self.decided = self.setting == "true"
            self.reason = f"train.compile={self.setting}"

    @property
    def cuda_graphs(self) -> bool:
        return bool(self.decided) and self.device.type == "cuda" and self.world_size == 1

    def summary(self) -> dict[str, object]:
        why = self.reason or (f"train.compile=auto: undecided after {self._steps} step(s) of this process (a resumed "
                              "run times its eager steps again), so it stayed eager")
        return dict(compiled=bool(self.decided), cuda_graphs=self.cuda_graphs, why=why)

    def after_step(self, remaining_steps: int, sync, global_step: int = 0) -> bool | None:
        """Called after each step (`remaining_steps` to the schedule's end, `global_step` optimizer steps done);
        True exactly once, when auto decides to compile (the caller compiles)."""
        if self.decided is not None:
            return None
        self._steps += 1
        if self.step_limit is not None:  # a 12-step smoke run (--max-steps 12) of a long schedule stays eager
            remaining_steps = max(0, min(remaining_steps, self.step_limit - global_step))
        if remaining_steps == 0 and self._steps <= 2:  # the run ends before any eager step was timed
            self.decided = False
            self.reason = (f"train.compile=auto: the run's {self._steps} step(s) ended before the 2 warm-up steps "
                           "were timed, so it stayed eager")
            return False
        if self._steps == 2:
            sync()
            self._start = time.perf_counter()
        elif self._steps == 2 + TIMED_STEPS or remaining_steps == 0:
            sync()
            per_step = (time.perf_counter() - self._start) / max(self._steps - 2, 1)
            limit = COMPILE_PAYS_AFTER.get(self.device.type, COMPILE_PAYS_AFTER["cuda"])
            self.decided = remaining_steps * per_step > limit
            to_limit = f" (to --max-steps {self.step_limit})" if self.step_limit is not None else ""
            self.reason = (f"train.compile=auto: {remaining_steps} steps left{to_limit} at {per_step * 1000:.1f} ms "
                           f"eager = {remaining_steps * per_step:.0f} s {'>' if self.decided else '<='} {limit:.0f} s")
            return self.decided
        return None

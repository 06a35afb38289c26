"""Which path trains: `data.pipeline: auto` measures the device path against timm's before the first step, and a
device path that fails falls back to timm's from the same position (docs/training.md, "data.pipeline").

The probe (`measure`): each eligible path's first batches of epoch 0, built as training builds them (loader
workers, decoding, augmentation, the copy to the device, DeviceFinish on timm's path), timed on the run's device
from the first batch handed out (worker start-up and first allocations excluded) to the last, the device
synchronised at both ends. Bounded: at most PROBE_BATCHES batches a path, and a path stops at the first batch
boundary after PROBE_SECONDS (its device type's). The batches are not trained on; the probe sets the sampler's
position as training does and the trainer seeds every RNG per step, and the Python, NumPy and torch CPU RNGs are
put back as they were, so a run that chose a path equals a run forced to it bit for bit (tests/test_pipeline_choice.py).

The fallback (`DEVICE_FAILURES`, `is_device_failure`): an exception of the device path's own making (a kernel
missing for a dtype, nvJPEG refusing a file the CPU decoder reads, out of memory in the resample: RuntimeError,
torch.OutOfMemoryError, NotImplementedError) switches the run to timm's path. An error of the user's data
(resmlp.errors: DataError and the other ResmlpErrors, unreadable records skipped by
resmlp.data.records.skip_unreadable) is not a device failure and keeps its handling.

`PipelineChoice` is what summary.json (`data_pipeline`) and the resumable state record: the path, the figures
(images/s per path), the reason, and a switch (the error, and the epoch and position it happened at).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from resmlp.errors import CheckpointError, ResmlpError

PROBE_BATCHES = 5  # a path's batches at most: the first (workers starting) untimed, then 4 timed
PROBE_SECONDS = {"cuda": 3.0, "cpu": 12.0}  # a path stops at the first batch boundary after this (others: cuda's)
DEVICE_FAILURES = (RuntimeError, NotImplementedError)  # torch.OutOfMemoryError is a RuntimeError


def is_device_failure(error: BaseException) -> bool:
    """Whether the device path's `error` switches the run to timm's path (module doc): the device's, not the data's."""
    return isinstance(error, DEVICE_FAILURES) and not isinstance(error, ResmlpError)


def error_line(error: BaseException) -> str:
    """The error in one line: its type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


@dataclass
class PipelineChoice:
    """The training path (`name`: device, timm or batched), the probe's images/s per path (`figures`, empty
    without a probe), why (`reason`), and `switched`: {error, epoch, position} once the device path failed."""

    name: str
    reason: str
    figures: dict[str, float | None] = field(default_factory=dict)
    switched: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: Any) -> PipelineChoice:
        """The choice a state recorded; CheckpointError (one line) for a record that is not one."""
        if not isinstance(saved, dict) or not isinstance(saved.get("name"), str):
            raise CheckpointError(f"the state's data_pipeline record is {str(saved)[:80]!r}, not a data path; the "
                                  "state file is damaged: resume from a copy or start a new run")
        figures, switched = saved.get("figures"), saved.get("switched")
        return cls(saved["name"], str(saved.get("reason", "")), dict(figures) if isinstance(figures, dict) else {},
                   switched if isinstance(switched, dict) else None)


def probe_seconds(device: torch.device) -> float:
    return PROBE_SECONDS.get(device.type, PROBE_SECONDS["cuda"])


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def images_per_second(batches: Iterable[tuple[Any, torch.Tensor, int]], device: torch.device,
                      max_batches: int = PROBE_BATCHES, seconds: float | None = None) -> float:
    """Images/s of `batches` on `device`, timed from the first batch handed out to the last (module doc); a
    path whose first batch alone took the time is timed by that batch, start-up included."""
    seconds = probe_seconds(device) if seconds is None else seconds
    start = time.perf_counter()
    first, images = None, 0
    for handed, (_, targets, _) in enumerate(batches, start=1):
        now = time.perf_counter()
        if first is None:
            _sync(device)
            first, first_images = time.perf_counter(), len(targets)
        else:
            images += len(targets)
        if handed >= max_batches or now - start >= seconds:
            break
    _sync(device)
    end = time.perf_counter()
    if first is None:
        return 0.0
    if images == 0:  # only the first batch came within the time: start-up included
        return first_images / max(end - start, 1e-9)
    return images / max(end - first, 1e-9)


class KeptRNG:
    """The Python, NumPy and torch CPU RNG states, put back on exit (the probe's batches draw from them)."""

    def __enter__(self) -> KeptRNG:
        self.states = random.getstate(), np.random.get_state(), torch.get_rng_state()
        return self

    def __exit__(self, *exc: object) -> None:
        python, numpy, cpu = self.states
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)


def measure(paths: dict[str, Callable[[], Iterable]], device: torch.device) -> dict[str, float | str]:
    """Images/s of each path (its batches from `paths[name]()`), or the device failure's line where the path
    raised one."""
    figures: dict[str, float | str] = {}
    for name, open_batches in paths.items():
        with KeptRNG():
            try:
                figures[name] = round(images_per_second(open_batches(), device), 1)
            except Exception as e:
                if name == "timm" or not is_device_failure(e):
                    raise
                figures[name] = error_line(e)
    return figures


def decide(figures: dict[str, float | str], device: torch.device) -> PipelineChoice:
    """The faster measured path; a path that failed loses (its error is the reason)."""
    failed = {name: value for name, value in figures.items() if isinstance(value, str)}
    measured = {name: value for name, value in figures.items() if not isinstance(value, str)}
    numbers = {name: (None if name in failed else value) for name, value in figures.items()}
    name = max(measured, key=lambda n: (measured[n], n == "timm"))  # a tie: timm's, the reference
    if failed:
        reason = "; ".join(f"the {n} path failed at the probe ({why})" for n, why in failed.items())
    else:
        others = ", ".join(f"{n} {v:,.1f}" for n, v in measured.items() if n != name)
        reason = f"measured faster on {device}: {name} {measured[name]:,.1f} images/s vs {others}"
    return PipelineChoice(name, reason, numbers)


def probe_line(choice: PipelineChoice, batches: int = PROBE_BATCHES) -> str:
    """The one line a run prints about its probe."""
    figures = ", ".join(f"{n} {'failed' if v is None else f'{v:,.1f} images/s'}" for n, v in choice.figures.items())
    return (f"data.pipeline auto: {figures} (probe: up to {batches} batches a path, not trained on) -> "
            f"{choice.name}" + (f"; {choice.reason}" if choice.figures and None in choice.figures.values() else ""))


def agreed(choice: PipelineChoice | None, info: Any) -> PipelineChoice:
    """Rank 0's choice on every rank (one broadcast under torchrun); `choice` is rank 0's, None elsewhere."""
    if not getattr(info, "enabled", False):
        assert choice is not None
        return choice
    import torch.distributed as dist

    box = [choice.to_dict() if choice is not None else None]
    dist.broadcast_object_list(box, src=0)
    return PipelineChoice.from_dict(box[0])

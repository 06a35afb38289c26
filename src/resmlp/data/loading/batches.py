"""The training split as one rank's batches: the one thing the trainer asks the data layer for.

Every data path gives its batches the same way, `TrainBatches.batches(epoch, skip)`: (images, targets, skipped)
on the training device from `skip` samples into `epoch`, the next batch copied ahead (DevicePrefetcher), the
per-image path's uint8 batches normalised and erased there (DeviceFinish). Which
paths there are (in-memory arrays augmented in whole batches, the device pipeline, or a DataLoader of the per-image
transform over map records or a stream) is decided here when the batches are built; which of them trains, before
the first step (`choose`: data.pipeline auto measures the device path against timm's), and a device path that
fails hands over to timm's at the same position (resmlp.data.loading.choice).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

from resmlp.data.device.batch_augment import array_batches
from resmlp.data.loading.choice import (
    PipelineChoice,
    agreed,
    decide,
    error_line,
    is_device_failure,
    measure,
    probe_line,
)
from resmlp.data.loading.finish import DeviceFinish
from resmlp.data.loading.loaders import StreamPosition, epoch_sampler, train_loader
from resmlp.data.loading.prefetch import DevicePrefetcher
from resmlp.data.loading.samplers import ResumableSampler
from resmlp.runtime import data_workers, is_accelerator

Batch = tuple[Any, torch.Tensor, int]  # images (a tensor, or a list of views), targets, unreadable skipped


class EpochBatches(Protocol):
    """What the trainer needs of its data: len (this rank's samples in a whole epoch) and the batches of an epoch
    from a position (a resume goes on exactly where it stopped)."""

    def __len__(self) -> int: ...

    def batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]: ...


class TrainBatches:
    """One rank's training batches of `data` (a resmlp.data.loading.assemble.RunData) in the sampler's order.
    A DataLoader is built at a path's first use and kept: its workers persist across epochs.

    With a device path (data.pipeline auto or device) timm's path is built beside it: `choose` measures both
    (auto) or takes the forced one, `resume` the path a state names, and a device failure while batches are
    handed out switches to timm's path from the same position (resmlp.data.loading.choice)."""

    def __init__(self, data: Any, seed: int, world_size: int, rank: int, repeats: int, batch_size: int,
                 num_workers: int, device: torch.device, channels_last: bool = False) -> None:
        self.sampler: ResumableSampler | StreamPosition = epoch_sampler(
            data.train, seed, world_size, rank, repeats, batch_size, num_workers)
        self.length = len(self.sampler)
        self.device, self.channels_last, self.finish = device, channels_last, data.train_finish
        self.data, self.batch_size = data, batch_size
        self.paths = self._openers(data, batch_size, data_workers(num_workers))  # data_workers: usable cores
        self._loaders: dict[str, Iterable] = {}
        self.choice: PipelineChoice | None = None  # set by choose() or resume(), before the first batch

    def __len__(self) -> int:
        return self.length

    # ------------------------------------------------------------------------------------ the choice
    def choose(self, info: Any) -> PipelineChoice:
        """The run's path before its first step: the only one, the forced one, or (auto) rank 0's measurement,
        broadcast; rank 0 prints the probe's line."""
        if self.choice is not None:
            return self.choice
        requested, names = getattr(self.data, "requested", "timm"), list(self.paths)
        choice = None
        if len(names) == 1:
            why = self.data.device_refused if requested == "auto" and self.data.device_refused else None
            choice = PipelineChoice(names[0], f"data.pipeline={requested}" if names[0] == requested else
                                    "only eligible path" + (f" ({why})" if why else ""))
        elif requested != "auto":
            choice = PipelineChoice(requested, f"data.pipeline={requested}")
        elif info.is_main:
            counts = self._device_counts()
            choice = decide(measure({name: lambda name=name: self.open_path(name, 0, 0) for name in names},
                                    self.device), self.device)
            self._reset_counts(counts)
            print(probe_line(choice), flush=True)
        self.choice = agreed(choice, info) if requested == "auto" and len(names) > 1 else choice
        for name in [n for n in self._loaders if n != self.choice.name]:
            del self._loaders[name]  # the other path's workers stop
        return self.choice

    def resume(self, saved: dict[str, Any] | None, saved_request: str) -> None:
        """Continue on the path a state names, without a probe (a state written before the choice was recorded:
        its data.pipeline's path)."""
        if saved is not None:
            self.choice = PipelineChoice.from_dict(saved)
        elif saved_request in self.paths:
            self.choice = PipelineChoice(saved_request, f"data.pipeline={saved_request} (the resumed state's)")
        if self.choice is not None and self.choice.name not in self.paths:
            raise ValueError(f"the resumed run trained on the {self.choice.name} data path, which this data section "
                             f"does not have (it has {', '.join(self.paths)}); resume with the run's data settings")

    def summary(self) -> dict[str, Any]:
        """summary.json's data_pipeline: the choice, and how the device path decoded its images when it ran."""
        choice = self.choice or PipelineChoice(next(iter(self.paths)), "")
        ran = "device" in self.paths and (choice.name == "device" or choice.switched is not None)
        counts = self.data.pipeline_summary() if ran else {}
        return {**counts, **choice.to_dict()}

    # ------------------------------------------------------------------------------------ the batches
    def batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        name = (self.choice or PipelineChoice(next(iter(self.paths)), "")).name
        if name == "device" and "timm" in self.paths:
            return self._falling_back(epoch, skip)
        return self.open_path(name, epoch, skip)

    def open_path(self, name: str, epoch: int, skip: int) -> Iterator[Batch]:
        """The batches of the path `name` from `skip` samples into `epoch` (no fallback: the probe, benchmarks)."""
        self.sampler.set_position(epoch, skip)
        prefetched = DevicePrefetcher(self.paths[name](), self.device, self.channels_last)
        return prefetched if name != "timm" or self.finish is None else _finished(prefetched, self.finish)

    def _falling_back(self, epoch: int, skip: int) -> Iterator[Batch]:
        """The device path's batches; after a device failure, timm's from the first batch not handed out."""
        handed = 0
        try:
            for batch in self.open_path("device", epoch, skip):
                yield batch
                handed += 1
        except Exception as e:  # not GeneratorExit: a generator closed at exit only closes
            if not is_device_failure(e):  # DEVICE_FAILURES, not the user's data's (resmlp.data.loading.choice)
                raise
            position = skip + handed * self.batch_size
            self.choice = PipelineChoice("timm", f"the device path failed in training ({error_line(e)})",
                                         self.choice.figures if self.choice else {},
                                         {"error": error_line(e), "epoch": epoch, "position": position})
            self._loaders.pop("device", None)
            print(f"data.pipeline: the device path failed at epoch {epoch + 1}, sample {position} of this "
                  f"process ({error_line(e)}); training goes on on timm's path from the same position",
                  file=sys.stderr, flush=True)
            yield from self.open_path("timm", epoch, position)

    def _openers(self, data: Any, batch_size: int, workers: int) -> dict[str, Callable[[], Iterable[Batch]]]:
        """Each path's batches, as a function of nothing (the sampler's position is already set): the primary
        path first, timm's beside a device path."""
        device, accelerator = self.device, is_accelerator(self.device)
        timm = {"timm": lambda: self._kept("timm", lambda: train_loader(data.train, self.sampler, batch_size,
                                                                         workers, accelerator))}
        if data.train_augment is not None:  # in-memory arrays, augmented where the model runs
            arrays = {data.pipeline: lambda: array_batches(data.train, self.sampler, batch_size, data.train_augment,
                                                           device=device if accelerator else None)}
            return {**arrays, **timm} if data.pipeline == "device" else arrays
        pipeline = data.train_pipeline
        if pipeline is not None:  # the device path: the workers read, the batch is decoded on the device
            return {"device": lambda: pipeline.batches(self._kept("device", lambda: pipeline.loader(
                self.sampler, batch_size, workers, device))), **timm}
        return timm

    def _kept(self, name: str, build: Callable[[], Iterable]) -> Iterable:
        if name not in self._loaders:
            self._loaders[name] = build()
        return self._loaders[name]

    def _device_counts(self) -> Counter | None:
        pipeline = self.data.train_pipeline
        return Counter(pipeline.counts) if pipeline is not None else None

    def _reset_counts(self, counts: Counter | None) -> None:
        """The device path's decode counts as before the probe: summary.json counts the trained batches."""
        if counts is not None:
            self.data.train_pipeline.counts = counts


def _finished(batches: Iterator[Batch], finish: DeviceFinish) -> Iterator[Batch]:
    """The per-image path's uint8 batches, normalised and erased on the device as each is handed out (the
    step's RNG, seeded by the trainer just before: resmlp.data.loading.finish)."""
    for images, targets, skipped in batches:
        yield finish(images), targets, skipped

"""The training split as one rank's batches: the one thing the trainer asks the data layer for.

Every data path gives its batches the same way, `TrainBatches.batches(epoch, skip)`: (images, targets, skipped)
on the training device from `skip` samples into `epoch`, the next batch copied ahead (DevicePrefetcher), the
per-image path's uint8 batches normalised and erased there (DeviceFinish). Which
path it is (in-memory arrays augmented in whole batches, the device pipeline, or a DataLoader of the per-image
transform over map records or a stream) is decided here, once, when the batches are built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

import torch

from resmlp.data.device.batch_augment import array_batches
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
    A DataLoader is built at the first epoch and kept: its workers persist across epochs."""

    def __init__(self, data: Any, seed: int, world_size: int, rank: int, repeats: int, batch_size: int,
                 num_workers: int, device: torch.device, channels_last: bool = False) -> None:
        self.sampler: ResumableSampler | StreamPosition = epoch_sampler(
            data.train, seed, world_size, rank, repeats, batch_size, num_workers)
        self.length = len(self.sampler)
        self.device, self.channels_last, self.finish = device, channels_last, data.train_finish
        self._open = self._opener(data, batch_size, data_workers(num_workers))  # data_workers: usable cores
        self._loader: Iterable | None = None

    def __len__(self) -> int:
        return self.length

    def batches(self, epoch: int, skip: int = 0) -> Iterator[Batch]:
        self.sampler.set_position(epoch, skip)
        prefetched = DevicePrefetcher(self._open(), self.device, self.channels_last)
        return prefetched if self.finish is None else _finished(prefetched, self.finish)

    def _opener(self, data: Any, batch_size: int, workers: int) -> Callable[[], Iterable[Batch]]:
        """The path's batches, as a function of nothing (the sampler's position is already set)."""
        device, accelerator = self.device, is_accelerator(self.device)
        if data.train_augment is not None:  # in-memory arrays, augmented where the model runs
            return lambda: array_batches(data.train, self.sampler, batch_size, data.train_augment,
                                         device=device if accelerator else None)
        pipeline = data.train_pipeline
        if pipeline is not None:  # data.pipeline=device: the workers read, the batch is decoded on the device
            return lambda: pipeline.batches(self._kept(lambda: pipeline.loader(self.sampler, batch_size, workers,
                                                                               device)))
        return lambda: self._kept(lambda: train_loader(data.train, self.sampler, batch_size, workers, accelerator))

    def _kept(self, build: Callable[[], Iterable]) -> Iterable:
        if self._loader is None:
            self._loader = build()
        return self._loader


def _finished(batches: Iterator[Batch], finish: DeviceFinish) -> Iterator[Batch]:
    """The per-image path's uint8 batches, normalised and erased on the device as each is handed out (the
    step's RNG, seeded by the trainer just before: resmlp.data.loading.finish)."""
    for images, targets, skipped in batches:
        yield finish(images), targets, skipped

"""The DataLoaders of the per-image path, for map-style datasets and streams alike.

A map-style dataset is ordered by ResumableSampler (its keys seed each sample's augmentation) in workers that
persist across epochs. A stream (resmlp.data.sources.streams) orders itself: its StreamPlan is set at each epoch's
start, and its workers start afresh each epoch so that they read the new plan.
"""

from __future__ import annotations

from dataclasses import replace

from torch.utils.data import DataLoader, Dataset

from resmlp.data.loading.samplers import ResumableSampler, SeededDataset, ShardSampler, collate_skipping
from resmlp.data.per_image.decoded import DecodedStream
from resmlp.data.records import StreamPlan
from resmlp.runtime import worker_ignores_stop_signals


class StreamPosition:
    """The trainer's sampler of a stream: `set_position(epoch, skip)` as ResumableSampler's; len: this rank's
    samples left in the epoch."""

    def __init__(self, stream: DecodedStream, seed: int, world_size: int, rank: int, num_workers: int,
                 batch_size: int, repeats: int = 1) -> None:
        self.stream = stream
        stream.plan = StreamPlan(seed, 0, 0, world_size, rank, num_workers, batch_size, True, max(repeats, 1))

    def set_position(self, epoch: int, skip: int = 0) -> None:
        self.stream.plan = replace(self.stream.plan, epoch=epoch, skip=skip)

    def __len__(self) -> int:
        return self.stream.records.epoch_length(self.stream.plan) - self.stream.plan.skip


def epoch_sampler(dataset: Dataset, seed: int, world_size: int, rank: int, repeats: int, batch_size: int,
                  num_workers: int) -> ResumableSampler | StreamPosition:
    """The training order of `dataset`: ResumableSampler for map-style data, StreamPosition for a stream."""
    if isinstance(dataset, DecodedStream):
        return StreamPosition(dataset, seed, world_size, rank, num_workers, batch_size, repeats)
    return ResumableSampler(dataset, seed, world_size, rank, repeats)


def train_loader(dataset: Dataset, sampler: ResumableSampler | StreamPosition, batch_size: int, num_workers: int,
                 pin_memory: bool) -> DataLoader:
    """(images, targets, skipped) batches of the training split in the sampler's order."""
    if isinstance(sampler, StreamPosition):
        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_skipping,
                          drop_last=True, pin_memory=pin_memory, worker_init_fn=worker_ignores_stop_signals)
    return DataLoader(SeededDataset(dataset), batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      collate_fn=collate_skipping, drop_last=True, pin_memory=pin_memory,
                      persistent_workers=num_workers > 0, worker_init_fn=worker_ignores_stop_signals)


def eval_loader(dataset: Dataset, batch_size: int, num_workers: int, world_size: int = 1, rank: int = 0,
                pin_memory: bool = False) -> DataLoader:
    """This rank's share of `dataset`, every record once across ranks, in (images, targets, skipped) batches."""
    if isinstance(dataset, DecodedStream):
        # a worker reads whole shards: no more workers than this rank has shards
        shards = getattr(dataset.records, "num_shards", None)
        num_workers = num_workers if shards is None else min(num_workers, -(-shards // world_size))
        dataset.plan = StreamPlan(world_size=world_size, rank=rank, num_workers=num_workers, batch_size=batch_size,
                                  train=False)
        return DataLoader(dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate_skipping,
                          pin_memory=pin_memory, worker_init_fn=worker_ignores_stop_signals)
    return DataLoader(dataset, batch_size=batch_size, sampler=ShardSampler(len(dataset), world_size, rank),
                      num_workers=num_workers, collate_fn=collate_skipping, pin_memory=pin_memory,
                      worker_init_fn=worker_ignores_stop_signals)

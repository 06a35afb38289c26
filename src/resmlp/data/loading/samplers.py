"""Samplers that make the data order a pure function of (seed, epoch, position): exact resume and DDP.

`ResumableSampler` wraps torch's DistributedSampler or timm's RepeatAugSampler (one replica when not
distributed), skips the samples already consumed in the current epoch, and hands each sample a key
(seed, epoch, global position). `SeededDataset` seeds the augmentation RNGs from that key, so a sample
gets the same augmentation whatever the number of processes, data-loader workers or restarts.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import Dataset, DistributedSampler, Sampler, default_collate

from resmlp.data.records import readable


class ResumableSampler(Sampler):
    """Per-rank indices of one epoch, as keys (seed, epoch, global position, index); see module doc."""

    def __init__(self, dataset: Dataset, seed: int, world_size: int = 1, rank: int = 0, repeats: int = 0) -> None:
        self.seed, self.world_size, self.rank = seed, world_size, rank
        if repeats > 1:
            self.inner = RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=repeats)
        else:
            self.inner = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.epoch, self.skip = 0, 0

    def set_position(self, epoch: int, skip: int = 0) -> None:
        """Start of `epoch`, leaving out its first `skip` samples of this rank (already trained on)."""
        self.epoch, self.skip = epoch, skip
        # RepeatAugSampler seeds its permutation with the epoch alone; offset it so the run seed matters too
        offset = self.seed * 100_003 if isinstance(self.inner, RepeatAugSampler) else 0
        self.inner.set_epoch(offset + epoch)

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        for pos, index in enumerate(self.inner):
            if pos >= self.skip:
                # both wrapped samplers deal the global order round-robin: rank r takes r, r + W, r + 2W...
                yield self.seed, self.epoch, pos * self.world_size + self.rank, index

    def __len__(self) -> int:
        return len(self.inner) - self.skip


class ShardSampler(Sampler):
    """Every index exactly once across ranks (no padding), for evaluation whose counts are summed."""

    def __init__(self, size: int, world_size: int = 1, rank: int = 0) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class SeededDataset(Dataset):
    """Wraps a dataset: item `key` from ResumableSampler seeds python/numpy/torch RNGs, then loads."""

    def __init__(self, base: Dataset) -> None:
        self.base = base

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, key: tuple[int, int, int, int]):
        seed = sample_seed(key)
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)  # CPU only: torch.manual_seed also seeds GPUs, slowly
        return self.base[key[3]]


def sample_seed(key: tuple[int, int, int, int]) -> int:
    """The augmentation seed of a sampler key (seed, epoch, global position, index)."""
    seed, epoch, position, _ = key
    return hash((seed, epoch, position)) & 0x7FFF_FFFF  # tuples of ints hash deterministically


def collate_skipping(batch: list) -> tuple[torch.Tensor, torch.Tensor, int]:
    """default_collate of the readable samples, plus how many were dropped as unreadable (None)."""
    good = readable(batch)
    images, targets = default_collate(good)
    return images, targets, len(batch) - len(good)

"""Samplers that make the data order a pure function of (seed, epoch, position): exact resume and DDP.

`ResumableSampler` wraps torch's DistributedSampler or timm's RepeatAugSampler (one replica when not
distributed), skips the samples already consumed in the current epoch, and hands each sample a key
(seed, epoch, global position). `SeededDataset` seeds the augmentation RNGs from that key, so a sample
gets the same augmentation whatever the number of processes, data-loader workers or restarts.

Repeated augmentation: timm's RepeatAugSampler (DeiT's RASampler) puts the copies of an image side by side in
its global order and deals them to consecutive ranks, so on DeiT's 8+ GPUs they land in one step on different
GPUs; on one or two processes they would share a batch, and with it one Mixup lambda, one CutMix box and mostly
one partner. `spread_copies` reorders the epoch's global order (the same images, each as often) so that copies
stand far apart, then the ranks take it round-robin: no batch holds two copies on any number of processes (for
global batches up to half the epoch's distinct images), and the global order is the same for every process
count, so a run resumes at another count. The price: on 8 GPUs the copies fall in different steps, not one.
The first author says the placement across GPUs matters for BatchNorm only ("with the layer-norm it should
have no impact", facebookresearch/deit#95); ResMLP has no BatchNorm.
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
        # repeated augmentation: the global order (timm's, one replica) spread, then dealt (see the module doc)
        self.global_order = RepeatAugSampler(dataset, num_replicas=1, rank=0, num_repeats=repeats) \
            if repeats > 1 else None

    def set_position(self, epoch: int, skip: int = 0) -> None:
        """Start of `epoch`, leaving out its first `skip` samples of this rank (already trained on)."""
        self.epoch, self.skip = epoch, skip
        # RepeatAugSampler seeds its permutation with the epoch alone; offset it so the run seed matters too
        offset = self.seed * 100_003 if isinstance(self.inner, RepeatAugSampler) else 0
        self.inner.set_epoch(offset + epoch)
        if self.global_order is not None:
            self.global_order.set_epoch(offset + epoch)

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        order = self.inner
        if self.global_order is not None:
            spread = spread_copies(list(self.global_order), hash((self.seed, self.epoch)))
            order = spread[self.rank::self.world_size][:len(self.inner)]
        for pos, index in enumerate(order):
            if pos >= self.skip:
                # both wrapped samplers deal the global order round-robin: rank r takes r, r + W, r + 2W...
                yield self.seed, self.epoch, pos * self.world_size + self.rank, index

    def __len__(self) -> int:
        return len(self.inner) - self.skip


def spread_copies(indices: list[int], seed: int) -> list[int]:
    """The same indices, as often, ordered so that copies of one index are far apart: block k holds every
    index's (k+1)-th copy, in a seeded order. The first block keeps the given (shuffled) order and its first half
    H1 opens every later block too (H1 first, then the rest, each part permuted): a batch crossing from one block
    into the next takes the tail of one (not H1) and the head of the next (H1), so a batch of at most half a block
    never holds two copies of an index."""
    generator = torch.Generator().manual_seed(seed & 0x7FFF_FFFF_FFFF_FFFF)
    copies: dict[int, int] = {}
    blocks: list[list[int]] = []
    for index in indices:
        k = copies.get(index, 0)
        copies[index] = k + 1
        if k == len(blocks):
            blocks.append([])
        blocks[k].append(index)
    head = set(blocks[0][: (len(blocks[0]) + 1) // 2]) if blocks else set()
    order = list(blocks[0]) if blocks else []
    for block in blocks[1:]:
        for part in ([i for i in block if i in head], [i for i in block if i not in head]):
            order.extend(part[j] for j in torch.randperm(len(part), generator=generator).tolist())
    return order


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

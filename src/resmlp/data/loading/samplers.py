"""Samplers that make the data order a pure function of (seed, epoch, position): exact resume and DDP.

`ResumableSampler` wraps torch's DistributedSampler or timm's RepeatAugSampler (one replica when not
distributed), skips the samples already consumed in the current epoch, and hands each sample a key
(seed, epoch, global position). `SeededDataset` seeds the augmentation RNGs from that key, so a sample
gets the same augmentation whatever the number of processes, data-loader workers or restarts.

Repeated augmentation (DeiT's RASampler, timm's RepeatAugSampler): timm puts the R copies of an image side by
side in its global order (each epoch the first ~N positions of the shuffled images repeated R times: a third of
the images at R=3, each three times) and deals the order round-robin to the ranks. With at least as many
processes as repeats (DeiT's 8+ GPUs) the copies land in the same step on R different processes: that placement
is kept exactly (`SAME_STEP`: rank r gets timm's indices, padded as timm pads, by wrapping). With fewer processes
than repeats the adjacent copies would share one process's batch, and with it one Mixup lambda, one CutMix box
and mostly one partner (Hoffer et al.'s repeated augmentation puts the copies in one batch of one BatchNorm
model; DeiT never ran them inside one process's batch), so `spread_copies` reorders the same selected positions
to keep copies out of one batch (`SPREAD`). Either order is a function of (seed, epoch, placement) and global
positions are dealt round-robin, so a resume at another process count continues the epoch exactly: the epoch in
progress keeps the placement it started with (recorded in the training state), later epochs take the new count's.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import torch
from timm.data.distributed_sampler import RepeatAugSampler
from torch.utils.data import Dataset, DistributedSampler, Sampler, default_collate

from resmlp.data.records import readable

SAME_STEP, SPREAD = "same-step", "spread"  # the two placements of repeated copies (module doc)


def repeat_placement(repeats: int, world_size: int) -> str | None:
    """Where the copies of an image go: in one step on different processes when there are at least as many
    processes as repeats (DeiT's), else spread out of any one batch; None without repeated augmentation."""
    if repeats <= 1:
        return None
    return SAME_STEP if world_size >= repeats else SPREAD


class ResumableSampler(Sampler):
    """Per-rank indices of one epoch, as keys (seed, epoch, global position, index); see module doc."""

    def __init__(self, dataset: Dataset, seed: int, world_size: int = 1, rank: int = 0, repeats: int = 0) -> None:
        self.seed, self.world_size, self.rank = seed, world_size, rank
        if repeats > 1:
            # timm's per-rank count (its rounding and padding), the number of samples this rank deals
            self.inner = RepeatAugSampler(dataset, num_replicas=world_size, rank=rank, num_repeats=repeats)
        else:
            self.inner = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        self.epoch, self.skip = 0, 0
        self.placement = repeat_placement(repeats, world_size)
        self.resumed_placement: tuple[int, str] | None = None  # (epoch, placement) of a resumed epoch
        if repeats > 1:
            # the global orders (one replica): every image repeated (timm's whole sequence: selected_round=0 and
            # a ratio of 1/R select all of it), and timm's selection of one epoch, which SPREAD reorders
            self.every_copy = RepeatAugSampler(dataset, num_replicas=1, rank=0, num_repeats=repeats,
                                               selected_round=0, selected_ratio=1 / repeats)
            self.selected = RepeatAugSampler(dataset, num_replicas=1, rank=0, num_repeats=repeats)

    def set_position(self, epoch: int, skip: int = 0) -> None:
        """Start of `epoch`, leaving out its first `skip` samples of this rank (already trained on)."""
        self.epoch, self.skip = epoch, skip
        # RepeatAugSampler seeds its permutation with the epoch alone; offset it so the run seed matters too
        offset = self.seed * 100_003 if isinstance(self.inner, RepeatAugSampler) else 0
        self.inner.set_epoch(offset + epoch)
        if self.placement is not None:
            self.every_copy.set_epoch(offset + epoch)
            self.selected.set_epoch(offset + epoch)

    def placement_of(self, epoch: int) -> str | None:
        """The placement of `epoch`'s copies: a resumed epoch keeps the one it started with."""
        if self.resumed_placement is not None and self.resumed_placement[0] == epoch:
            return self.resumed_placement[1]
        return self.placement

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        placement = self.placement_of(self.epoch)
        if placement is None:  # torch's DistributedSampler deals round-robin: rank r's share is at r, r + W, ...
            keyed = ((pos * self.world_size + self.rank, index) for pos, index in enumerate(self.inner))
        else:
            order = list(self.every_copy) if placement == SAME_STEP else \
                spread_copies(list(self.selected), hash((self.seed, self.epoch)))
            positions = range(self.rank, len(self.inner) * self.world_size, self.world_size)
            keyed = ((position, order[position % len(order)]) for position in positions)  # timm pads by wrapping
        for pos, (position, index) in enumerate(keyed):
            if pos >= self.skip:
                yield self.seed, self.epoch, position, index

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

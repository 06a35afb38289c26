"""Streams of records read shard by shard (WebDataset tars, a streamed Hugging Face dataset): how they split
across DDP ranks and DataLoader workers, shuffle, and resume.

The contract, for a training pass (StreamPlan.train):
- Each epoch, the shard order is a permutation seeded by (seed, epoch); with W ranks x K workers = S slots,
  slot s = rank * K + worker reads the shards at positions s, s + S, s + 2S... of that order. No shard, so no
  sample, is read twice in an epoch. The records of a slot pass through webdataset's shuffle buffer, seeded
  by (seed, epoch, slot).
- Every worker yields the same number of whole batches, Q = (the fewest records any slot can get) // batch,
  so the DataLoader's round-robin over workers is fixed and every rank takes the same number of steps. The
  records of a slot past Q batches are left out of that epoch (at most one shard's worth where the shards
  are of equal size; `resmlp data shards` writes them so); a slot whose shards end early (a damaged shard)
  fills its batches with Unreadable records, skipped and counted like unreadable files.
- Q comes from the shard index's record counts (index.json) or, without one, from data.epoch_length.
- Resume mid-epoch: the stream of a slot is a pure function of (seed, epoch, slot), so a worker skips the
  records of its batches the run already trained on (read, not decoded) and continues: no record repeated,
  none skipped, provided the resumed run has the same number of processes, data.num_workers and batch size
  (the position is counted in batches of this layout; resmlp.train.state refuses a resume with another).
- Repeated augmentation (data.repeated_aug = R, DeiT's RASampler): each record comes R times in a row into
  the shuffle buffer, each copy with its own augmentation seed, and an epoch is as long as without it: it
  sees 1/R of the records, as RASampler's epoch does (the shards read are the first 1/R of the slot's).
An evaluation pass reads the shards in order, S-way split, every record exactly once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import get_worker_info

from resmlp.data.records import Key, Payload, StreamPlan, StreamRecords, Unreadable, optional_module
from resmlp.errors import DataError

SHUFFLE_BUFFER = 1000  # records held by each worker's shuffle buffer (webdataset's default)


class ShardedRecords(StreamRecords):
    """Records stored in shards; subclasses implement `read_shard(i)` -> (name, payload, label) records."""

    def __init__(self, num_shards: int, counts: Sequence[int] | None, class_names: Sequence[str],
                 length: int | None, what: str) -> None:
        self.num_shards, self.counts, self.length, self.what = num_shards, counts, length, what
        self.class_names = list(class_names)
        self.shuffle_buffer = SHUFFLE_BUFFER

    def read_shard(self, index: int) -> Iterator[tuple[str, Payload, int]]:
        raise NotImplementedError

    def fingerprint(self) -> str | None:
        """A digest of the shards as they are now (resmlp.train.state refuses a mid-epoch resume over other
        shards); None where they can't be told apart."""
        return None

    def __len__(self) -> int:
        if self.counts is not None:
            return int(sum(self.counts))
        if self.length is None:
            raise DataError(f"{self.what}: the number of records is unknown (no index.json); give it with "
                            "--set data.epoch_length=N")
        return self.length

    def _slots(self, plan: StreamPlan) -> int:
        slots = plan.world_size * max(plan.num_workers, 1)
        if self.num_shards < slots:
            raise DataError(f"{self.what} has {self.num_shards} shard(s) for {plan.world_size} process(es) x "
                            f"{max(plan.num_workers, 1)} worker(s): each worker reads whole shards, so it needs at "
                            "least one; write more, smaller shards (--shard-size) or lower data.num_workers")
        return slots

    def batches_per_worker(self, plan: StreamPlan) -> int:
        """Q of the module doc: the whole batches every worker of every rank yields in a training epoch."""
        slots = self._slots(plan)
        if self.counts is not None:
            fewest = int(np.sort(np.asarray(self.counts))[: self.num_shards // slots].sum())
        else:
            fewest = len(self) // slots
        return fewest // plan.batch_size

    def epoch_length(self, plan: StreamPlan) -> int:
        return self.batches_per_worker(plan) * plan.batch_size * max(plan.num_workers, 1)

    def samples(self, plan: StreamPlan) -> Iterator[tuple[Key, Payload, int]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if workers != max(plan.num_workers, 1):
            raise RuntimeError(f"the stream was planned for {plan.num_workers} workers but runs in {workers}")
        consumed = plan.skip // plan.batch_size if plan.train else 0  # this rank's batches already trained on
        # the DataLoader takes batches from workers 0, 1, 2... in turn from its start: after `consumed` batches,
        # worker 0 plays the part of the worker whose batch came next
        role = (worker + consumed) % workers
        if not plan.train:  # every record once: a slot past the shards reads none
            slots, slot = plan.world_size * workers, plan.rank * workers + worker
            for position, record in enumerate(self._records(range(slot, self.num_shards, slots))):
                yield (plan.seed, plan.epoch, position, record[0]), record[1], record[2]
            return
        slots, slot = self._slots(plan), plan.rank * workers + role
        order = np.random.default_rng([plan.seed, plan.epoch]).permutation(self.num_shards)
        records = self._records(order[slot::slots])
        if plan.repeats > 1:  # as RASampler: each record `repeats` times (augmented apart), 1/repeats of them
            records = (record for record in records for _ in range(plan.repeats))
        rng = random.Random(hash((plan.seed, plan.epoch, slot)))
        shuffle = optional_module("webdataset").filters.shuffle
        records = shuffle(self.shuffle_buffer, min(100, self.shuffle_buffer), rng=rng)(records)
        batch, quota = plan.batch_size, self.batches_per_worker(plan) * plan.batch_size
        skip = max(0, math.ceil((consumed - role) / workers)) * batch  # this role's share of them
        for j in range(quota):
            name, payload, label = next(records, None) or (f"{self.what} (slot {slot})", Unreadable(
                "its shards ended before the epoch's share (a damaged shard?)"), -1)
            if j >= skip:
                position = ((j // batch) * workers + role) * batch + j % batch  # in this rank's order
                yield (plan.seed, plan.epoch, position * plan.world_size + plan.rank, name), payload, label

    def _records(self, shards: Sequence[int]) -> Iterator[tuple[str, Payload, int]]:
        for index in shards:
            yield from self.read_shard(int(index))


def checked_label(label: object, num_classes: int) -> int | Unreadable:
    """A record's label as an int in [0, num_classes), or why not (Unreadable)."""
    if isinstance(label, bool) or not isinstance(label, (int, np.integer)):
        return Unreadable(f"its label {label!r:.40} is not a class index")
    if not 0 <= int(label) < num_classes:
        return Unreadable(f"its label {int(label)} is outside [0, {num_classes}) (the {num_classes} classes)")
    return int(label)

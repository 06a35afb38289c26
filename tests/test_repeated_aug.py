"""Repeated augmentation as DeiT ran it: an image's copies in one step on different processes where there are at
least as many processes as repeats, kept out of one process's batch below that; every rank deals exactly what it
counts on every (images, repeats, processes); a resume at another process count continues the epoch exactly."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from hostspeed import limit
from timm.data.distributed_sampler import RepeatAugSampler

from resmlp.data.loading.samplers import SAME_STEP, SPREAD, ResumableSampler, repeat_placement

SEED = 3


def _shares(images: int, repeats: int, world: int, epoch: int = 1) -> list[list[tuple[int, int, int, int]]]:
    shares = []
    for rank in range(world):
        sampler = ResumableSampler(list(range(images)), seed=SEED, world_size=world, rank=rank, repeats=repeats)
        sampler.set_position(epoch)
        keys = list(sampler)
        assert len(keys) == len(sampler), (images, repeats, world, rank)
        shares.append(keys)
    return shares


def _timm_share(images: int, repeats: int, world: int, rank: int, epoch: int = 1) -> list[int]:
    sampler = RepeatAugSampler(list(range(images)), num_replicas=world, rank=rank, num_repeats=repeats)
    sampler.set_epoch(SEED * 100_003 + epoch)  # the run seed offsets timm's epoch seed (samplers.py)
    return list(sampler)


@pytest.mark.parametrize("repeats", [2, 3, 4])
def test_every_rank_deals_what_it_counts_on_every_grid_point(repeats):
    """The crash the attacker found (StopIteration on rank 1 with 255 images on 2 processes): a rank's share must
    have exactly timm's count, padded as timm pads, for every size, including those timm rounds up."""
    for images, world in itertools.product([1, 2, 5, 31, 100, 254, 255, 256, 257, 511, 600], range(1, 9)):
        shares = _shares(images, repeats, world)
        for rank, keys in enumerate(shares):
            timm = _timm_share(images, repeats, world, rank)
            assert len(keys) == len(timm), (images, repeats, world, rank)
            if world >= repeats:  # DeiT's placement: timm's very indices, rank by rank
                assert [key[3] for key in keys] == timm, (images, repeats, world, rank)
        positions = sorted(key[2] for keys in shares for key in keys)
        assert positions == list(range(len(positions))), (images, repeats, world)  # global positions, each once


def test_placement_rule():
    assert repeat_placement(0, 8) is None and repeat_placement(1, 8) is None
    assert repeat_placement(3, 3) == SAME_STEP and repeat_placement(3, 8) == SAME_STEP
    assert repeat_placement(3, 1) == SPREAD and repeat_placement(3, 2) == SPREAD


def _copies_in_one_step(shares: list[list[tuple[int, int, int, int]]], micro_batch: int) -> tuple[int, int]:
    """(images whose every copy lies in one step on distinct processes, images seen) over an epoch."""
    where = defaultdict(list)  # image -> (step, rank) of each copy
    for rank, keys in enumerate(shares):
        for pos, key in enumerate(keys):
            where[key[3]].append((pos // micro_batch, rank))
    together = sum(1 for places in where.values()
                   if len({step for step, _ in places}) == 1 and len({rank for _, rank in places}) == len(places))
    return together, len(where)


def test_the_experts_measurement_gives_deits_placement_on_8_processes():
    """DeiT on 8 GPUs (RASampler, 3 repeats): an image's copies in the same step on 3 GPUs for all but the images
    cut by a step boundary (the expert measured 1,016 of 1,024). Ours must do the same, as timm's sampler does."""
    images, repeats, world, micro_batch = 3072, 3, 8, 16
    shares = _shares(images, repeats, world)
    timm = [[(0, 0, 0, index) for index in _timm_share(images, repeats, world, rank)] for rank in range(world)]
    ours, seen = _copies_in_one_step(shares, micro_batch)
    assert (ours, seen) == _copies_in_one_step(timm, micro_batch)
    assert seen == 1024 and ours >= 0.97 * seen


@pytest.mark.parametrize("world", [1, 2])
def test_below_the_repeats_no_batch_holds_two_copies(world):
    images, repeats, global_batch = 192, 3, 32  # global batches up to half the epoch's distinct images
    for rank, keys in enumerate(_shares(images, repeats, world)):
        order, batch = [key[3] for key in keys], global_batch // world
        for start in range(0, len(order) - batch + 1, batch):
            chunk = order[start:start + batch]
            assert len(set(chunk)) == len(chunk), (world, rank, start)


def _global_order(shares: list[list[tuple[int, int, int, int]]]) -> dict[int, int]:
    return {key[2]: key[3] for keys in shares for key in keys}


@pytest.mark.parametrize(("before", "after"), [(4, 2), (2, 4), (8, 1)])
def test_a_resume_at_another_process_count_finishes_the_epoch_exactly(before, after):
    """The epoch in progress keeps its placement (the training state records it), so the images not yet trained
    on are the same at the new count; the next epoch takes the new count's placement."""
    images, repeats, global_batch, steps_done = 256, 3, 16, 5
    original = _global_order(_shares(images, repeats, before))
    consumed = steps_done * global_batch
    resumed = {}
    for rank in range(after):
        sampler = ResumableSampler(list(range(images)), seed=SEED, world_size=after, rank=rank, repeats=repeats)
        sampler.resumed_placement = (1, repeat_placement(repeats, before))
        sampler.set_position(1, skip=consumed // after)
        resumed.update({key[2]: key[3] for key in sampler})
        sampler.set_position(2)
        assert sampler.placement_of(2) == repeat_placement(repeats, after)
    assert resumed == {pos: index for pos, index in original.items() if pos >= consumed}


def test_two_processes_train_with_repeats_on_255_images(tmp_path):
    """timm rounds the per-rank share of 255 images up to 128: both ranks must deal 128 (the crash: rank 1 ran out
    at 127 and rank 0 waited on a dead gloo pair)."""
    overrides = {
        "data.kind": "synthetic", "data.synthetic_size": [255, 16], "data.num_workers": 0, "data.repeated_aug": 3,
        "model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 1,
        "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.progress": False,
        "train.amp": "none", "train.threads": 1, "train.device": "cpu", "train.compile": False,
    }
    sets = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={json.dumps(v)}")]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train",
                           "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "run"), *sets],
                          capture_output=True, text=True, timeout=limit(600))
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2


def test_the_training_state_carries_the_placement_of_the_epoch_in_progress(tmp_path):
    """snapshot records the placement, and a mid-epoch restore at another count hands it back to the sampler
    (an epoch boundary does not: the next epoch takes the new count's)."""
    from types import SimpleNamespace

    from resmlp.errors import CheckpointError
    from resmlp.train.state import _repeat_placement, keep_repeat_placement

    def trainer(world: int, epoch: int) -> SimpleNamespace:
        sampler = ResumableSampler(list(range(64)), seed=SEED, world_size=world, rank=0, repeats=3)
        return SimpleNamespace(sampler=sampler, epoch=epoch, state_path=tmp_path / "last.pth")

    saved = _repeat_placement(trainer(4, 1))
    assert saved == SAME_STEP
    back = trainer(1, 1)
    keep_repeat_placement(back, {"repeat_placement": saved, "epoch": 1, "step_in_epoch": 2})
    assert back.sampler.placement_of(1) == SAME_STEP and back.sampler.placement_of(2) == SPREAD
    fresh = trainer(1, 2)
    keep_repeat_placement(fresh, {"repeat_placement": saved, "epoch": 2, "step_in_epoch": 0})
    assert fresh.sampler.placement_of(2) == SPREAD
    with pytest.raises(CheckpointError, match="repeat_placement must be"):
        keep_repeat_placement(trainer(1, 1), {"repeat_placement": "elsewhere", "epoch": 1, "step_in_epoch": 2})

"""schedule.step_on: epoch steps the learning rate as DeiT's main.py does (issue 57 item 2).

DeiT builds timm's scheduler with `create_scheduler(args, optimizer)` and calls `lr_scheduler.step(epoch)` once
after training epoch `epoch` (main.py's training loop): epoch 0 runs entirely at --warmup-lr, epoch e >= 1 at the
scheduler's value for e - 1. The reference below is timm's own scheduler driven exactly so; ours must give the same
lr at every update of every epoch, after a resume too, and the DeiT recipes must ask for it.
"""

from __future__ import annotations

import argparse
import csv

import pytest
import torch
from safetensors.torch import load_file
from timm.scheduler import create_scheduler

from resmlp.train import train
from resmlp.train.config import load_config
from resmlp.train.sections import ScheduleConfig
from resmlp.train.step import lr_scheduler, schedule_to

EPOCHS, WARMUP, STEPS = 12, 3, 5


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def deit_lrs(lr: float, epochs: int, warmup: int, warmup_lr: float, min_lr: float) -> list[float]:
    """The lr of each epoch of DeiT's main.py: timm.scheduler.create_scheduler with DeiT's argument defaults,
    `lr_scheduler.step(epoch)` after each epoch."""
    args = argparse.Namespace(sched="cosine", epochs=epochs, lr_noise=None, lr_noise_pct=0.67, lr_noise_std=1.0,
                              warmup_lr=warmup_lr, min_lr=min_lr, decay_epochs=30, warmup_epochs=warmup,
                              cooldown_epochs=10, patience_epochs=10, decay_rate=0.1, seed=42)
    optimizer = _optimizer(lr)
    scheduler, _ = create_scheduler(args, optimizer)
    lrs = []
    for epoch in range(epochs):
        lrs.append(optimizer.param_groups[0]["lr"])  # train_one_epoch runs at this lr throughout
        scheduler.step(epoch)
    return lrs


def ours(lr: float, s: ScheduleConfig, start_epoch: int = 0) -> list[list[float]]:
    """The lr at every update of every epoch from `start_epoch` (a resume there: a rebuilt scheduler)."""
    optimizer = _optimizer(lr)
    scheduler = lr_scheduler(optimizer, s, STEPS)
    schedule_to(scheduler, s, start_epoch * STEPS, start_epoch)  # resmlp.train.state.restore does this
    per_epoch = []
    for epoch in range(start_epoch, s.epochs):
        seen = []
        for step in range(STEPS):
            seen.append(optimizer.param_groups[0]["lr"])
            scheduler.step_update(epoch * STEPS + step + 1)  # what the trainer calls after each update
        per_epoch.append(seen)
        schedule_to(scheduler, s, (epoch + 1) * STEPS, epoch + 1)  # what the trainer calls at each epoch's end
    return per_epoch


def test_step_on_epoch_matches_timm_stepped_as_deit_main_py():
    s = ScheduleConfig(name="cosine", epochs=EPOCHS, warmup_epochs=WARMUP, warmup_lr=1e-6, min_lr=1e-5,
                       step_on="epoch")
    reference = deit_lrs(5e-3, EPOCHS, WARMUP, 1e-6, 1e-5)
    got = ours(5e-3, s)
    for epoch, (want, seen) in enumerate(zip(reference, got, strict=True)):
        assert seen == pytest.approx([want] * STEPS, rel=1e-12), f"epoch {epoch}"
    assert got[0] == [1e-6] * STEPS  # epoch 0 entirely at the warm-up lr
    assert max(reference) < 5e-3  # DeiT's step(epoch) lags one epoch: the peak lr itself is never used


@pytest.mark.parametrize("start", [1, 4, 9])
def test_step_on_epoch_resumes_exactly(start):
    s = ScheduleConfig(epochs=EPOCHS, warmup_epochs=WARMUP, step_on="epoch")
    assert ours(5e-3, s, start) == ours(5e-3, s)[start:]


def test_step_on_update_still_ramps_per_update():
    s = ScheduleConfig(epochs=EPOCHS, warmup_epochs=WARMUP, step_on="update")
    first = ours(5e-3, s)[0]
    assert len(set(first)) == STEPS and first == sorted(first)  # a warm-up ramp within epoch 0
    assert ours(5e-3, s, 4) == ours(5e-3, s)[4:]


@pytest.mark.parametrize("recipe", ["deit", "deit-distill", "cifar-finetune"])
def test_the_deit_recipes_step_on_epochs(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr("resmlp.runtime.physical_memory_bytes", lambda: 2**40)
    assert load_config(recipe, {"data.dir": str(tmp_path)}).schedule.step_on == "epoch"


def test_a_bad_step_on_is_one_line():
    with pytest.raises(ValueError, match="schedule.step_on: 'batch' is not one of update, epoch"):
        load_config("fashion-mnist-quick", {"schedule.step_on": "batch"})


def test_a_training_run_records_deit_lrs_and_resumes_exactly(tmp_path):
    overrides = {"data.kind": "synthetic", "data.synthetic_size": [32, 16], "data.num_workers": 0,
                 "model.img_size": 8, "model.patch_size": 4, "model.dim": 16, "model.depth": 1,
                 "schedule.epochs": 4, "schedule.warmup_epochs": 2, "schedule.warmup_lr": 1e-4,
                 "schedule.min_lr": 1e-5, "schedule.step_on": "epoch", "optim.lr": 1e-2, "optim.name": "adamw",
                 "train.batch_size": 8, "train.progress": False, "train.threads": 1, "train.compile": False,
                 "train.deterministic": True, "train.amp": "none"}
    train("fashion-mnist-quick", tmp_path / "whole", overrides=overrides)
    train("fashion-mnist-quick", tmp_path / "resumed", overrides=overrides, max_steps=6)  # 4 steps per epoch
    train("fashion-mnist-quick", tmp_path / "resumed", overrides=overrides, resume=True)

    def lrs(run: str) -> list[float]:
        with open(tmp_path / run / "metrics.csv", newline="") as f:
            return [float(row["lr"]) for row in csv.DictReader(f)]

    assert lrs("whole") == pytest.approx(deit_lrs(1e-2, 4, 2, 1e-4, 1e-5), rel=1e-9)
    assert lrs("resumed") == lrs("whole")
    whole, resumed = (load_file(tmp_path / run / "last.safetensors") for run in ("whole", "resumed"))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


def test_a_run_saved_before_step_on_existed_resumes_and_a_changed_one_is_refused():
    import copy

    from resmlp.train.state import check_resumable

    now = load_config("fashion-mnist-quick").to_dict()
    saved = copy.deepcopy(now)
    del saved["schedule"]["step_on"]  # a config.json written before the key existed: it stepped per update
    check_resumable("last.pth", saved, now)
    now["schedule"]["step_on"] = "epoch"
    with pytest.raises(ValueError, match="schedule.step_on: was None, now 'epoch'"):
        check_resumable("last.pth", saved, now)

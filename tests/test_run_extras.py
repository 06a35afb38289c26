"""Issue 50 item 9: --max-steps counted in compile auto's estimate, WANDB_DIR respected, an ETA in plain log
lines."""

from __future__ import annotations

import io
import sys
import types

import torch

from resmlp.progress import LineProgress
from resmlp.train.step import TIMED_STEPS, CompileChoice


def _decide(choice: CompileChoice, monkeypatch, remaining: int) -> bool | None:
    """Run the eager steps auto times at 0.5 s each, with `remaining` steps to the schedule's end."""
    clock = {"now": 0.0}
    monkeypatch.setattr("resmlp.train.step.time.perf_counter", lambda: clock["now"])
    decision = None
    for step in range(1, 2 + TIMED_STEPS + 1):
        clock["now"] += 0.5
        decision = choice.after_step(remaining - step, lambda: None, global_step=step)
        if decision is not None:
            return decision
    return decision


def test_compile_auto_counts_the_steps_max_steps_leaves(monkeypatch):
    """1000 steps at 0.5 s pay for compiling; a 12-step smoke run (--max-steps 12) of the same schedule does not."""
    assert _decide(CompileChoice("auto", torch.device("cpu")), monkeypatch, 1000) is True
    limited = CompileChoice("auto", torch.device("cpu"), step_limit=12)
    assert _decide(limited, monkeypatch, 1000) is False
    assert "--max-steps 12" in limited.reason and "4 steps left" in limited.reason


def test_wandb_writes_where_wandb_dir_says(tmp_path, monkeypatch):
    from resmlp.reporting import WandbLog

    calls = []
    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: calls.append(kwargs)
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    WandbLog("p", "n", {}, tmp_path / "run")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    WandbLog("p", "n", {}, tmp_path / "run")
    assert [call["dir"] for call in calls] == [str(tmp_path / "run"), str(tmp_path / "wandb")]


def test_plain_lines_carry_the_eta_at_this_runs_rate(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr("resmlp.progress.time.perf_counter", lambda: clock["now"])
    log = io.StringIO()
    bar = LineProgress(total=400, initial=100, desc="epoch 2/4", unit="step", file=log, min_interval_s=0)
    clock["now"] += 50.0
    bar.update(100)  # 100 steps in 50 s (the 100 resumed ones are not this run's): 2 steps/s, 200 steps left
    bar.set_postfix(loss="0.5")
    clock["now"] += 50.0
    bar.update(200)
    bar.close()
    first, last = log.getvalue().splitlines()
    assert first.endswith(", 2 step/s, ETA 01:40"), first
    assert "ETA" not in last  # done: nothing left to estimate


def test_the_trainer_hands_max_steps_and_its_step_count_to_compile_auto(tmp_path, monkeypatch):
    from resmlp.train import train
    from resmlp.train import trainer as trainer_module

    seen = []

    class Recording(CompileChoice):
        def after_step(self, remaining_steps, sync, global_step=0):
            seen.append((self.step_limit, remaining_steps, global_step))
            return super().after_step(remaining_steps, sync, global_step)

    monkeypatch.setattr(trainer_module, "CompileChoice", Recording)
    overrides = {"data.kind": "synthetic", "data.synthetic_size": [64, 16], "data.num_workers": 0,
                 "model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1,
                 "schedule.epochs": 50, "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.threads": 1,
                 "train.progress": False, "train.compile": "auto"}
    train("fashion-mnist-quick", tmp_path / "run", overrides=overrides, max_steps=4)
    assert [(limit, step) for limit, _, step in seen] == [(4, 1), (4, 2), (4, 3), (4, 4)]
    assert seen[0][1] > 100  # the schedule's steps left: the limit is applied inside CompileChoice

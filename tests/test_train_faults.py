"""A run owns its output folder, and nothing after the resumable state can lose an epoch."""

from __future__ import annotations

import errno
import json

import pytest
import torch

from resmlp import reporting
from resmlp.errors import OutputError
from resmlp.fileio import RunLock
from resmlp.train import train

TINY = {
    "data.kind": "synthetic", "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0],
    "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16, "model.patch_size": 4, "model.dim": 16,
    "model.depth": 1, "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 16,
    "train.progress": False, "data.synthetic_size": [64, 32], "train.threads": 1, "train.compile": False,
}


def test_a_second_run_on_a_held_folder_fails_naming_the_holder(tmp_path):
    held = RunLock(tmp_path / "run")  # another run holds the folder
    with held, pytest.raises(OutputError, match=r"in use by another run \(pid"):
        train("fashion-mnist-quick", tmp_path / "run", TINY)
    assert not (tmp_path / "run" / "last.pth").exists()
    train("fashion-mnist-quick", tmp_path / "run", TINY)  # released: the folder is free again


def test_a_failing_side_output_warns_and_the_run_finishes(tmp_path, monkeypatch):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(reporting, "plot_learning_curves", full_disk)
    with pytest.warns(UserWarning, match="could not write learning_curves.png.*training goes on"):
        summary = train("fashion-mnist-quick", tmp_path / "run", TINY)
    assert summary["epochs"] == 2 and json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 2


def test_a_full_disk_at_the_state_stops_the_run_with_the_last_good_state_intact(tmp_path, monkeypatch):
    from resmlp.train import state

    out = tmp_path / "run"
    train("fashion-mnist-quick", out, {**TINY, "schedule.epochs": 1})
    before = torch.load(out / "last.pth", weights_only=True)
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)  # the temporary is written, then the disk fills
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(state.torch, "save", full_disk)
    with pytest.raises(OSError, match="No space left"):
        train("fashion-mnist-quick", out, {**TINY, "schedule.epochs": 2}, resume=True)  # extends the run
    monkeypatch.undo()
    after = torch.load(out / "last.pth", weights_only=True)
    assert after["epoch"] == before["epoch"] == 1  # the previous state, whole
    assert not [p for p in out.iterdir() if p.name.startswith(".last.pth")]  # no temporary left behind


def test_resume_extends_a_finished_run_and_may_lower_the_learning_rate(tmp_path):
    out = tmp_path / "run"
    first = train("fashion-mnist-quick", out, {**TINY, "schedule.epochs": 1})
    assert first["epochs"] == 1
    more = train("fashion-mnist-quick", out, {**TINY, "schedule.epochs": 3, "optim.lr": 1e-4}, resume=True)
    assert more["epochs"] == 3 and more["lr"] == pytest.approx(1e-4)
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 4  # header + 3 epochs, the first one kept from the finished run


def test_weights_broken_by_the_last_step_stop_the_run_before_they_are_saved(tmp_path):
    """A last update that leaves NaN weights has no later loss to show it: the epoch's end must catch it."""
    from resmlp.train import NonFiniteLossError
    from resmlp.train.config import load_config
    from resmlp.train.tasks import SupervisedTask

    class BreakTheWeights(SupervisedTask):
        def after_optimizer_step(self, trainer):
            if trainer.global_step == 3:  # the epoch's 4th and last step
                with torch.no_grad():
                    next(trainer.model.parameters()).view(-1)[0] = float("nan")

    cfg = load_config("fashion-mnist-quick", {**TINY, "schedule.epochs": 1})
    with pytest.raises(NonFiniteLossError, match="weights became NaN"):
        train(cfg, tmp_path / "run", task=BreakTheWeights(cfg))
    assert not (tmp_path / "run" / "best.safetensors").exists()


class _Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (not an Exception: no handler of the run catches it)."""


# in the order of the writes: the state right after the checkpoints it vouches for, then the slow side outputs
END_OF_EPOCH_WRITES = ("last.safetensors", "best.safetensors", "last.pth", "metrics.csv", "learning_curves.png")


def _epoch_of(path) -> int:
    from resmlp.checkpoint import read_metadata

    return read_metadata(path)["epoch"]


@pytest.mark.parametrize("killed_after", range(len(END_OF_EPOCH_WRITES)))
def test_a_kill_between_two_end_of_epoch_writes_resumes_into_files_of_the_right_epochs(
        tmp_path, monkeypatch, killed_after):
    """The state file is written right after the checkpoints, vouching for them (the side outputs follow and a
    resume redraws them): killed after any one write of the first epoch's end, the files the state names hold
    its epochs, and the resumed run ends as an uninterrupted one (same weights, same selected epoch, one metrics
    row per epoch)."""
    import os

    from safetensors.torch import load_file

    reference = train("fashion-mnist-quick", tmp_path / "ref", TINY)
    out = tmp_path / "run"
    real_replace, written = os.replace, []

    def replace_then_maybe_die(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if os.path.basename(dst) in END_OF_EPOCH_WRITES:
            written.append(os.path.basename(dst))
            if len(written) == killed_after + 1:
                raise _Killed

    monkeypatch.setattr(os, "replace", replace_then_maybe_die)
    with pytest.raises(_Killed):
        train("fashion-mnist-quick", out, TINY)
    monkeypatch.undo()
    assert written[-1] == END_OF_EPOCH_WRITES[killed_after]
    if (out / "last.pth").exists():  # what the state vouches for is on disk
        state = torch.load(out / "last.pth", weights_only=True)
        assert _epoch_of(out / "last.safetensors") == state["epoch"]
        assert _epoch_of(out / "best.safetensors") == state["best_epoch"]
    summary = train("fashion-mnist-quick", out, TINY, resume=(out / "last.pth").exists())
    assert summary["selected_epoch"] == reference["selected_epoch"] == _epoch_of(out / "best.safetensors")
    assert _epoch_of(out / "last.safetensors") == summary["epochs"] == 2
    assert len((out / "metrics.csv").read_text().splitlines()) == 3
    final, expected = load_file(out / "last.safetensors"), load_file(tmp_path / "ref" / "last.safetensors")
    assert all(torch.equal(final[k], expected[k]) for k in expected)


def test_a_fresh_run_clears_the_temporaries_of_a_killed_one(tmp_path):
    """A run killed during its first checkpoint write leaves a temporary and no state: the next (new) run in that
    folder clears it, as a resume does."""
    out = tmp_path / "run"
    out.mkdir()
    stale = out / ".last.safetensors.x1y2z3.tmp"
    stale.write_bytes(b"half a file")
    train("fashion-mnist-quick", out, {**TINY, "schedule.epochs": 1})
    assert not stale.exists()


@pytest.mark.parametrize("change", [{"epoch": "1"}, {"global_step": 2.0}, {"model": [1]}, {"history": None},
                                    {"model": {3: torch.ones(1)}}])
def test_a_damaged_state_file_is_one_line_not_a_traceback_deep_in_resume(tmp_path, change):
    from resmlp.errors import CheckpointError
    from resmlp.train.state import load_state

    out = tmp_path / "run"
    train("fashion-mnist-quick", out, {**TINY, "schedule.epochs": 1})
    state = torch.load(out / "last.pth", weights_only=True)
    torch.save({**state, **change}, out / "last.pth")
    with pytest.raises(CheckpointError, match="last.pth"):
        load_state(out / "last.pth")

"""Preemption (issue 50 item 5): SIGTERM, SIGUSR1 (SLURM's warning signal) and Ctrl-C stop a run at the next
step boundary, in the first epoch too, with a resumable state and the command that resumes it; the resumed run
ends with exactly the weights of an uninterrupted one (the scaffolding of tests/test_train_resume.py)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys

import pytest
import torch
from hostspeed import limit
from safetensors.torch import load_file

from resmlp.train import train
from resmlp.train.tasks import SupervisedTask

OVERRIDES = {
    "data.kind": "synthetic", "data.synthetic_size": [48, 16], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5, "data.reprob": 0.25,  # random augmentation, reproduced on resume
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 1, "train.ema": True,
    "train.ema_decay": 0.9, "schedule.epochs": 2, "schedule.warmup_epochs": 0.5, "train.batch_size": 8,
    "train.progress": False, "train.deterministic": True, "train.threads": 1, "train.compile": False,
    "train.amp": "none",
}
# the child runs the CLI as a user does; its loss hook sends the signal to its own process during step 3 of the
# first epoch (6 steps per epoch), as a scheduler or a Ctrl-C would
SIGNALLED_CHILD = """
import os, signal, sys
from resmlp.cli import main
from resmlp.train.tasks import SupervisedTask
build_loss = SupervisedTask.build_loss
def signalling(self, trainer, num_classes):
    inner, calls = build_loss(self, trainer, num_classes), {"n": 0}
    def loss_fn(model, images, targets):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        return inner(model, images, targets)
    return loss_fn
SupervisedTask.build_loss = signalling
sys.exit(main(sys.argv[2:]))
"""


def sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


@pytest.mark.slow
def test_sigterm_in_the_first_epoch_stops_with_a_state_and_the_printed_command_resumes_it_exactly(tmp_path):
    run = tmp_path / "preempted"
    stopped = subprocess.run([sys.executable, "-c", SIGNALLED_CHILD, "SIGTERM", "train", "--recipe",
                              "fashion-mnist-quick", "--output", str(run), *sets(OVERRIDES)],
                             capture_output=True, text=True, timeout=limit(300))
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "SIGTERM received: stopping after this step" in stopped.stderr
    state = torch.load(run / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (0, 3, 3)  # the first epoch
    assert f"stopped by SIGTERM: 3 optimizer steps, epoch 1 of 2 at step 3 of 6; resumable state written to " \
           f"{run / 'last.pth'}" in stopped.stdout
    command = [line.split(": ", 1)[1] for line in stopped.stdout.splitlines() if "continue it with:" in line]
    assert command == [shlex.join(["resmlp", "train", "--output", str(run), "--resume"])]
    words = shlex.split(command[0])
    resumed = subprocess.run([sys.executable, "-m", *words], capture_output=True, text=True, timeout=limit(300))
    assert resumed.returncode == 0, resumed.stderr[-2000:]

    train("fashion-mnist-quick", tmp_path / "straight", overrides=OVERRIDES)  # uninterrupted, in this process
    for name in ("last.safetensors", "best.safetensors"):
        a, b = load_file(run / name), load_file(tmp_path / "straight" / name)
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), name


@pytest.mark.parametrize("name", ["SIGUSR1", "SIGINT"])
def test_slurms_warning_signal_and_ctrl_c_stop_at_the_step_boundary(tmp_path, name, capsys):
    class Signalling(SupervisedTask):
        def build_loss(self, trainer, num_classes):
            inner, calls = super().build_loss(trainer, num_classes), {"n": 0}

            def loss_fn(model, images, targets):
                calls["n"] += 1
                if calls["n"] == 2:
                    os.kill(os.getpid(), getattr(signal, name))
                return inner(model, images, targets)
            return loss_fn

    from resmlp.train.config import load_config

    cfg = load_config("fashion-mnist-quick", OVERRIDES)
    before = signal.getsignal(signal.SIGINT)
    summary = train(cfg, tmp_path / "run", task=Signalling(cfg))
    assert (summary["signal"], summary["stopped_at_step"], summary["epochs"]) == (name, 2, 0)
    assert torch.load(tmp_path / "run" / "last.pth", weights_only=True)["global_step"] == 2
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are the caller's again
    assert f"stopped by {name}" in capsys.readouterr().out


def test_a_forked_data_loader_worker_ignores_the_signal_its_run_stops_for():
    """A scheduler (and a terminal's Ctrl-C) signals every process: a worker must keep serving, not die or stop."""
    from resmlp.train import preemption

    with preemption.stop_on_signals():
        pid = os.fork()
        if pid == 0:  # the worker
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0 if preemption.requested() is None else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and preemption.requested() is None


def test_a_signal_to_the_whole_job_with_data_loader_workers_still_stops_cleanly(tmp_path):
    """SLURM and a terminal signal every process: the workers must neither die first (torch would raise in the
    middle of the step) nor outlive the run (a worker deaf to its parent's SIGTERM hangs the exit)."""
    import numpy as np
    from PIL import Image

    for label in range(2):
        (tmp_path / "data" / "train" / f"c{label}").mkdir(parents=True)
        for i in range(16):
            Image.fromarray(np.full((8, 8, 3), 100 * label + i, dtype=np.uint8)).save(
                tmp_path / "data" / "train" / f"c{label}" / f"{i}.png")
    # sent by another process, as slurmstepd or a terminal sends it (torch's worker exits quietly on its parent's)
    child = SIGNALLED_CHILD.replace("os.kill(os.getpid(), getattr(signal, sys.argv[1]))",
                                    "os.waitpid(os.fork() or (os.killpg(0, signal.SIGTERM), os._exit(0))[1], 0)")
    run = tmp_path / "run"
    flags = ["--data", f"folder:{tmp_path / 'data'}", "--input-size", "3", "8", "8", "--set", "model.patch_size=4",
             "--set", "data.num_workers=1", "--set", "data.val_size=8", "--set", "data.batch_augment=false"]
    overrides = {k: v for k, v in OVERRIDES.items() if not k.startswith(("data.", "model.img_size"))}
    stopped = subprocess.run([sys.executable, "-c", child, "SIGTERM", "train", "--recipe", "fashion-mnist-quick",
                              "--output", str(run), *sets(overrides), *flags],
                             capture_output=True, text=True, timeout=limit(120), start_new_session=True)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    assert "Traceback" not in stopped.stderr and "RuntimeError" not in stopped.stderr, stopped.stderr[-2000:]
    assert torch.load(run / "last.pth", weights_only=True)["global_step"] == 3

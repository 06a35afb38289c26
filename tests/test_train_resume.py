"""Kill -9 mid-epoch, resume, and end with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hostspeed import limit
from safetensors.torch import load_file

from resmlp.train import train

OVERRIDES = {
    "data.kind": "synthetic", "data.synthetic_size": [96, 32], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5, "data.reprob": 0.25,  # random augmentation, reproduced on resume
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 32, "model.depth": 2, "model.drop_path_rate": 0.1,
    "data.mixup": 0.8, "loss.label_smoothing": 0.1, "train.ema": True, "train.ema_decay": 0.9,
    "schedule.epochs": 2, "schedule.warmup_epochs": 0.5, "train.batch_size": 16, "train.progress": False,
    "train.deterministic": True, "train.checkpoint_every_steps": 2, "optim.name": "lamb", "train.threads": 1,
}
# the child trains through the Python API; its loss hook SIGKILLs the process during step 9 (epoch 2,
# step 3 of 6), after the checkpoint of step 8 was written, like a crash or an OOM kill mid-epoch
KILLED_CHILD = """
import json, os, signal, sys
from resmlp.train import train
from resmlp.train.config import load_config
from resmlp.train.tasks import SupervisedTask
overrides = json.loads(sys.argv[2])
class KillAtStepNine(SupervisedTask):
    def build_loss(self, trainer, num_classes):
        inner, calls = super().build_loss(trainer, num_classes), {"n": 0}
        def loss_fn(model, images, targets):
            calls["n"] += 1
            if calls["n"] == 9:
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(model, images, targets)
        return loss_fn
cfg = load_config("fashion-mnist-quick", overrides)
train(cfg, sys.argv[1], task=KillAtStepNine(cfg))
"""


def resmlp_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "resmlp", "train", "--recipe", "fashion-mnist-quick", *args],
                          capture_output=True, text=True, timeout=limit(300))


def sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


# bf16: the path `amp: auto` takes on AVX-512 BF16 hosts (hosttype: .ci/run reruns it emulated, as on AVX2)
@pytest.mark.parametrize("amp", ["none", pytest.param("bf16", marks=pytest.mark.hosttype)])
def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path, amp):
    """Same host, same precision: resume must be bit-identical to an uninterrupted run."""
    overrides = {**OVERRIDES, "train.amp": amp}
    killed = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(tmp_path / "killed"), json.dumps(overrides)],
                            capture_output=True, text=True, timeout=limit(300))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    state = torch.load(tmp_path / "killed" / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (1, 2, 8)  # mid-epoch 2
    assert not (tmp_path / "killed" / "summary.json").exists()

    resumed = resmlp_train("--output", str(tmp_path / "killed"), "--resume", *sets(overrides))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    train("fashion-mnist-quick", tmp_path / "straight", overrides=overrides)  # uninterrupted, in this process

    for name in ("last.safetensors", "best.safetensors"):
        a, b = load_file(tmp_path / "killed" / name), load_file(tmp_path / "straight" / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}:{key} differs after resume"
    history = [json.loads(Path(tmp_path / run / "summary.json").read_text()) for run in ("killed", "straight")]
    assert history[0]["test_top1"] == history[1]["test_top1"]
    metrics = [(tmp_path / run / "metrics.csv").read_text().splitlines() for run in ("killed", "straight")]
    strip_timing = [[",".join(line.split(",")[:8]) for line in m] for m in metrics]  # drop seconds, img/s
    assert strip_timing[0] == strip_timing[1]

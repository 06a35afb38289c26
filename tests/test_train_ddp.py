"""Two CPU processes with torchrun + gloo give the single-process result for the same global batch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_same_training
from hostspeed import limit
from safetensors.torch import load_file
from test_train_engine import initial_weights

from resmlp.train import train

OVERRIDES = {
    "data.kind": "synthetic", "data.synthetic_size": [64, 32], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5,  # per-sample seeds make augmentation rank-independent
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 32, "model.depth": 2,
    "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.progress": False,
    "train.amp": "none", "optim.name": "sgd", "optim.lr": 0.1, "train.threads": 1,
    "train.device": "cpu",  # gloo processes: with a GPU visible, `auto` would put each process on its own GPU
}


# bf16: the path `amp: auto` takes on AVX-512 BF16 hosts (hosttype: .ci/run reruns it emulated, as on AVX2)
@pytest.mark.parametrize("amp", ["none", pytest.param("bf16", marks=pytest.mark.hosttype)])
def test_two_gloo_processes_match_one_process(tmp_path, amp):
    overrides = {**OVERRIDES, "train.amp": amp}
    sets = [arg for k, v in overrides.items() for arg in ("--set", f"{k}={json.dumps(v)}")]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    ddp = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train",
                          "--output", str(tmp_path / "ddp"), *sets], capture_output=True, text=True, timeout=limit(300))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    train("fashion-mnist-quick", tmp_path / "one", overrides=overrides)  # one process, same global batch

    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 16
    a, b = load_file(tmp_path / "ddp" / "last.safetensors"), load_file(tmp_path / "one" / "last.safetensors")
    assert_same_training(initial_weights(overrides), a, b, amp, "torchrun x2")
    rows = [(tmp_path / run / "metrics.csv").read_text().splitlines()[1].split(",") for run in ("ddp", "one")]
    loss_bound = 1e-3 if amp == "none" else 2e-2  # bf16 logits carry 8 bits of mantissa
    for col in (1, 3):  # train_loss, val_loss
        assert abs(float(rows[0][col]) - float(rows[1][col])) < loss_bound
    assert abs(float(rows[0][4]) - float(rows[1][4])) <= 100 / 32 + 1e-6  # val_top1: at most 1 of 32 images

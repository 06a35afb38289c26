"""Two CPU processes with torchrun + gloo give the single-process result for the same global batch."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from resmlp.train import train

OVERRIDES = {
    "data.kind": "synthetic", "data.synthetic_size": [64, 32], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5,  # per-sample seeds make augmentation rank-independent
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 32, "model.depth": 2,
    "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.progress": False,
    "train.amp": "none", "optim.name": "sgd", "optim.lr": 0.1, "train.threads": 1,
}


def test_two_gloo_processes_match_one_process(tmp_path):
    sets = [arg for k, v in OVERRIDES.items() for arg in ("--set", f"{k}={json.dumps(v)}")]
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    ddp = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train",
                          "--output", str(tmp_path / "ddp"), *sets], capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    train("fashion-mnist-quick", tmp_path / "one", overrides=OVERRIDES)  # one process, same global batch

    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 16
    a, b = load_file(tmp_path / "ddp" / "last.safetensors"), load_file(tmp_path / "one" / "last.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
    rows = [(tmp_path / run / "metrics.csv").read_text().splitlines()[1].split(",") for run in ("ddp", "one")]
    for col in (1, 3, 4):  # train_loss, val_loss, val_top1
        assert abs(float(rows[0][col]) - float(rows[1][col])) < 1e-3

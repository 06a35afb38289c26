"""`resmlp train` from shards streamed off the test's own servers (tests/remote_servers.py): killed mid-epoch
and resumed to the uninterrupted run's weights from S3 (moto's server on 127.0.0.1); two gloo processes under
torchrun reading their share over HTTP, each shard once an epoch."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from resmlp.cli import main

pytest.importorskip("s3fs")
pytest.importorskip("moto")
from hostspeed import limit  # noqa: E402
from remote_servers import FaultProxy, http_server, s3_server, upload  # noqa: E402

TINY = {
    "data.num_workers": 0, "data.crop_pct": 1.0, "data.hflip": 0.5, "data.scale": [0.6, 1.0],
    "data.ratio": [1.0, 1.0], "model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1,
    "model.in_chans": 3, "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 8,
    "train.progress": False, "train.threads": 1, "train.compile": False, "train.amp": "none",
    "data.mean": [0.5, 0.5, 0.5], "data.std": [0.25, 0.25, 0.25], "train.device": "cpu", "data.kind": "folder",
    "data.remote_retries": 2, "data.remote_timeout": 10, "data.remote_backoff": 0.05,
}
KILLED_CHILD = """
import json, os, signal, sys
from resmlp.train import train
from resmlp.train.config import load_config
from resmlp.train.tasks import SupervisedTask
class KillAtStepSix(SupervisedTask):
    def build_loss(self, trainer, num_classes):
        inner, calls = super().build_loss(trainer, num_classes), {"n": 0}
        def loss_fn(model, images, targets):
            calls["n"] += 1
            if calls["n"] == 6:
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(model, images, targets)
        return loss_fn
cfg = load_config("deit", json.loads(sys.argv[2]))
train(cfg, sys.argv[1], task=KillAtStepSix(cfg))
"""


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """32 training JPEGs of 2 classes in 8 shards of 4, 8 validation images in 2, with index.json."""
    root = tmp_path_factory.mktemp("train-remote")
    rng = np.random.default_rng(0)
    for split, n in (("train", 32), ("val", 8)):
        for i in range(n):
            folder = root / "folder" / split / ("n01", "n02")[i % 2]
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.normal(80 + 100 * (i % 2), 30, (20, 24, 3)).clip(0, 255).astype(np.uint8)
            Image.fromarray(pixels).save(folder / f"{i}.JPEG", format="JPEG")
    assert main(["data", "shards", f"folder:{root / 'folder'}", str(root / "shards"), "--shard-records", "4"]) == 0
    return root / "shards"


def _sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


def test_killed_mid_epoch_over_s3_then_resumed_gives_the_uninterrupted_weights(shards, tmp_path):
    with s3_server() as endpoint:
        upload(endpoint, "bkt", shards, "imagenet-wds")
        overrides = {**TINY, "data.source": "wds:s3://bkt/imagenet-wds/", "data.endpoint_url": endpoint,
                     "train.deterministic": True, "train.checkpoint_every_steps": 1}
        killed = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(tmp_path / "killed"), json.dumps(overrides)],
                                capture_output=True, text=True, timeout=limit(600))
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        state = torch.load(tmp_path / "killed" / "last.pth", weights_only=True)
        assert state["step_in_epoch"] == 1 and state["stream_shards"]  # mid-epoch 2, the listing's digest kept
        for run, resume in (("killed", ["--resume"]), ("straight", [])):
            assert main(["train", "--recipe", "deit", "--output", str(tmp_path / run), *resume,
                         *_sets(overrides)]) == 0
    a, b = load_file(tmp_path / "killed" / "last.safetensors"), load_file(tmp_path / "straight" / "last.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_two_gloo_processes_each_read_their_share_over_http(shards, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    with http_server(shards) as url, FaultProxy(url, [{"match": "train-000005", "fault": "503", "times": 1}]) as proxy:
        # timm's path: auto's probe would read the first batches of both paths, GETs this count is not about
        overrides = {**TINY, "data.source": f"wds:{proxy.url}/", "data.pipeline": "timm"}
        ddp = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train", "--recipe",
                              "deit", "--output", str(tmp_path / "ddp"), *_sets(overrides)],
                             capture_output=True, text=True, timeout=limit(600))
        assert ddp.returncode == 0, ddp.stderr[-3000:]
        reads = Counter(path for method, path in proxy.requests if method == "GET" and "/train-" in path)
    assert json.loads((tmp_path / "ddp" / "summary.json").read_text())["world_size"] == 2
    # every shard read once an epoch by one of the two processes (the 503 retried: one more GET of its shard)
    assert reads == {f"/train-{n:06d}.tar": 2 + (n == 5) for n in range(8)}, reads
    rows = list(csv.DictReader((tmp_path / "ddp" / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 2 and all(r["skipped_train_images"] == r["skipped_val_images"] == "0" for r in rows)

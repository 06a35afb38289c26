"""benchmarks/remote_streaming.py runs in its tiny form: streaming from the loopback HTTP and S3 servers against
the local shards, and the first start on timm's _info.json, ours and timm's (the figures come from the full
run on an idle host, docs/training.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostspeed import limit

pytest.importorskip("s3fs")
pytest.importorskip("moto")


@pytest.mark.slow
def test_remote_streaming_benchmark_reports_every_reader(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "remote.json"
    cmd = [sys.executable, str(root / "benchmarks" / "remote_streaming.py"), "--images", "24", "--classes", "2",
           "--image-size", "32", "--shard-records", "8", "--repeats", "1", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=limit(900))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report["streaming"]) == {"local", "http", "s3"}
    assert all(row["images"] == 24 and row["images_per_s"] > 0 for row in report["streaming"].values())
    first = report["first_start"]
    assert first["resmlp"]["seconds"] > 0 and first["timm"]["seconds"] > 0 and first["ratio"] > 0
    assert "| s3 |" in done.stdout and "first 64 images with _info.json" in done.stdout

"""Tiny forms of the device pipeline's benchmarks (benchmarks/device_pipeline_cpu.py, device_pipeline_accuracy.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_pipeline_accuracy as accuracy  # noqa: E402
import device_pipeline_cpu as cpu  # noqa: E402
from hostspeed import limit  # noqa: E402


def test_the_cpu_benchmark_times_both_pipelines_side_by_side():
    result = cpu.measure(images=4, batch=2, rounds=1, img_size=32)
    assert result["timm_images_per_s_per_core"] > 0 and result["device_images_per_s_per_core"] > 0
    ratio = result["device_images_per_s_per_core"] / result["timm_images_per_s_per_core"]
    assert abs(result["device_over_timm"] - ratio) < 0.02 * ratio + 0.01
    assert result["host"]["cpu_capability"] and result["mean_jpeg_kb"] > 10  # photos at ~500x375, quality 90


def test_the_photo_jpegs_are_imagenet_sized():
    import io

    from PIL import Image

    sizes = [Image.open(io.BytesIO(b)).size for b in cpu.photo_jpegs(6)]
    assert all(420 <= w <= 580 and 310 <= h <= 440 for w, h in sizes)


def test_the_accuracy_benchmark_runs_both_pipelines_and_judges_the_spread(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device_pipeline_accuracy.py"), "--out",
                           str(tmp_path), "--epochs", "1", "--seeds", "0", "--batch", "8", "--tiny"],
                          capture_output=True, text=True, timeout=limit(600), env={"PYTHONPATH": str(ROOT / "src"),
                                                                            "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "accuracy.md").read_text()
    assert "| timm |" in table and "| device |" in table
    assert len(list((tmp_path / "digits" / "train").rglob("*.jpg"))) == 40
    text, agree = accuracy.table({"timm": [80.0, 82.0, 81.0], "device": [81.5, 80.5, 82.5]}, [0, 1, 2])
    assert agree and "agree within the seed spread" in text
    assert not accuracy.table({"timm": [80.0, 80.5, 81.0], "device": [84.0, 84.5, 85.0]}, [0, 1, 2])[1]

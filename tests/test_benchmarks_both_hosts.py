"""The per-core pipeline benchmarks run on both host types (issue 53): benchmarks/device_pipeline_cpu.py (the device
path against timm's transform) and benchmarks/dino_multi_crop.py (DINO's multi-crop against DINO's PIL transform),
in tiny form, with the CPU's kernels restricted to AVX2 (`ATEN_CPU_CAPABILITY=avx2`, how an AVX-512 host rehearses
an AVX2-only one), and say the host they ran on: the capability, native bf16 and the precision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY = {"device_pipeline_cpu.py": ["--images", "4", "--batch", "2", "--rounds", "1", "--img-size", "32"],
        "dino_multi_crop.py": ["--device", "cpu", "--tiny", "--workers", "1"]}


@pytest.mark.parametrize("script", list(TINY))
def test_the_per_core_benchmark_runs_as_an_avx2_host_and_names_it(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ATEN_CPU_CAPABILITY": "avx2"}
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *TINY[script]], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    first, rest = done.stdout.split("\n", 1)
    assert first.startswith("host: ") and "CPU capability AVX2" in first and "native bf16 no" in first
    result = json.loads(rest[rest.index("{"):])
    host = result["host"]
    assert host["cpu_capability"] == "AVX2" and host["native_bf16"] is False and host["precision"] == "fp32"
    assert result["amp_auto"] == "fp32" and result["aten_cpu_capability_env"] == "avx2"  # no bf16 emulated here

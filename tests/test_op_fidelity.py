"""benchmarks/op_fidelity.py: the measured distance of the device ops from the PIL ops they twin (the figures in
docs/training.md and docs/distillation_dino_finetune.md). Its tiny form runs, and what it measures holds the
bounds a broken op would break: bilinear geometric ops and DINO's brightness/contrast/saturation within one level
of PIL, bicubic ones far above a wrong matrix's ~15 dB."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from hostspeed import limit

ROOT = Path(__file__).resolve().parents[1]


def _load():
    spec = importlib.util.spec_from_file_location("op_fidelity", ROOT / "benchmarks" / "op_fidelity.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_tiny_form_runs_and_writes_its_figures(tmp_path):
    out = tmp_path / "ops.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "op_fidelity.py"), "--tiny", "--json", str(out)],
                          capture_output=True, text=True, timeout=limit(600))
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())["ops"]
    assert "| Rotate (bicubic) |" in done.stdout and "GaussianBlur (DINO)" in figures


def test_the_measured_ops_are_within_their_bounds():
    fidelity = _load()
    figures = fidelity.measure(tiny=True)
    for name, f in figures.items():
        if "bilinear" in name or name.split()[0] in ("brightness", "contrast", "saturation"):
            assert f["max_levels"] <= 1, (name, f)
        assert f["psnr_db_min"] > 40, (name, f)


def test_a_wrong_rotation_is_far_off():
    """The measurement can fail: a rotation by the opposite angle is far from PIL's."""
    fidelity = _load()
    img = fidelity.sample_photos(tiny=True)[0]
    right = fidelity.geometric("Rotate", 20.0, "bilinear", img)
    pil = [np.asarray(fidelity.aa.NAME_TO_OP["Rotate"](fidelity.Image.fromarray(img), angle, fillcolor=fidelity.FILL,
                                                       resample=fidelity.Image.BILINEAR)) for angle in (20.0, -20.0)]
    theirs_flipped = fidelity.stats(*pil)
    assert right["psnr_db"] > 60 and theirs_flipped["psnr_db"] < 25

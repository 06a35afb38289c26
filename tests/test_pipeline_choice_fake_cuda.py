"""data.pipeline auto and the fallback on `device="cuda"` without a GPU (tests/fakecuda.py): the probe measures
both paths on the (fake) card, the run trains on its choice without a host wait per step, and a device
failure (nvJPEG refusing a file, out of memory in the resample) at the probe or mid-run hands over to timm's
path. nvJPEG is stood in for as in tests/test_fake_cuda_pipeline.py."""

from __future__ import annotations

import json

import pytest
import torch
from fakecuda import fake_cuda
from test_device_pipeline import make_jpeg_folder
from test_fake_cuda import COMMON, repeated_waits
from test_fake_cuda_pipeline import DEVICE, nvjpeg_stand_in
from test_pipeline_choice import PROBE, failing_at

from resmlp.cli import main
from resmlp.data.device import decode

pytestmark = pytest.mark.filterwarnings("ignore:skipping unreadable image")


def run(tmp_path, capsys, monkeypatch, **sets):
    monkeypatch.setattr(decode, "decode_jpeg", nvjpeg_stand_in)
    data = make_jpeg_folder(tmp_path / "data")
    base = {k: v for k, v in COMMON.items() if not k.startswith("data.synthetic")}
    overrides = {**base, **DEVICE, "data.kind": "folder", "model.in_chans": 3, "data.mean": [0.5] * 3,
                 "data.std": [0.25] * 3, "train.batch_size": 4, **sets}
    with fake_cuda() as ledger:
        code = main(["train", "--recipe", "fashion-mnist-quick", "--data-dir", str(data), "--output",
                     str(tmp_path / "run"), *[f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    return ledger, printed, json.loads((tmp_path / "run" / "summary.json").read_text())["data_pipeline"]


def test_auto_probes_both_paths_on_the_gpu_and_trains_on_its_choice_without_host_waits(tmp_path, capsys,
                                                                                        monkeypatch):
    ledger, printed, recorded = run(tmp_path, capsys, monkeypatch, **{"data.pipeline": "auto"})
    assert PROBE.search(printed.out) and printed.out.count("data.pipeline auto:") == 1
    assert recorded["name"] in ("device", "timm") and set(recorded["figures"]) == {"device", "timm"}
    assert repeated_waits(ledger) == {}


def test_out_of_memory_in_the_resample_at_the_probe_leaves_timms_path(tmp_path, capsys, monkeypatch):
    failing_at(monkeypatch, "resample", torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 58 GiB"), None)
    ledger, printed, recorded = run(tmp_path, capsys, monkeypatch, **{"data.pipeline": "auto"})
    assert "the device path failed at the probe (OutOfMemoryError: CUDA out of memory" in printed.out
    assert recorded["name"] == "timm" and recorded["figures"]["device"] is None
    assert repeated_waits(ledger) == {}


def test_nvjpeg_refusing_a_file_mid_run_finishes_on_timms_path(tmp_path, capsys, monkeypatch):
    failing_at(monkeypatch, "decode", RuntimeError("nvjpegDecode failed: NVJPEG_STATUS_BAD_JPEG"), 8)
    ledger, printed, recorded = run(tmp_path, capsys, monkeypatch, **{"data.pipeline": "device"})
    # on a GPU the next batch is decoded while the step runs: the failure of the batch at 8 surfaces as the
    # batch at 4 is handed out, and timm's path reads from 4 (a batch never handed to the step)
    assert recorded["name"] == "timm" and recorded["switched"]["position"] == 4
    assert "NVJPEG_STATUS_BAD_JPEG" in printed.err and printed.err.count("device path failed") == 1
    assert repeated_waits(ledger) == {}

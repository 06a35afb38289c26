"""data.pipeline=device on `device="cuda"` without a GPU (tests/fakecuda.py): the whole device pipeline --
encoded batches from the loader, decoding, timm's training transform as batch ops, the step -- with no device
mismatch and no host wait per step beyond the pinned uploads (the batch's bytes and labels, and one packed
tensor of the batch's random numbers).

The honest boundary: torchvision's decode_jpeg(device="cuda") calls nvJPEG, which fake tensors can't run, so
it is stood in for by a function that returns an uninitialised CUDA uint8 image of the header's size, what
nvJPEG returns. Everything after it (crops, resizes, RandAugment, erasing, normalisation) is the real code on
fake CUDA tensors. docs/gpu.md says so.
"""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image
from test_device_pipeline import make_jpeg_folder
from test_fake_cuda import COMMON, repeated_waits, run_cli

from resmlp.data.device import decode

DEVICE = {"data.pipeline": "device", "data.auto_augment": "rand-m9-mstd0.5-inc1", "data.reprob": 0.25,
          "data.mixup": 0.8, "data.cutmix": 1.0, "loss.label_smoothing": 0.1}


def nvjpeg_stand_in(chunks, mode, device):
    """decode_jpeg's CUDA result without nvJPEG: a (3, H, W) uint8 image on `device` per JPEG."""
    assert str(device).startswith("cuda") and all(c.device.type == "cpu" for c in chunks)
    sizes = [Image.open(io.BytesIO(c.numpy().tobytes())).size for c in chunks]
    return [torch.empty((3, h, w), dtype=torch.uint8, device=device) for w, h in sizes]


@pytest.mark.filterwarnings("ignore:skipping unreadable image")
def test_a_jpeg_folder_decodes_and_augments_on_the_gpu_without_host_waits(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(decode, "decode_jpeg", nvjpeg_stand_in)
    data = make_jpeg_folder(tmp_path / "data")
    base = {k: v for k, v in COMMON.items() if not k.startswith("data.synthetic")}
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--data-dir", str(data), "--output",
                      str(tmp_path / "run")],
                     {**base, **DEVICE, "data.kind": "folder", "model.in_chans": 3, "data.mean": [0.5] * 3,
                      "data.std": [0.25] * 3, "train.batch_size": 4}, capsys)
    assert repeated_waits(ledger) == {}
    assert not ledger.inside("DevicePipeline.__call__", "DeviceAugment.__call__")  # not even once
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["data_pipeline"]["decoded_on_device"] > 0 and summary["data_pipeline"]["pil_fallback"] > 0


def test_in_memory_images_take_randaugment_on_the_gpu_without_host_waits(tmp_path, capsys):
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "run")],
                     {**COMMON, **DEVICE}, capsys)
    assert repeated_waits(ledger) == {}
    assert not ledger.inside("DeviceAugment.__call__")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["data_pipeline"]["name"] == "device"


def test_dino_multicrop_runs_on_the_gpu_without_host_waits(tmp_path, capsys):
    from test_fake_cuda import DINO

    ledger = run_cli(["pretrain", "dino", "--output", str(tmp_path / "run")],
                     {**COMMON, **DINO, "model.in_chans": 1, "data.pipeline": "device"}, capsys)
    assert repeated_waits(ledger) == {}
    assert not ledger.inside("MultiCropAugment.__call__")  # the batched multi-crop reads nothing back, not once
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["data_pipeline"]["name"] == "device"

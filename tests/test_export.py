"""ONNX and TorchScript exports compute what the PyTorch model computes, for any batch size."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import TINY, build_fast

import resmlp
from resmlp.cli import main
from resmlp.export import export
from resmlp.models.resmlp import ResMLPConfig


@pytest.fixture(scope="module")
def model():
    return build_fast(ResMLPConfig(**TINY).replace(num_classes=10), seed=4)


def test_onnx_matches_pytorch_with_a_dynamic_batch(model, tmp_path):
    path = export(model, tmp_path / "m.onnx", "onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    for batch in (3, 16):
        x = torch.randn(batch, 3, 32, 32)
        got = session.run(None, {"images": x.numpy()})[0]
        with torch.no_grad():
            want = model(x).numpy()
        assert got.shape == (batch, 10)
        assert np.abs(got - want).max() < 1e-4
        assert (got.argmax(-1) == want.argmax(-1)).all()


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated")
def test_torchscript_round_trip(model, tmp_path):
    path = export(model, tmp_path / "m.pt", "torchscript")
    loaded = torch.jit.load(str(path))
    for batch in (1, 6):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x), atol=1e-4, rtol=0)


def test_export_cli_from_a_checkpoint(model, tmp_path, capsys):
    ckpt = resmlp.save(model, tmp_path / "m.safetensors")
    out = tmp_path / "out" / "m.pt"
    assert main(["export", str(ckpt), "--format", "torchscript", "--output", str(out)]) == 0
    assert out.is_file() and "batch size dynamic" in capsys.readouterr().out
    assert not list(out.parent.glob(".*tmp*"))  # atomic write left no temporary file
    assert main(["export", str(tmp_path / "missing.safetensors"), "--output", str(out)]) == 2


def test_export_cli_takes_a_run_folder_and_a_timm_or_torchvision_model(model, tmp_path, capsys):
    import timm

    resmlp.save(model, tmp_path / "run" / "best.safetensors")
    out = tmp_path / "m.pt"
    assert main(["export", str(tmp_path / "run"), "--format", "torchscript", "--output", str(out)]) == 0
    assert out.stat().st_size > 0
    from resmlp.build import build_model

    pre = dict(img_size=24, in_chans=1, mean=[0.5], std=[0.25], crop_pct=1.0, interpolation="bicubic")
    resnet = timm.create_model("test_resnet", num_classes=3, in_chans=1).eval()
    path = resmlp.save(resnet, tmp_path / "resnet.safetensors", {"preprocess": pre, "class_names": ["a", "b", "c"]})
    capsys.readouterr()
    assert main(["export", str(path), "--output", str(tmp_path / "r.onnx")]) == 0
    assert "input (batch, 1, 24, 24) float32 -> logits (batch, 3); the timm model as trained" in capsys.readouterr().out
    session = ort.InferenceSession(str(tmp_path / "r.onnx"), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["class_names"] == '["a", "b", "c"]'
    x = torch.randn(5, 1, 24, 24)
    with torch.no_grad():
        assert np.abs(session.run(None, {"images": x.numpy()})[0] - resnet(x).numpy()).max() < 1e-4
    vision = build_model("torchvision:resnet18", num_classes=3, in_chans=1).eval()  # a grayscale wrapper
    path = resmlp.save(vision, tmp_path / "tv.safetensors", {"preprocess": pre})
    assert main(["export", str(path), "--output", str(tmp_path / "tv.pt")]) == 0
    with torch.no_grad():
        torch.testing.assert_close(torch.jit.load(str(tmp_path / "tv.pt"))(x), vision(x), atol=1e-4, rtol=0)


def test_export_cli_takes_the_format_from_the_extension_and_writes_preprocessing_into_onnx(model, tmp_path, capsys):
    import json

    names = [f"class {i}" for i in range(10)]
    preprocess = dict(img_size=32, in_chans=3, mean=[0.4, 0.5, 0.6], std=[0.2, 0.25, 0.3], crop_pct=0.9,
                      interpolation="bilinear")
    ckpt = resmlp.save(model, tmp_path / "m.safetensors", {"class_names": names, "preprocess": preprocess})
    assert main(["export", str(ckpt), "--output", str(tmp_path / "m.pt")]) == 0  # no --format: TorchScript
    assert torch.jit.load(str(tmp_path / "m.pt"))(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert main(["export", str(ckpt), "--output", str(tmp_path / "m.onnx")]) == 0
    meta = ort.InferenceSession(str(tmp_path / "m.onnx")).get_modelmeta().custom_metadata_map
    assert json.loads(meta["class_names"]) == names and json.loads(meta["mean"]) == pytest.approx([0.4, 0.5, 0.6])
    assert json.loads(meta["std"]) == pytest.approx([0.2, 0.25, 0.3]) and float(meta["crop_pct"]) == 0.9
    assert meta["interpolation"] == "bilinear" and meta["img_size"] == "32"
    capsys.readouterr()
    assert main(["export", str(ckpt), "--output", str(tmp_path / "m.bin")]) == 2
    assert "cannot tell the export format from 'm.bin'" in capsys.readouterr().err


def test_pt2_export_from_the_cli_runs_any_batch_and_carries_the_preprocessing(model, tmp_path, capsys):
    """issue 50 item 9: torch.export's format beside ONNX and TorchScript, named by its extension."""
    import json

    from resmlp.export import PT2_METADATA

    ckpt = resmlp.save(model, tmp_path / "m.safetensors")
    out = tmp_path / "m.pt2"
    assert main(["export", str(ckpt), "--output", str(out)]) == 0
    assert "(pt2)" in capsys.readouterr().out
    extra = {PT2_METADATA: ""}
    loaded = torch.export.load(str(out), extra_files=extra).module()
    for batch in (1, 5):
        x = torch.randn(batch, 3, 32, 32)
        with torch.no_grad():
            torch.testing.assert_close(loaded(x), model(x), atol=1e-4, rtol=0)
    assert json.loads(extra[PT2_METADATA])["img_size"] == "32"

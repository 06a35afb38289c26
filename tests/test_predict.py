"""`resmlp predict` end to end: files, folders, globs, a corrupt file, JSON / CSV output, exit codes."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import TINY, build_fast
from PIL import Image

import resmlp
from resmlp.cli import main
from resmlp.inference import optimize
from resmlp.models.resmlp import ResMLPConfig
from resmlp.preprocess import Preprocess

CLASSES = [f"c{i}" for i in range(7)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    model = build_fast(ResMLPConfig(**TINY).replace(in_chans=1), seed=5)
    meta = {"class_names": CLASSES, "preprocess": {"img_size": 32, "crop_pct": 1.0, "interpolation": "bicubic",
                                                   "mean": [0.3], "std": [0.4], "in_chans": 1}}
    ckpt = resmlp.save(model, root / "m.safetensors", metadata=meta)
    (root / "imgs" / "sub").mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    for name in ["a.png", "b.png", "sub/c.jpg"]:
        pixels = (torch.rand(40, 48, 3, generator=gen) * 255).to(torch.uint8).numpy()
        Image.fromarray(pixels).save(root / "imgs" / name)
    (root / "broken.png").write_bytes(b"\x89PNG truncated")
    return root, ckpt, model, meta


def test_folder_json_output_matches_the_model(setup):
    root, ckpt, model, meta = setup
    out = root / "pred.json"
    assert main(["predict", str(ckpt), str(root / "imgs"), "--top-k", "3", "--output", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["errors"] == [] and len(data["predictions"]) == 3
    pre = Preprocess.from_metadata(meta, model)
    for p in data["predictions"]:
        with torch.no_grad():
            probs = model(pre.load(p["file"])[None]).softmax(-1)[0]
        top = probs.topk(3)
        assert [t["class_id"] for t in p["top_k"]] == top.indices.tolist()
        assert [t["class_name"] for t in p["top_k"]] == [CLASSES[i] for i in top.indices.tolist()]
        assert [t["probability"] for t in p["top_k"]] == pytest.approx(top.values.tolist(), abs=1e-5)


def test_corrupt_file_is_reported_skipped_and_fails_the_exit_code(setup, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")  # a narrow terminal must not split a message over lines
    root, ckpt, _, _ = setup
    out = root / "pred.csv"
    code = main(["predict", str(ckpt), str(root / "broken.png"), str(root / "imgs" / "*.png"),
                 str(root / "nothing_here_*.png"), "--output", str(out), "--top-k", "2"])
    assert code == 1
    err = capsys.readouterr().err
    # our own message (resmlp.data.images.open_image), on the line that names the file
    assert any(f"{root / 'broken.png'}: cannot read image {root / 'broken.png'}" in line for line in err.splitlines())
    assert any("nothing_here_" in line and "no such file" in line for line in err.splitlines())
    rows = list(csv.DictReader(out.open()))
    good = [r for r in rows if not r["error"]]
    assert sorted({r["file"].rsplit("/", 1)[-1] for r in good}) == ["a.png", "b.png"]  # the glob, not sub/
    assert len(good) == 4 and {r["rank"] for r in good} == {"1", "2"}
    assert len([r for r in rows if r["error"]]) == 2


def test_timm_checkpoint_uses_the_authors_crop_and_says_so(tmp_path, capsys):
    model = build_fast(ResMLPConfig(**TINY), seed=6)
    ckpt = resmlp.export_checkpoint(model, tmp_path / "timm.pth", format="timm")
    Image.new("RGB", (50, 40), (10, 200, 30)).save(tmp_path / "x.png")
    assert main(["predict", str(ckpt), str(tmp_path / "x.png"), "--top-k", "1", "--precision", "int8"]) == 0
    assert "assumed ImageNet's mean/std, crop 0.9" in capsys.readouterr().out  # DeiT's README_resmlp.md


def test_bad_output_suffix_is_refused_before_work(setup, capsys):
    root, ckpt, _, _ = setup
    assert main(["predict", str(ckpt), str(root / "imgs"), "--output", str(root / "p.txt")]) == 2
    assert ".json or .csv" in capsys.readouterr().err


@pytest.mark.hosttype
def test_optimized_bf16_predictions_match_fp32_on_images(setup):
    root, _, model, meta = setup
    pre = Preprocess.from_metadata(meta, model)
    batch = torch.stack([pre.load(p) for p in sorted((root / "imgs").rglob("*.*"))])
    with pytest.warns(UserWarning) if not _native_bf16() else _nullcontext():
        fast = optimize(model, "bf16")
    with torch.no_grad():
        assert (fast(batch).argmax(-1) == model(batch).argmax(-1)).all()


def _native_bf16() -> bool:
    from resmlp.inference import native_bf16_available

    return native_bf16_available("cpu")


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


def test_a_timm_model_saved_by_resmlp_predicts(tmp_path, capsys):
    """resmlp.save stores timm models too (e.g. the convnet teacher): predict must classify with them."""
    import timm

    net = timm.create_model("resnet10t", in_chans=1, num_classes=3).eval()
    pre = Preprocess(16, 1, (0.5,), (0.25,), crop_pct=1.0)
    resmlp.save(net, tmp_path / "cnn.safetensors", {"preprocess": pre.to_dict(), "class_names": ["a", "b", "c"]})
    Image.new("L", (16, 16), 90).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "cnn.safetensors"), str(tmp_path / "x.png"), "--top-k", "5"]) == 0
    out = capsys.readouterr().out
    assert "1 image(s) classified" in out and "#4" not in out  # top-k capped at the 3 classes
    assert main(["predict", str(tmp_path / "cnn.safetensors"), str(tmp_path / "x.png"), "--precision", "int8"]) == 2
    assert "use --precision fp32" in capsys.readouterr().err


def test_table_keeps_what_tells_files_apart_and_an_error_comes_alone(setup, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    _, ckpt, _, _ = setup
    deep = tmp_path / ("a_folder_with_a_long_name_" * 3) / "photos"
    deep.mkdir(parents=True)
    for i in range(2):
        Image.new("L", (32, 32), 60 * i).save(deep / f"holiday_{i:04d}.png")
    assert main(["predict", str(ckpt), str(deep), "--top-k", "1"]) == 0
    out = capsys.readouterr().out
    assert "holiday_0000.png" in out and "holiday_0001.png" in out  # whole, not cut to a shared prefix
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["predict", str(ckpt), str(deep), "--output", str(blocker / "pred.json")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1

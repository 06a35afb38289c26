"""One preprocessing path: predict, eval and timm's own data pipeline see the same tensors and the same top-1."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config

import resmlp
from resmlp.cli import main
from resmlp.data import build_dataset
from resmlp.inference import load_for_inference
from resmlp.preprocess import Preprocess


@pytest.fixture
def checkpoint(tmp_path):
    torch.manual_seed(0)
    model = resmlp.create_model("resmlp_s12", img_size=24, patch_size=8, dim=16, depth=1, num_classes=2)
    pre = Preprocess(24, 3, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), crop_pct=0.9, interpolation="bicubic")
    path = tmp_path / "m.safetensors"
    resmlp.save(model, path, {"preprocess": pre.to_dict(), "class_names": ["a", "b"], "dataset": "folder"})
    return path


def test_the_resize_is_timms_floor_rule_even_where_the_crop_does_not_divide(checkpoint, tmp_path):
    pre = load_for_inference(checkpoint).preprocess
    assert math.floor(24 / 0.9) == 26 != round(24 / 0.9)  # 26.67: round() would give 27
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (37, 53, 3), dtype=np.uint8))
    image.save(tmp_path / "x.png")
    ours = pre.load(tmp_path / "x.png")
    timms = create_transform((3, 24, 24), is_training=False, crop_pct=0.9, interpolation="bicubic",
                             mean=pre.mean, std=pre.std)(Image.open(tmp_path / "x.png").convert("RGB"))
    assert torch.equal(ours, timms)  # the same library call on the same pixels: bit-identical


def test_predict_eval_and_timms_validate_path_agree(checkpoint, tmp_path):
    """The same images through `resmlp predict`, `resmlp eval` and timm's validate.py recipe
    (resolve_data_config -> create_transform -> forward) give the same predictions and top-1."""
    rng = np.random.default_rng(1)
    for c in ("a", "b"):
        (tmp_path / "data" / "test" / c).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (30, 41, 3), dtype=np.uint8)).save(tmp_path / "data" / "test" / c /
                                                                                   f"{i}.png")
    assert main(["eval", str(checkpoint), "--data", str(tmp_path / "data"), "--split", "test", "--output",
                 str(tmp_path / "ev")]) == 0
    evaluated = json.loads((tmp_path / "ev" / "summary.json").read_text())

    model = timm.create_model("resmlp_s12", pretrained=False, img_size=24, patch_size=8, dim=16, depth=1,
                              num_classes=2, checkpoint_path=str(checkpoint)).eval()
    model.pretrained_cfg = resmlp.load(checkpoint).pretrained_cfg  # the file's preprocessing, as timm sees it
    transform = create_transform(**resolve_data_config({}, model=model))
    dataset = build_dataset("folder", "test", tmp_path / "data", 3, transform)
    with torch.no_grad():
        logits = model(torch.stack([dataset[i][0] for i in range(len(dataset))]))
    labels = torch.tensor([dataset[i][1] for i in range(len(dataset))])
    assert evaluated["test_top1"] == pytest.approx(100 * (logits.argmax(1) == labels).float().mean().item())

    assert main(["predict", str(checkpoint), str(tmp_path / "data"), "--top-k", "1", "--output",
                 str(tmp_path / "p.json")]) == 0
    predicted = {p["file"]: p["top_k"][0]["class_id"] for p in json.loads((tmp_path / "p.json").read_text())
                 ["predictions"]}
    for i, (path, _) in enumerate(dataset.samples):
        assert predicted[path] == logits[i].argmax().item()

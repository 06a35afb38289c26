"""timm validate.py's extras in `resmlp eval` (issue 50 item 4): ImageNet-ReaL accuracy (pinned against timm's
RealLabelsImagenet), a valid-label subset (ImageNet-A/R's --valid-labels) and a per-image results CSV."""

from __future__ import annotations

import csv
import json
import shutil

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import RealLabelsImagenet

from resmlp.cli import main

CLASSES = 6  # more than 5: top-5 is a score
TINY = ["--epochs", "1", "--batch-size", "8", "--no-progress", "--threads", "1", "--set", "train.compile=false",
        "--set", "model.dim=16", "--set", "model.depth=1", "--set", "schedule.warmup_epochs=0",
        "--input-size", "3", "16", "16", "--set", "train.amp=none"]
EVAL = ["--no-progress", "--threads", "1", "--amp", "fp32", "--split", "val"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run trained on six colour classes; its val images carry ImageNet's val file names, numbered across the
    classes so that sorted-name order is not the folder order (ReaL's file maps by sorted name)."""
    root = tmp_path_factory.mktemp("extras")
    rng = np.random.default_rng(0)
    number = iter(rng.permutation(2 * CLASSES) + 1)
    for split, count in (("train", 4), ("val", 2)):
        for label in range(CLASSES):
            folder = root / "data" / split / f"c{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                pixels[: 2 + label] = 255
                name = f"ILSVRC2012_val_{next(number):08d}.JPEG" if split == "val" else f"{i}.png"
                Image.fromarray(pixels).save(folder / name, format="JPEG" if split == "val" else "PNG")
    assert main(["train", "--data", f"folder:{root / 'data'}", "--output", str(root / "run"), *TINY]) == 0
    return root


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_real_accuracy_is_timms_and_the_results_file_has_every_image(run, tmp_path, capsys):
    rng = np.random.default_rng(1)
    # per image in sorted file-name order: no label (left out), one, or two
    real = [sorted(rng.choice(CLASSES, size=int(rng.integers(0, 3)), replace=False).tolist())
            for _ in range(2 * CLASSES)]
    real[0] = []
    (tmp_path / "real.json").write_text(json.dumps(real))
    results = tmp_path / "out" / "results.csv"
    assert main(["eval", str(run / "run" / "last.safetensors"), "--data", f"folder:{run / 'data'}", *EVAL,
                 "--real-labels", str(tmp_path / "real.json"), "--results", str(results), "--topk", str(CLASSES),
                 "--output", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    rows = _rows(results)
    assert len(rows) == 2 * CLASSES and list(rows[0])[:4] == ["file", "label", "class_1", "prob_1"]
    names = [f"c{i}" for i in range(CLASSES)]
    probs = np.array([[float(row[f"prob_{k}"]) for k in range(1, CLASSES + 1)] for row in rows])
    assert (np.diff(probs, axis=1) <= 0).all() and np.allclose(probs.sum(axis=1), 1.0, atol=1e-4)
    top1 = 100.0 * np.mean([row["class_1"] == row["label"] for row in rows])
    assert summary["top1"] == pytest.approx(top1)
    assert [row["label"] for row in rows] == sorted(row["label"] for row in rows)  # the dataset's order

    # timm's evaluator on the same predictions: a score per class from the file's ranking
    scores = torch.tensor([[CLASSES - [row[f"class_{k}"] for k in range(1, CLASSES + 1)].index(name)
                            for name in names] for row in rows], dtype=torch.float32)
    timm_real = RealLabelsImagenet([row["file"] for row in rows], real_json=str(tmp_path / "real.json"))
    timm_real.add_result(scores)
    assert summary["real_top1"] == pytest.approx(timm_real.get_accuracy(1))
    assert summary["real_top5"] == pytest.approx(timm_real.get_accuracy(5))
    assert f"ImageNet-ReaL top-1 {summary['real_top1']:.2f}%" in out and f"per-image results: {results}" in out


def test_a_valid_label_subset_scores_the_models_logits_on_those_classes(run, tmp_path, capsys):
    subset = [1, 3, 4]
    for label in subset:  # ImageNet-A's layout: a folder of some of the model's classes
        shutil.copytree(run / "data" / "val" / f"c{label}", tmp_path / "sub" / "val" / f"c{label}")
    (tmp_path / "valid.txt").write_text("".join(f"{i}\n" for i in subset))
    full = tmp_path / "full.csv"
    assert main(["eval", str(run / "run" / "last.safetensors"), "--data", f"folder:{run / 'data'}", *EVAL,
                 "--results", str(full), "--topk", str(CLASSES)]) == 0
    assert main(["eval", str(run / "run" / "last.safetensors"), "--data", f"folder:{tmp_path / 'sub'}", *EVAL,
                 "--valid-labels", str(tmp_path / "valid.txt"), "--output", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    # the expected: each subset image's most probable class among the subset's, from the full model's ranking
    ranked = {row["file"]: [row[f"class_{k}"] for k in range(1, CLASSES + 1)] for row in _rows(full)
              if row["label"] in {f"c{i}" for i in subset}}
    right = [next(c for c in ranking if c in {f"c{i}" for i in subset}) == file.split("/")[-2]
             for file, ranking in ranked.items()]
    assert summary["images"] == 2 * len(subset) and summary["top1"] == pytest.approx(100.0 * np.mean(right))
    capsys.readouterr()

    (tmp_path / "wrong.txt").write_text("0\n3\n4\n")  # the model's c0 is not the data's c1
    assert main(["eval", str(run / "run" / "last.safetensors"), "--data", f"folder:{tmp_path / 'sub'}", *EVAL,
                 "--valid-labels", str(tmp_path / "wrong.txt")]) == 2
    # the subset's names and the rule (issue 55: the model's unpermuted names were printed before)
    assert "line 1 names model class 0 ('c0') for the dataset's class 0 ('c1')" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "text", "said"), [
    ("--valid-labels", "1\nthree\n", "one class index (a non-negative integer) per line"),
    ("--valid-labels", "1\n1\n4\n", "appears twice"),
    ("--valid-labels", "1\n3\n9\n", "index 9 but the model predicts 6 classes"),
    ("--valid-labels", "1\n3\n", "2 classes but the data has 6"),
    ("--real-labels", '{"a": 1}', "a JSON list with, per image, a list of class indices"),
    ("--real-labels", "[[1], [2]]", "lists 2 images but the split has 12"),
])
def test_a_malformed_label_file_is_one_line(run, tmp_path, capsys, flag, text, said):
    (tmp_path / "labels").write_text(text)
    assert main(["eval", str(run / "run" / "last.safetensors"), "--data", f"folder:{run / 'data'}", *EVAL,
                 flag, str(tmp_path / "labels")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err


def test_on_a_gpu_the_extras_read_the_device_once_after_the_last_batch(run, tmp_path):
    """The top-k of every batch stays on the device; one copy back at the end (tests/fakecuda.py)."""
    from fakecuda import fake_cuda

    from resmlp.evaluation import evaluate

    (tmp_path / "valid.txt").write_text("".join(f"{i}\n" for i in range(CLASSES)))
    with fake_cuda() as ledger:
        evaluate(run / "run" / "last.safetensors", data=f"folder:{run / 'data'}", split="val", device="cuda",
                 batch_size=4, num_workers=0, valid_labels=tmp_path / "valid.txt", results=tmp_path / "r.csv")
    sites = [e.site().split(":")[1] for e in ledger.events if e.kind in ("read", "device-to-host")]
    assert sites == ["classify", "TopKRecorder.read"], sites

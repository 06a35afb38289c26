"""Model selection never looks at the test set: a validation split carved from train where the dataset has
none, per-epoch metrics and `best` on it, the test split scored once at the end for the selected checkpoint."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from test_data import write_idx

from resmlp.cli import main
from resmlp.data.arrays import stratified_split
from resmlp.data.loading.assemble import build_data
from resmlp.train import train
from resmlp.train.config import load_config

TINY = {
    "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0], "data.num_workers": 0,
    "data.crop_pct": 1.0, "model.img_size": 16, "model.patch_size": 4, "model.dim": 32, "model.depth": 2,
    "schedule.epochs": 3, "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.progress": False,
    "optim.lr": 3e-3, "train.threads": 1, "train.compile": False, "train.amp": "none",
}


def test_stratified_split_is_seeded_disjoint_and_keeps_class_shares():
    labels = np.repeat(np.arange(4), [40, 30, 20, 10])
    kept, held = stratified_split(labels, 20, seed=3)
    assert len(held) == 20 and len(kept) == 80 and not set(kept) & set(held)
    assert np.bincount(labels[held]).tolist() == [8, 6, 4, 2]  # 20 % of every class
    assert np.array_equal(held, stratified_split(labels, 20, seed=3)[1])
    assert not np.array_equal(held, stratified_split(labels, 20, seed=4)[1])
    with pytest.raises(ValueError, match="0 < size < 100"):
        stratified_split(labels, 100, seed=0)


@pytest.fixture
def idx_dataset(tmp_path):
    """A Fashion-MNIST-layout folder (train and t10k IDX files): 4 learnable classes of 16x16 images."""
    rng = np.random.default_rng(0)
    templates = rng.uniform(0, 255, (4, 16, 16))
    for split, n in (("train", 160), ("t10k", 48)):
        labels = np.arange(n) % 4
        images = (0.6 * templates[labels] + 0.4 * rng.uniform(0, 255, (n, 16, 16))).astype(np.uint8)
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images, gz=True)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", labels.astype(np.uint8), gz=True)
    return tmp_path


def test_validation_is_carved_from_train_and_test_kept_apart(idx_dataset):
    cfg = load_config("fashion-mnist-quick", {**TINY, "data.dir": str(idx_dataset), "data.val_size": 32})
    data = build_data(cfg.data, 1, 16, 0)
    assert (len(data.train), len(data.val), len(data.test)) == (128, 32, 48)
    assert "32 images carved from train" in data.validation
    train_rows = {row.tobytes() for row in data.train.images}
    assert not any(row.tobytes() in train_rows for row in data.val.images)  # no validation image is trained on
    assert len(data.train_eval) == 128  # DINO's k-NN memory holds no validation image either
    no_val = build_data(load_config("fashion-mnist-quick", {**TINY, "data.dir": str(idx_dataset),
                                                            "data.val_size": 0}).data, 1, 16, 0)
    assert no_val.val is no_val.test and "model selection sees the test set" in no_val.validation


def test_summary_selects_on_validation_and_scores_test_once(idx_dataset, tmp_path):
    out = tmp_path / "run"
    summary = train("fashion-mnist-quick", out, {**TINY, "data.dir": str(idx_dataset), "data.val_size": 32})
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    val_top1 = [float(r["val_top1"]) for r in rows]
    assert summary["selected_epoch"] == 1 + max(range(len(rows)), key=lambda i: (val_top1[i], -i))
    assert summary["val_top1"] == pytest.approx(val_top1[summary["selected_epoch"] - 1])
    assert "carved from train" in summary["validation"]
    # test_top1 is the selected checkpoint on the test split, final_test_top1 the last one: `resmlp eval` agrees
    for key, name in (("test_top1", "best"), ("final_test_top1", "last")):
        assert main(["eval", str(out / f"{name}.safetensors"), "--data-dir", str(idx_dataset), "--output",
                     str(tmp_path / name)]) == 0
        evaluated = json.loads((tmp_path / name / "summary.json").read_text())
        assert evaluated["split"] == "test" and evaluated["images"] == 48
        assert evaluated["test_top1"] == pytest.approx(summary[key], abs=1e-6)


def test_fashion_mnist_has_no_val_split_to_evaluate(idx_dataset, tmp_path):
    from resmlp.data import build_dataset

    with pytest.raises(ValueError, match="no official validation split"):
        build_dataset("fashion-mnist", "val", idx_dataset, 1)


def test_every_split_of_a_permuted_run_sees_the_permutation(idx_dataset):
    """The pixel permutation (the Mixer permutation experiment) reaches the carved validation images, the
    training images and the k-NN memory alike, also on the per-image path (a crop: no batched evaluation)."""
    import torch
    from PIL import Image

    cfg = load_config("fashion-mnist-quick", {**TINY, "data.dir": str(idx_dataset), "data.val_size": 32,
                                              "data.permute": "global", "data.crop_pct": 0.875})
    data = build_data(cfg.data, 1, 16, 0)
    assert data.val_batched is None  # the crop keeps evaluation on the per-image transform
    plain = build_data(load_config("fashion-mnist-quick", {**TINY, "data.dir": str(idx_dataset),
                                                           "data.val_size": 32, "data.crop_pct": 0.875}).data,
                       1, 16, 0)
    image = Image.fromarray(data.val.images[0])
    for split in ("val", "test", "train_eval"):
        permuted, unpermuted = getattr(data, split).transform(image), getattr(plain, split).transform(image)
        assert not torch.equal(permuted, unpermuted), split
        assert torch.equal(permuted.flatten().sort().values, unpermuted.flatten().sort().values), split

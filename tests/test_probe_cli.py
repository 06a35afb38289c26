"""`resmlp eval-knn` / `eval-linear`: >= 95 % on a separable synthetic set, from any checkpoint."""

from __future__ import annotations

import json

import numpy as np
import torch

import resmlp
from resmlp.cli import main
from resmlp.train.probe import knn_accuracy, linear_probe_accuracy


def test_knn_and_linear_on_separable_features():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(5, 16)) * 4
    y_train, y_test = rng.integers(0, 5, 300), rng.integers(0, 5, 100)
    x_train, x_test = centres[y_train] + rng.normal(size=(300, 16)), centres[y_test] + rng.normal(size=(100, 16))
    assert knn_accuracy(x_train, y_train, x_test, y_test) >= 95
    assert linear_probe_accuracy(x_train, y_train, x_test, y_test) >= 95
    assert knn_accuracy(x_train, rng.permutation(y_train), x_test, y_test) < 60  # labels matter


def test_cli_on_a_checkpoint_whose_features_separate_the_synthetic_set(tmp_path, capsys):
    # synthetic classes are fixed templates plus noise: a random near-identity ResMLP keeps them apart
    torch.manual_seed(0)
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=0, dim=64, depth=1)
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "interpolation": "bicubic", "mean": [0.5],
                           "std": [0.25], "in_chans": 1}}
    resmlp.save(model, tmp_path / "m.safetensors", meta)
    for method, key in (("knn", "knn_top1"), ("linear", "linear_top1")):
        out = tmp_path / method
        assert main([f"eval-{method}", str(tmp_path / "m.safetensors"), "--data", "synthetic", "--output",
                     str(out)]) == 0
        summary = json.loads((out / "summary.json").read_text())
        assert summary[key] >= 95, summary
        assert summary["precision"] == summary["host"]["precision"] in ("fp32", "bf16")  # what produced it
        assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])[key] == summary[key]


def test_feature_precision_is_the_one_asked_for_and_fp32_matches_the_plain_model(tmp_path, capsys):
    from resmlp.inference import optimize_features
    from resmlp.train.probe import extract_features

    torch.manual_seed(1)
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=3, dim=32, depth=2)
    images, labels = torch.randn(40, 1, 16, 16), torch.arange(40) % 3
    batches = [(images[:25], labels[:25]), (images[25:], labels[25:])]
    feats, got_labels = extract_features(optimize_features(model), batches)
    with torch.no_grad():
        want = model.forward_head(model.forward_features(images), pre_logits=True)
    np.testing.assert_allclose(feats.numpy(), want.numpy(), atol=1e-4)
    assert torch.equal(got_labels, labels) and model.training is False
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "interpolation": "bicubic", "mean": [0.5],
                           "std": [0.25], "in_chans": 1}}
    resmlp.save(model, tmp_path / "m.safetensors", meta)
    assert main(["eval-knn", str(tmp_path / "m.safetensors"), "--data", "synthetic", "--amp", "none",
                 "--output", str(tmp_path / "out")]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["precision"] == "fp32" and summary["host"]["cpu_capability"]


def test_knn_progress_has_a_total_and_no_progress_silences_it(tmp_path, capsys):
    import re

    from resmlp.cli import build_parser
    from resmlp.commands.common import training_overrides

    torch.manual_seed(0)
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=0, dim=16, depth=1)
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "interpolation": "bicubic", "mean": [0.5],
                           "std": [0.25], "in_chans": 1}}
    ckpt = str(resmlp.save(model, tmp_path / "m.safetensors", meta))
    assert main(["eval-knn", ckpt, "--data", "synthetic", "--batch-size", "100"]) == 0
    err = capsys.readouterr().err
    # synthetic: 256 train and 64 test images -> 3 and 1 batches of 100, each bar with its total (and so an ETA);
    # plain lines here, where stderr is no terminal
    assert re.search(r"features train: 3/3 batch \(100%\)", err)
    assert re.search(r"features test: 1/1 batch \(100%\)", err)
    assert main(["eval-knn", ckpt, "--data", "synthetic", "--no-progress"]) == 0
    assert "features" not in capsys.readouterr().err
    args = build_parser().parse_args(["train", "--output", "x", "--no-progress"])
    assert training_overrides(args) == {"train.progress": False}


def test_accuracies_are_the_exact_percentages_of_counts():
    # 7 of 25 right: 28 %, as 100 * 7 / 25 gives it (0.28 * 100 was 28.000000000000004 in summary.json)
    train_x = np.array([[1.0, 0.0], [0.0, 1.0]] * 10, dtype=np.float32)
    train_y = np.array([0, 1] * 10)
    test_x = np.array([[1.0, 0.0]] * 7 + [[0.0, 1.0]] * 18, dtype=np.float32)
    test_y = np.zeros(25, dtype=np.int64)  # the 18 that look like class 1 are labelled 0: wrong
    assert knn_accuracy(train_x, train_y, test_x, test_y, k=1) == 28.0
    assert linear_probe_accuracy(train_x, train_y, test_x, test_y) == 28.0


def test_the_linear_probes_fit_says_it_is_running_unless_progress_is_off(tmp_path, capsys):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=0, dim=16, depth=1)
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "interpolation": "bicubic", "mean": [0.5],
                           "std": [0.25], "in_chans": 1}}
    ckpt = str(resmlp.save(model, tmp_path / "m.safetensors", meta))
    assert main(["eval-linear", ckpt, "--data", "synthetic"]) == 0
    assert "fitting the linear probe on 256 features of 16 dimensions" in capsys.readouterr().err  # before: silent
    assert main(["eval-linear", ckpt, "--data", "synthetic", "--no-progress"]) == 0
    assert "fitting" not in capsys.readouterr().err

"""The training loop end to end on tiny synthetic data: outputs, learning, accumulation, faults, eval."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import assert_same_training
from PIL import Image

import resmlp
from resmlp.cli import main
from resmlp.runtime import DistInfo
from resmlp.train import NonFiniteLossError, train
from resmlp.train.config import load_config
from resmlp.train.losses import SupervisedLoss, supervised_loss
from resmlp.train.task_registry import task_for
from resmlp.train.tasks import SupervisedTask
from resmlp.train.trainer import Trainer

TINY = {
    "data.kind": "synthetic", "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0],
    "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16, "model.patch_size": 4, "model.dim": 32,
    "model.depth": 2, "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 16,
    "train.progress": False, "optim.lr": 3e-3, "data.synthetic_size": [128, 64], "train.threads": 1,
}
CPU = DistInfo(1, 0, 0, torch.device("cpu"))


def test_train_writes_everything_and_learns(tmp_path):
    out = tmp_path / "run"
    summary = train("fashion-mnist-quick", out, overrides={**TINY, "schedule.epochs": 3})
    for key in ("test_top1", "test_top5", "epochs", "wall_seconds", "checkpoint"):
        assert key in summary
    assert json.loads((out / "summary.json").read_text()) == summary
    assert summary["epochs"] == 3 and summary["test_top1"] > 60  # 4 classes: chance is 25%
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    assert [int(r["epoch"]) for r in rows] == [1, 2, 3]
    assert float(rows[-1]["train_loss"]) < float(rows[0]["train_loss"])
    assert (out / "learning_curves.png").stat().st_size > 1000
    assert any((out / "tensorboard").iterdir())
    meta = resmlp.read_metadata(summary["checkpoint"])
    assert meta["class_names"] == [f"class_{i}" for i in range(4)] and meta["dataset"] == "synthetic"
    assert meta["preprocess"] == dict(img_size=16, crop_pct=1.0, interpolation="bicubic", mean=[0.5], std=[0.25],
                                      in_chans=1)
    model = resmlp.load(summary["checkpoint"])
    assert model.config.num_classes == 4 and model.config.in_chans == 1
    # `resmlp eval` on the same data reproduces the run's accuracy and writes the same keys
    assert main([*f"eval {summary['checkpoint']} --data synthetic --output {tmp_path / 'ev'}".split()]) == 0
    evaluated = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert evaluated["test_top1"] == pytest.approx(summary["test_top1"], abs=1e-6)
    assert set(evaluated["per_class_top1"]) == set(meta["class_names"])
    assert (tmp_path / "ev" / "confusion_matrix.png").is_file()
    # an existing run is never overwritten by accident
    with pytest.raises(ValueError, match="already holds a run.*--resume"):
        train("fashion-mnist-quick", out, overrides=TINY)
    with pytest.raises(ValueError, match=r"different settings:\n  optim.name: was 'adamw', now 'sgd'"):
        train("fashion-mnist-quick", out, overrides={**TINY, "schedule.epochs": 3, "optim.name": "sgd"}, resume=True)
    with pytest.raises(ValueError, match="extend a run, not shorten it"):
        train("fashion-mnist-quick", out, overrides=TINY, resume=True)  # 2 epochs < the run's 3


def test_no_weight_decay_on_affine_layerscale_bias():
    cfg = load_config("fashion-mnist-quick", {**TINY, "optim.weight_decay": 0.2})
    trainer = Trainer(cfg, Path("/nonexistent-run"), CPU, False, task_for(cfg))
    decay_of = {id(p): g["weight_decay"] for g in trainer.optimizer.param_groups for p in g["params"]}
    for name, p in trainer.model.named_parameters():
        expected = 0.0 if p.ndim <= 1 else 0.2
        assert decay_of[id(p)] == expected, name
    assert any(n.endswith(".alpha") for n, _ in trainer.model.named_parameters())


@pytest.mark.parametrize(("name", "eps", "expected"), [("lamb", 1e-8, 1e-8), ("lamb", None, 1e-6),
                                                      ("adamw", 1e-7, 1e-7)])
def test_optimizer_epsilon_from_the_config(name, eps, expected):
    # the `deit` recipe's LAMB epsilon is DeiT main.py's --opt-eps 1e-8; unset, timm's default for the optimizer
    cfg = load_config("fashion-mnist-quick", {**TINY, "optim.name": name, "optim.eps": eps})
    trainer = Trainer(cfg, Path("/nonexistent-run"), CPU, False, task_for(cfg))
    assert {g["eps"] for g in trainer.optimizer.param_groups} == {expected}


def initial_weights(overrides: dict) -> dict[str, torch.Tensor]:
    """The weights a run with these overrides starts from (same seed, same construction as train())."""
    cfg = load_config("fashion-mnist-quick", overrides)
    model = Trainer(cfg, Path("/nonexistent-run"), CPU, False, task_for(cfg)).model
    return {k: v.clone() for k, v in model.state_dict().items()}


# bf16: the path `amp: auto` takes on AVX-512 BF16 hosts (hosttype: .ci/run reruns it emulated, as on AVX2)
@pytest.mark.parametrize("amp", ["none", pytest.param("bf16", marks=pytest.mark.hosttype)])
def test_grad_accumulation_matches_the_full_batch(tmp_path, amp):
    base = {**TINY, "schedule.epochs": 1, "train.amp": amp, "optim.name": "sgd", "optim.lr": 0.05,
            "train.compile": False}
    train("fashion-mnist-quick", tmp_path / "a", overrides=base)
    train("fashion-mnist-quick", tmp_path / "b", overrides={**base, "train.grad_accum": 2})
    a, b = resmlp.load(tmp_path / "a" / "last.safetensors"), resmlp.load(tmp_path / "b" / "last.safetensors")
    assert_same_training(initial_weights(base), a.state_dict(), b.state_dict(), amp, "grad_accum=2")
    # the reported loss is the mean per image either way, not summed over the accumulated micro-batches
    losses = [float((tmp_path / run / "metrics.csv").read_text().splitlines()[1].split(",")[1]) for run in "ab"]
    assert losses[1] == pytest.approx(losses[0], rel=0.02)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    calls = {"n": 0}
    supervised = torch.nn.CrossEntropyLoss()

    def loss_fn(model, images, targets):  # a task's loss; turns NaN at the 4th step
        calls["n"] += 1
        loss = supervised(model(images), targets)
        return loss * float("nan") if calls["n"] == 4 else loss

    class NaNAtStepFour(SupervisedTask):
        def build_loss(self, trainer, num_classes):
            return loss_fn

    out = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"loss or gradients became NaN/infinite at epoch 1, step 4 .*"
                                                 r"update was skipped.*last.pth is intact"):
        # the loss is read on the host only every 1000 steps: the next read (before the step-6 checkpoint) stops
        # the run, naming step 4, and that checkpoint is never written
        overrides = {**TINY, "train.checkpoint_every_steps": 3, "train.log_every_steps": 1000}
        train("fashion-mnist-quick", out, overrides=overrides,
              task=NaNAtStepFour(load_config("fashion-mnist-quick", overrides)))
    state = torch.load(out / "last.pth", weights_only=True)
    assert state["global_step"] == 3 and state["step_in_epoch"] == 3
    assert all(torch.isfinite(v).all() for v in state["model"].values())


def test_supervised_loss_with_mixup_handles_odd_batches():
    cfg = load_config("fashion-mnist-quick", {**TINY, "data.mixup": 0.8, "data.cutmix": 1.0,
                                              "loss.label_smoothing": 0.1})
    loss = supervised_loss(cfg, 4)
    assert isinstance(loss, SupervisedLoss) and loss.mixup is not None
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1)
    value = loss(model, torch.randn(5, 1, 16, 16), torch.tensor([0, 1, 2, 3, 0]))
    assert value.ndim == 0 and torch.isfinite(value)


def test_folder_with_corrupt_images_trains_and_counts_them(tmp_path):
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in ("a", "b"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(4 if split == "val" else 7):
                pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / split / c / f"{i}.png")
    for i in range(2):
        (tmp_path / "train" / "a" / f"bad{i}.jpg").write_bytes(b"garbage")
    overrides = {**TINY, "data.kind": "folder", "data.dir": str(tmp_path), "schedule.epochs": 1,
                 "train.batch_size": 4, "model.in_chans": 3, "data.mean": None, "data.std": None}
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        summary = train("fashion-mnist-quick", tmp_path / "run", overrides=overrides)
    row = next(csv.DictReader((tmp_path / "run" / "metrics.csv").read_text().splitlines()))
    assert int(row["skipped_train_images"]) == 2 and int(row["skipped_val_images"]) == 0
    assert summary["epochs"] == 1


def test_runtime_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="fp16 runs on a CUDA GPU only"):
        train("fashion-mnist-quick", tmp_path / "a", overrides={**TINY, "train.amp": "fp16", "train.device": "cpu"})
    with pytest.raises(ValueError, match="divisible by processes x grad_accum"):
        train("fashion-mnist-quick", tmp_path / "b", overrides={**TINY, "train.grad_accum": 3})
    with pytest.raises(ValueError, match="model.num_classes=10 but the dataset has 4"):
        train("fashion-mnist-quick", tmp_path / "c", overrides={**TINY, "model.num_classes": 10})
    with pytest.raises(FileNotFoundError, match="nothing to resume"):
        train("fashion-mnist-quick", tmp_path / "d", overrides=TINY, resume=True)
    assert main(["train", "--output", str(tmp_path / "e"), "--set", "optim.lrr=1"]) == 2


def test_deit_recipe_runs_with_every_augmentation(tmp_path):
    overrides = {**TINY, "data.kind": "synthetic", "data.dir": None, "model.in_chans": 3, "model.name": "resmlp_s12",
                 "data.synthetic_size": [32, 16], "data.num_workers": 0, "schedule.epochs": 1,
                 "schedule.warmup_epochs": 0, "train.batch_size": 8, "train.ema": True, "train.clip_grad": 1.0,
                 "data.crop_pct": 0.875, "data.scale": [0.08, 1.0], "data.ratio": [0.75, 1.3333]}
    del overrides["optim.lr"]  # keep the recipe's: 5e-3 for a global batch of 2048
    cfg = load_config("deit", overrides)
    assert cfg.data.mixup == 0.8 and cfg.data.repeated_aug == 3 and cfg.data.auto_augment
    summary = train(cfg, tmp_path / "run")
    assert summary["epochs"] == 1 and summary["lr"] == pytest.approx(5e-3 * 8 / 2048)
    assert resmlp.read_metadata(summary["checkpoint"])["preprocess"]["crop_pct"] == 0.875


@pytest.mark.parametrize("amp", ["none", "bf16"])
@pytest.mark.parametrize("switch", [pytest.param("train.compile", marks=pytest.mark.slow), "train.channels_last"])
def test_compile_and_channels_last_train_the_same_weights(tmp_path, switch, amp):
    """torch.compile (the quickstart uses it) and channels-last change speed, not the result.

    Plain SGD: an Adam-type update divides by the root of the second moment, so where a gradient is near zero
    a rounding difference becomes a full-size step, and "the same weights" would hold on one CPU and not another.
    """
    overrides = {**TINY, "schedule.epochs": 1, "data.synthetic_size": [64, 16], "model.drop_path_rate": 0.0,
                 "train.amp": amp, "optim.name": "sgd", "optim.lr": 0.05, "train.compile": False}
    plain = train("fashion-mnist-quick", tmp_path / "plain", overrides=overrides)
    switched = train("fashion-mnist-quick", tmp_path / "switched", overrides={**overrides, switch: True})
    a, b = resmlp.load(plain["checkpoint"]).state_dict(), resmlp.load(switched["checkpoint"]).state_dict()
    assert_same_training(initial_weights(overrides), a, b, amp, switch)
    assert plain["test_top1"] == pytest.approx(switched["test_top1"], abs=100 / 16 + 1e-6)  # at most 1 of 16

"""DINO pre-training on the engine: loss goes down, the EMA teacher moves without gradients, the last
layer is frozen in the first epoch only, summary.json has knn_top1, and the CLI runs end to end."""

from __future__ import annotations

import json

import torch

import resmlp
from resmlp.cli import main
from resmlp.runtime import DistInfo
from resmlp.train import pretrain_dino
from resmlp.train.config import load_config
from resmlp.train.dino import DINOTask
from resmlp.train.trainer import Trainer

TINY = {
    "data.kind": "synthetic", "data.num_workers": 0, "data.crop_pct": 1.0, "data.synthetic_size": [64, 32],
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 32, "model.depth": 2, "schedule.epochs": 2,
    "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.progress": False, "train.threads": 1,
    "optim.lr": 1e-3, "dino.out_dim": 64, "dino.hidden_dim": 32, "dino.bottleneck_dim": 16, "dino.num_local": 2,
    "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0, "train.compile": False,
}
CPU = DistInfo(1, 0, 0, torch.device("cpu"))


def _params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_dino_steps_teacher_ema_and_frozen_last_layer(tmp_path):
    cfg = load_config("dino-fashion-mnist", TINY)
    task = DINOTask(cfg)
    trainer = Trainer(cfg, tmp_path / "run", CPU, False, task)
    trainer.t0 = 0.0
    teacher = task.teacher.module
    assert all(not p.requires_grad for p in teacher.parameters())
    last = trainer.model.head.last_layer.parametrizations.weight.original1
    last0, teacher0, student0 = last.detach().clone(), _params(teacher), _params(trainer.model.backbone)
    trainer._train_epoch()  # epoch 0: 4 steps
    assert torch.equal(last, last0), "the last layer must not move during the first epoch"
    assert not torch.equal(_params(trainer.model.backbone)["stem.proj.weight"], student0["stem.proj.weight"])
    moved = _params(teacher)
    assert any(not torch.equal(moved[k], teacher0[k]) for k in teacher0), "the EMA teacher must move"
    assert all(p.grad is None for p in teacher.parameters())
    decays = sorted({g["weight_decay"] for g in trainer.optimizer.param_groups})
    assert decays == [0.0, task.weight_decay[3]] and task.weight_decay[3] > cfg.optim.weight_decay  # rising
    trainer.epoch = 1
    trainer.step_in_epoch = 0
    trainer._train_epoch()
    assert not torch.equal(last, last0), "the last layer learns after the first epoch"


def test_dino_loss_decreases_and_summary_has_knn(tmp_path):
    summary = pretrain_dino("dino-fashion-mnist", tmp_path / "run", {**TINY, "schedule.epochs": 3})
    text = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = text[0].split(",")
    losses = [float(line.split(",")[header.index("train_loss")]) for line in text[1:]]
    assert losses[-1] < losses[0]
    assert 0 <= summary["knn_top1"] <= 100 and json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    backbone = resmlp.load(summary["checkpoint"])
    assert backbone.config.num_classes == 0 and backbone(torch.zeros(1, 1, 16, 16)).shape == (1, 32)
    assert resmlp.read_metadata(summary["checkpoint"])["preprocess"]["img_size"] == 16


def test_pretrain_cli(tmp_path, capsys):
    args = ["pretrain", "dino", "--output", str(tmp_path / "run"), "--epochs", "1"]
    sets = [f"--set={k}={v}" for k, v in {**TINY, "data.synthetic_size": [32, 16]}.items() if k != "schedule.epochs"]
    assert main(args + sets) == 0
    assert "k-NN top-1" in capsys.readouterr().out
    assert "knn_top1" in json.loads((tmp_path / "run" / "summary.json").read_text())


def test_knn_evaluation_is_batched_exactly_and_shows_progress(tmp_path, capsys):
    # the k-NN memory and queries go through the batched evaluation path where it is exact (in-memory
    # images at the model's size), with a progress bar; the per-image path gives the same accuracy
    scores = {}
    for batched in (True, False):
        cfg = load_config("dino-fashion-mnist", {**TINY, "train.progress": True, "data.batch_augment": batched})
        task = DINOTask(cfg)
        trainer = Trainer(cfg, tmp_path / f"run{batched}", CPU, False, task)
        assert (trainer.data.val_batched is not None) == batched
        capsys.readouterr()
        scores[batched] = task.evaluate(trainer, task.teacher.module.backbone)[1]
        assert "k-NN features (memory)" in capsys.readouterr().err
    # the two paths agree to float rounding, which may flip at most a near-tied query on another CPU
    assert abs(scores[True] - scores[False]) <= 100 / len(trainer.data.val)

"""Fine-tuning: from our/timm-format/DINO checkpoints, new head, resolution change, freezing, layer decay,
and the errors that must come before any step."""

from __future__ import annotations

import json

import pytest
import timm
import torch

import resmlp
from resmlp.checkpoint import export_checkpoint
from resmlp.cli import main
from resmlp.runtime import DistInfo
from resmlp.train import finetune
from resmlp.train.config import load_config
from resmlp.train.task_registry import task_for
from resmlp.train.tasks import FinetuneTask
from resmlp.train.trainer import Trainer

TINY = {
    "data.kind": "synthetic", "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0],
    "data.num_workers": 0, "data.crop_pct": 1.0, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
    "train.batch_size": 16, "train.progress": False, "optim.lr": 3e-3, "data.synthetic_size": [64, 32],
    "train.threads": 1,
}
CPU = DistInfo(1, 0, 0, torch.device("cpu"))


@pytest.fixture
def source(tmp_path):
    torch.manual_seed(0)
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=7, dim=32, depth=3)
    path = tmp_path / "src.safetensors"
    resmlp.save(model, path)
    return model, path


def _trainer(tmp_path, path, overrides=None, **finetune_kw):
    """A fine-tuning run's trainer: the checkpoint is the model (model.name), the recipe's architecture keys go."""
    raw = load_config("fashion-mnist-quick", {**TINY, **(overrides or {})}).to_dict()
    raw["model"] = {"name": str(path)}
    raw["finetune"] = finetune_kw
    cfg = load_config(raw)
    task = task_for(cfg)
    assert isinstance(task, FinetuneTask) and cfg.task_name == "finetune"
    return Trainer(cfg, tmp_path / "run", CPU, False, task)


def test_weights_carried_new_head_and_freezing(tmp_path, source):
    model, path = source
    trainer = _trainer(tmp_path, path, freeze=2)
    ft = trainer.model
    assert ft.head.out_features == 4  # the synthetic dataset's classes, not the checkpoint's 7
    assert torch.equal(ft.blocks[2].channel_mlp.fc1.weight, model.blocks[2].channel_mlp.fc1.weight)
    frozen = [n for n, p in ft.named_parameters() if not p.requires_grad]
    assert frozen and all(n.startswith(("stem", "blocks.0.", "blocks.1.")) for n in frozen)
    optimised = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert not any(id(p) in optimised for p in ft.parameters() if not p.requires_grad)
    head_only = _trainer(tmp_path / "h", path, freeze="all-but-head").model
    assert {n for n, p in head_only.named_parameters() if p.requires_grad} == {"head.weight", "head.bias"}


def test_layer_decay_gives_deeper_layers_larger_lr(tmp_path, source):
    _, path = source
    trainer = _trainer(tmp_path, path, {"optim.layer_decay": 0.5})
    scales = sorted({g["lr_scale"] for g in trainer.optimizer.param_groups})
    assert len(scales) >= 4 and scales[-1] == 1.0 and scales[0] == pytest.approx(0.5 ** (len(scales) - 1))


def test_finetune_cli_resolution_change_and_timm_format(tmp_path, source):
    model, path = source
    timm_file = tmp_path / "timm.pth"
    export_checkpoint(model, timm_file, format="timm")
    out = tmp_path / "run"
    sets = [f"--set={k}={v}" for k, v in TINY.items()]
    assert main(["finetune", str(timm_file), "--output", str(out), "--img-size", "24", "--layer-decay", "0.75",
                 "--freeze", "1"] + sets) == 0
    summary = json.loads((out / "summary.json").read_text())
    tuned = resmlp.load(summary["checkpoint"])
    assert tuned.config.img_size == 24 and tuned.config.num_classes == 4 and tuned.config.dim == 32
    assert summary["test_top1"] >= 0 and resmlp.read_metadata(summary["checkpoint"])["preprocess"]["img_size"] == 24


def test_errors_come_before_any_step(tmp_path, source):
    _, path = source
    with pytest.raises(ValueError, match="not a multiple of the patch size"):
        finetune(path, "fashion-mnist-quick", tmp_path / "a", TINY, img_size=18)
    convnet = timm.create_model("resnet10t", in_chans=1, num_classes=4)
    resmlp.save(convnet, tmp_path / "cnn.safetensors")
    with pytest.raises(ValueError, match="counting blocks is for ResMLP/Mixer"):
        finetune(tmp_path / "cnn.safetensors", "fashion-mnist-quick", tmp_path / "b", TINY, freeze=1)
    with pytest.raises(ValueError, match="has 3 blocks"):
        finetune(path, "fashion-mnist-quick", tmp_path / "c", TINY, freeze=5)
    assert not any((tmp_path / d / "last.pth").exists() for d in "abc")


def test_a_timm_models_checkpoint_finetunes_with_a_new_head_and_its_dropout(tmp_path):
    convnet = timm.create_model("resnet10t", in_chans=1, num_classes=7)
    resmlp.save(convnet, tmp_path / "cnn.safetensors", metadata={"preprocess": {"img_size": 16, "in_chans": 1,
                                                                               "mean": [0.5], "std": [0.25]}})
    summary = finetune(tmp_path / "cnn.safetensors", "fashion-mnist-quick", tmp_path / "ft",
                       {**TINY, "model.drop_rate": 0.1}, freeze="all-but-head")
    tuned = resmlp.load(summary["checkpoint"])
    assert isinstance(tuned, timm.models.ResNet) and tuned.num_classes == 4 and tuned.drop_rate == 0.1
    # frozen but the head: the trunk is the checkpoint's, the head learned
    assert torch.equal(tuned.conv1[0].weight, convnet.conv1[0].weight)
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["data"]["mean"] == [0.5]
    assert resmlp.read_metadata(summary["checkpoint"])["preprocess"]["img_size"] == 16

"""Published weights named as timm names them (resmlp_s12.fb_in1k) and `train --pretrained`, in every command
that takes a model. Never the network: the Hugging Face cache is a folder made here (HF_HOME), with a small
model's weights in timm's layout where timm's copy would be, and HF_HUB_OFFLINE=1 throughout."""

from __future__ import annotations

import json

import pytest
import torch

import resmlp
from resmlp.build import parse_model_name
from resmlp.cli import main
from resmlp.models.resmlp import ResMLP, ResMLPConfig

COMMIT = "0123456789abcdef0123456789abcdef01234567"
SMALL = ResMLPConfig(img_size=16, patch_size=4, dim=16, depth=2, num_classes=5)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An HF_HOME whose cache holds resmlp_s12.fb_in1k's file (timm/resmlp_12_224.fb_in1k) as the Hub layout
    keeps it; offline."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hf" / "hub" / "models--timm--resmlp_12_224.fb_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    model = ResMLP(SMALL).eval()
    resmlp.export_checkpoint(model, repo / "snapshots" / COMMIT / "model.safetensors", format="timm")
    return model


def test_a_tag_names_the_cached_file(hub, tmp_path):
    name = parse_model_name("resmlp_s12.fb_in1k")
    assert name.kind == "file" and name.name.endswith(f"snapshots/{COMMIT}/model.safetensors")
    assert parse_model_name("runs/x/best.safetensors").kind == "file"  # a file's name is no tag
    assert parse_model_name("resmlp_s12").kind == "preset"
    loaded = resmlp.load(name.name)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), hub(x))


def test_export_analyze_and_benchmark_take_a_tag(hub, tmp_path, capsys):
    assert main(["export", "resmlp_s12.fb_in1k", "--output", str(tmp_path / "m.pt")]) == 0
    assert "input (batch, 3, 16, 16)" in capsys.readouterr().out
    assert main(["analyze", "resmlp_s12.fb_in1k", "--out", str(tmp_path / "an"), "--no-progress"]) == 0
    assert (tmp_path / "an" / "sparsity.json").is_file()
    from resmlp.analysis.benchmark import build_model, parse_spec

    model, shape = build_model(parse_spec("resmlp_s12.fb_in1k"))
    assert shape == (3, 16, 16) and model.config.dim == 16  # the cached weights' model


def test_train_pretrained_starts_from_the_published_weights(hub, tmp_path, capsys):
    flags = ["--set", "data.kind=synthetic", "--set", "data.synthetic_size=[32,16]", "--batch-size", "8",
             "--set", "data.num_workers=0", "--epochs", "1", "--warmup-epochs", "0", "--threads", "1", "--no-progress"]
    assert main(["train", "--model", "resmlp_s12", "--pretrained", "--output", str(tmp_path / "d"), "--dry-run",
                 *flags]) == 0
    out = capsys.readouterr().out
    assert "name: resmlp_s12.fb_in1k" in out and "(task finetune)" in out and "0.01 M parameters, 4 classes" in out
    assert main(["train", "--model", "resmlp_s12", "--pretrained", "--output", str(tmp_path / "r"), "--max-steps",
                 "1", *flags]) == 0
    assert main(["finetune", "resmlp_s12", "--pretrained", "--output", str(tmp_path / "f"), "--max-steps", "1",
                 *flags]) == 0
    assert "continue it with: resmlp finetune resmlp_s12.fb_in1k --output" in capsys.readouterr().out
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["model"]["name"] == "resmlp_s12.fb_in1k" and config["task"] is None  # the tag, not a path
    state = torch.load(tmp_path / "r" / "last.pth", weights_only=True)
    assert state["model"]["blocks.1.channel_mlp.fc1.weight"].shape == (64, 16)  # the cached weights' model


def test_offline_without_the_file_is_one_line_naming_the_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["eval", "resmlp_s12.fb_in1k", "--data", "synthetic"]) == 2
    err = capsys.readouterr().err.strip()
    cache = tmp_path / "empty" / "hub" / "models--timm--resmlp_12_224.fb_in1k"
    assert len(err.splitlines()) == 1 and str(cache) in err and "HF_HUB_OFFLINE=1" in err
    assert main(["train", "--model", "resmlp_s12.fb_in1k", "--output", str(tmp_path / "r")]) == 2
    assert str(cache) in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_unknown_tags_and_presets_without_weights(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["export", "resmlp_s12.fb_nope", "--output", str(tmp_path / "m.pt")]) == 2
    assert "fb_in1k" in capsys.readouterr().err  # the tags there are
    assert main(["train", "--model", "resmlp_s12_p8", "--pretrained", "--output", str(tmp_path / "r")]) == 2
    assert "resmlp_s12_p8 has no published weights" in capsys.readouterr().err
    assert main(["train", "--model", "timm:resnet10t", "--pretrained", "--output", str(tmp_path / "r")]) == 2
    assert "--pretrained takes a preset's published weights" in capsys.readouterr().err

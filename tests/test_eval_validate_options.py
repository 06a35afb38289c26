"""`resmlp eval` takes timm validate.py's model options (issue 56 item 4): --use-ema (timm's state_dict_ema, DeiT's
model_ema, a run's EMA), -b, --img-size, --interpolation, --torchcompile, and hf-hub:ORG/NAME model names read
from the local Hugging Face cache (offline; absent: one line naming the folder and the file to place)."""

from __future__ import annotations

import json

import pytest
import torch

import resmlp
from resmlp.build import parse_model_name
from resmlp.cli import main
from resmlp.eval_options import ema_checkpoint_key
from resmlp.inference import load_for_inference
from resmlp.models.resmlp import ResMLP, ResMLPConfig
from resmlp.train import train

SMALL = ResMLPConfig(img_size=16, patch_size=4, dim=16, depth=2, num_classes=5)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
RUN = {"data.kind": "synthetic", "data.synthetic_size": [16, 8], "data.num_workers": 0, "model.img_size": 16,
       "model.patch_size": 4, "model.dim": 16, "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
       "train.batch_size": 8, "train.progress": False, "train.threads": 1, "train.compile": False,
       "train.amp": "none"}


def _two_weight_sets() -> tuple[ResMLP, ResMLP]:
    torch.manual_seed(0)
    return ResMLP(SMALL).eval(), ResMLP(SMALL).eval()


@pytest.mark.parametrize("layout,raw_key,ema_key", [("deit", "model", "model_ema"),
                                                    ("timm", "state_dict", "state_dict_ema")])
def test_use_ema_loads_the_files_ema_entry(tmp_path, layout, raw_key, ema_key):
    raw, ema = _two_weight_sets()
    files = {}
    for name, model in (("raw", raw), ("ema", ema)):
        resmlp.export_checkpoint(model, tmp_path / f"{name}.pth", format="deit" if layout == "deit" else "timm")
        files[name] = torch.load(tmp_path / f"{name}.pth", weights_only=True)
    inner = (lambda f: f["model"]) if layout == "deit" else (lambda f: f)
    path = tmp_path / "checkpoint.pth"
    torch.save({raw_key: inner(files["raw"]), ema_key: inner(files["ema"]), "epoch": 3}, path)
    assert ema_checkpoint_key(path) == ema_key
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        got = load_for_inference(path, checkpoint_key=ema_key).model(x)
        torch.testing.assert_close(got, ema(x))
        assert not torch.allclose(got, raw(x))


def test_use_ema_on_runs_with_and_without_an_ema(tmp_path, capsys):
    train("fashion-mnist-quick", tmp_path / "ema", overrides={**RUN, "train.ema": True, "train.ema_decay": 0.5})
    train("fashion-mnist-quick", tmp_path / "plain", overrides=RUN)
    assert ema_checkpoint_key(tmp_path / "ema" / "best.safetensors") is None  # the run saved its EMA as it
    assert ema_checkpoint_key(tmp_path / "ema" / "last.pth") == "ema"  # the training state's own entry
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "ema"), "--use-ema", "--no-progress"]) == 0
    assert main(["eval", str(tmp_path / "plain"), "--use-ema", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no weight EMA" in err[0] and "--model-ema" in err[0]
    assert main(["eval", str(tmp_path / "plain" / "last.pth"), "--use-ema", "--no-progress"]) == 2
    assert "has no EMA entry" in capsys.readouterr().err


def test_batch_img_size_interpolation_and_torchcompile(tmp_path, capsys):
    train("fashion-mnist-quick", tmp_path / "run", overrides=RUN)
    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", str(tmp_path / "run"), "-b", "3", "--img-size", "24", "--interpolation", "bilinear",
                 "--torchcompile", "eager", "--no-progress", "--output", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["batch_size"] == 3 and summary["images"] == 8
    assert summary["preprocess"]["img_size"] == 24 and summary["preprocess"]["interpolation"] == "bilinear"
    assert "--img-size" in summary["preprocess_note"] and "--interpolation" in summary["preprocess_note"]
    assert main(["eval", str(tmp_path / "run"), "--interpolation", "sideways", "--no-progress"]) == 2
    assert "--interpolation 'sideways'" in capsys.readouterr().err


def test_hf_hub_names_read_the_local_cache(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    repo = tmp_path / "hub" / "models--timm--resmlp_12_224.fb_in1k"
    with pytest.raises(ValueError) as absent:
        parse_model_name("hf-hub:timm/resmlp_12_224.fb_in1k")
    message = str(absent.value)
    assert str(repo) in message and "snapshots/REVISION/model.safetensors" in message and "\n" not in message
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    model = ResMLP(SMALL).eval()
    resmlp.export_checkpoint(model, repo / "snapshots" / COMMIT / "model.safetensors", format="timm")
    name = parse_model_name("hf-hub:timm/resmlp_12_224.fb_in1k")
    assert name.kind == "file" and name.name.endswith(f"snapshots/{COMMIT}/model.safetensors")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(resmlp.load(name.name).eval()(x), model(x))
    assert main(["eval", "hf-hub:timm/nothing-here", "--data", "synthetic", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "models--timm--nothing-here" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="write hf-hub:ORG/NAME"):
        parse_model_name("hf-hub:no-slash")

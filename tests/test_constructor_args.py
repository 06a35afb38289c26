"""timm/torchvision constructor arguments, from a checkpoint's metadata or `--set model.*` (issue 44, T2): plain,
bounded values only, and a model that gives (N, num_classes) class scores."""

from __future__ import annotations

import json
import time

import pytest
import timm
import torch
from safetensors.torch import save_file

import resmlp
from resmlp.build import check_constructor_keys, parse_model_name
from resmlp.cli import main
from resmlp.errors import CheckpointError, ConfigError
from resmlp.models.constructor_args import check_constructor_args


def _timm_file(tmp_path, **kwargs):
    """test_resnet's own tensors under timm metadata with extra constructor `kwargs`."""
    model = timm.create_model("test_resnet", num_classes=4)
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    torch.save(tensors, tmp_path / "aux.pth")  # what checkpoint_path would make timm torch.load
    path = tmp_path / "m.safetensors"
    spec = {"name": "test_resnet", "kwargs": {"num_classes": 4, **kwargs}}
    save_file(tensors, str(path), metadata={"format": "resmlp", "timm": json.dumps(spec)})
    return path


@pytest.mark.parametrize("kwargs, words", [
    ({"checkpoint_path": "aux.pth"}, "checkpoint_path='aux.pth' is refused: it names a file"),
    ({"pretrained_cfg_overlay": {"file": "aux.pth"}}, "pretrained_cfg_overlay"),
    ({"features_only": True}, "features_only=True is refused"),
    ({"global_pool": ""}, "can't classify|not class scores"),
])
def test_checkpoint_metadata_cannot_name_files_or_change_the_output(tmp_path, monkeypatch, kwargs, words):
    path = _timm_file(tmp_path, **kwargs)
    monkeypatch.chdir(tmp_path)  # a relative aux.pth beside the model was enough
    with pytest.raises(CheckpointError, match=words):
        resmlp.load(path)


def test_plain_timm_metadata_still_loads(tmp_path):
    assert resmlp.load(_timm_file(tmp_path, drop_rate=0.1)).num_classes == 4


@pytest.mark.parametrize("override, words", [
    ({"depth": 100_000}, "depth=100000 is refused: expected an integer in"),
    ({"checkpoint_path": "aux.pth"}, "checkpoint_path='aux.pth' is refused"),
    ({"pretrained": True}, "pretrained=True is refused"),
    ({"global_pool": ""}, "not class scores of shape"),
    ({"drop_rate": float("nan")}, "drop_rate=nan is refused: expected a finite number"),
    ({"act_layer": "../x.py"}, "expected a short word"),
])
def test_set_model_keys_follow_the_same_rules_and_fast(override, words):
    start = time.perf_counter()
    problem = check_constructor_keys(parse_model_name("timm:test_vit"), override)
    assert problem is not None and __import__("re").search(words, problem), problem
    assert time.perf_counter() - start < 10


def test_the_cli_refuses_a_path_argument_in_one_line(tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "o"), "--model", "timm:test_resnet",
                 "--set", "model.checkpoint_path=aux.pth", "--set", "data.kind=synthetic"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint_path='aux.pth' is refused" in err and "Traceback" not in err


def test_plain_arguments_pass():
    check_constructor_args({"drop_rate": 0.1, "drop_path_rate": 0.1, "depths": [2, 2], "act_layer": "gelu",
                            "in_chans": 1, "x": None}, "here")
    with pytest.raises(ConfigError, match="at most 16 values"):
        check_constructor_args({"depths": [1] * 17}, "here")
    assert check_constructor_keys(parse_model_name("timm:test_vit"), {"drop_rate": 0.1, "drop_path_rate": 0.1}) is None


def test_a_timm_backbone_without_a_head_still_loads(tmp_path):
    """num_classes=0: one feature vector per image is what such a file is for (k-NN, linear probes)."""
    model = timm.create_model("test_resnet", num_classes=0)
    path = resmlp.save(model, tmp_path / "backbone.safetensors")
    assert resmlp.load(path)(torch.randn(2, 3, 32, 32)).ndim == 2


def test_a_distilled_deit_passes_the_class_score_check():
    """Checked in eval mode: while training, a distilled DeiT returns its two heads as a tuple."""
    name = parse_model_name("timm:deit_tiny_distilled_patch16_224")
    assert check_constructor_keys(name, {"drop_rate": 0.1}) is None

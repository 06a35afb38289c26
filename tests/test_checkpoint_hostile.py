"""Hostile checkpoints: metadata that lies about the size, malformed metadata, NaN and integer weights."""

from __future__ import annotations

import json
import time

import pytest
import timm
import torch
from safetensors.torch import save_file

import resmlp
from resmlp.checkpoint import read_checkpoint
from resmlp.errors import CheckpointError
from resmlp.inference import (
    Preprocess,  # where it lives may change; inference re-exports it
    predict,
)
from tests.conftest import make_trained_like_

TINY = dict(img_size=16, patch_size=8, dim=8, depth=2, num_classes=3)


def _tiny_model() -> resmlp.ResMLP:
    return make_trained_like_(resmlp.create_model("resmlp_s12", **TINY))


def _rewrite(path, tensors=None, **metadata) -> None:
    """Write a safetensors file with the given tensors (default: the tiny model's) and raw metadata."""
    tensors = tensors if tensors is not None else {k: v.contiguous() for k, v in _tiny_model().state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "resmlp", **metadata})


def test_a_tiny_file_claiming_a_billion_blocks_is_refused_before_allocating(tmp_path):
    path = tmp_path / "liar.safetensors"
    _rewrite(path, config=json.dumps({**_tiny_model().config.to_dict(), "depth": 10**9, "dim": 10**6}))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=r"model config in its metadata is invalid \(dim=1000000 is above"):
        resmlp.load(path)  # past the sizes any model has (ResMLPConfig's bounds)
    # within those bounds, a claim its tensors don't back
    _rewrite(path, config=json.dumps({**_tiny_model().config.to_dict(), "depth": 1000, "dim": 16384}))
    with pytest.raises(CheckpointError, match=r"does not match its tensors.*depth: checkpoint 2, model 1000"):
        resmlp.load(path)
    assert time.perf_counter() - start < 5


def test_a_timm_spec_is_honoured_only_when_the_tensors_are_that_models(tmp_path):
    path = tmp_path / "giant.safetensors"
    _rewrite(path, timm=json.dumps({"name": "vit_giant_patch14_224", "kwargs": {}}))
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=r"(?s)fit this model \(VisionTransformer\).*missing keys.*edited"):
        resmlp.load(path)
    _rewrite(path, timm=json.dumps({"name": "test_vit", "kwargs": {"depth": 10**9}}))
    with pytest.raises(CheckpointError, match=r"depth=1000000000 exceed every size"):
        resmlp.load(path)
    assert time.perf_counter() - start < 10
    _rewrite(path, timm=json.dumps({"name": "no_such_net", "kwargs": {}}))
    with pytest.raises(CheckpointError, match="timm model 'no_such_net'"):
        resmlp.load(path)
    _rewrite(path, timm=json.dumps({"name": "test_vit", "kwargs": {"no_such_arg": 1}}))
    with pytest.raises(CheckpointError, match="timm can't build test_vit"):
        resmlp.load(path)


def test_a_timm_model_saved_by_resmlp_save_still_loads(tmp_path):
    model = timm.create_model("test_resnet", pretrained=False, num_classes=4).eval()
    path = resmlp.save(model, tmp_path / "teacher.safetensors")
    loaded = resmlp.load(path).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model(x), loaded(x))


@pytest.mark.parametrize(("key", "value"), [
    *(("config", v) for v in ("null", "[1, 2]", '"resmlp"', "3")),
    *(("timm", v) for v in ("[]", '{"kwargs": {}}', '{"name": 3}', '{"name": "x", "kwargs": []}')),
])
def test_metadata_of_the_wrong_shape_is_a_checkpoint_error(tmp_path, key, value):
    """'config' must be a JSON object, 'timm' a {"name": str, "kwargs": {...}} spec."""
    path = tmp_path / "m.safetensors"
    _rewrite(path, **{key: value})
    with pytest.raises(CheckpointError, match=f"metadata '{key}' must be"):
        resmlp.load(path)


@pytest.mark.parametrize("change", [{"dim": "wide"}, {"dim": None}, {"norm": "magic"}, {"colour": 1}])
def test_config_values_that_cant_build_a_model_are_a_checkpoint_error(tmp_path, change):
    path = tmp_path / "m.safetensors"
    _rewrite(path, config=json.dumps({**_tiny_model().config.to_dict(), **change}))
    with pytest.raises(CheckpointError, match="config in its metadata is invalid"):
        resmlp.load(path)


def test_non_finite_weights_are_refused_naming_the_tensor_or_loaded_with_a_warning(tmp_path):
    model = _tiny_model()
    with torch.no_grad():
        model.blocks[1].channel_mlp.fc2.weight[0, 0] = float("nan")
    path = resmlp.save(model, tmp_path / "nan.safetensors", metadata={"classes": ["a", "b", "c"]})
    with pytest.raises(CheckpointError, match=r"'blocks\.1\.channel_mlp\.fc2\.weight' holds 1 NaN"):
        resmlp.load(path)
    with pytest.raises(CheckpointError, match="NaN"):
        resmlp.load_checkpoint(_tiny_model(), path)
    assert resmlp.read_metadata(path) == {"classes": ["a", "b", "c"]}  # the header alone is fine to read
    with pytest.warns(UserWarning, match="NaN"):
        loaded = resmlp.load(path, allow_nonfinite=True)
    with pytest.raises(CheckpointError, match="NaN/infinite logits for 2 of 2"):
        predict(loaded.eval(), torch.randn(2, 3, 16, 16))


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool, torch.int64])
def test_integer_or_bool_tensors_for_float_weights_are_refused(tmp_path, dtype):
    tensors = {k: v.contiguous() for k, v in _tiny_model().state_dict().items()}
    tensors["head.weight"] = tensors["head.weight"].to(dtype)
    path = tmp_path / "int.safetensors"
    _rewrite(path, tensors, config=json.dumps(_tiny_model().config.to_dict()))
    # bool is no weight's dtype at all: refused on reading, before the comparison with the model
    expected = (r"'head\.weight' is of dtype bool" if dtype == torch.bool
                else rf"head\.weight: checkpoint holds {dtype} values")
    with pytest.raises(CheckpointError, match=expected):
        resmlp.load(path)
    with pytest.raises(CheckpointError, match=r"head\.weight: checkpoint holds" if dtype != torch.bool else expected):
        resmlp.load_checkpoint(_tiny_model(), path)


def test_a_torch_file_with_infinite_weights_is_refused_too(tmp_path):
    path = tmp_path / "inf.pth"
    torch.save({"model": {"w": torch.tensor([1.0, float("inf")])}}, path)
    with pytest.raises(CheckpointError, match="'w' holds 1 NaN/infinite"):
        read_checkpoint(path)


@pytest.mark.parametrize("field,value,message", [
    ("crop_pct", 0, r"crop_pct=0\.0 must be in \[0.1, 1\]"),
    ("crop_pct", 1.5, "crop_pct=1.5"),
    ("std", [0.5, 0.0, 0.5], "std=.* must be finite and > 0"),
    ("std", [0.5], "std=.* needs as many values as mean"),
    ("mean", [0.5, 0.5], "mean=.* needs 1, 3 or in_chans=3"),
    ("mean", [float("nan")] * 3, "mean=nan is not a finite number"),
    ("interpolation", "sinc", "interpolation='sinc' must be one of"),
    ("img_size", "big", "img_size='big' is not an integer"),
    ("img_size", 16.5, "img_size=16.5 is not an integer"),  # was truncated to 16
    ("in_chans", True, "in_chans=True is not an integer"),
    ("crop_pct", 1e-9, r"crop_pct=1e-09 must be in \[0.1, 1\]"),  # would resize images to 1.6e10 px
    ("mean", "0.5", "malformed"),
])
def test_preprocessing_metadata_is_validated_once_naming_the_field(field, value, message):
    model = _tiny_model()
    pre = {"img_size": 16, "crop_pct": 0.875, "mean": [0.5] * 3, "std": [0.25] * 3, "in_chans": 3, field: value}
    with pytest.raises(CheckpointError, match=message):
        Preprocess.from_metadata({"preprocess": pre}, model)

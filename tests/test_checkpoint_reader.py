"""The one checkpoint reader (resmlp.checkpoint_reader): hostile torch files refused in one line, before
their data is touched."""

from __future__ import annotations

import argparse
import json
import zipfile

import pytest
import torch

import resmlp
from resmlp.checkpoint_reader import (
    check_bool,
    check_float,
    check_int,
    check_str,
    read_state_dict,
    read_torch_file,
)
from resmlp.errors import CheckpointError, ConfigError


class _WrongArguments:
    """Pickles as a call of an allowed callable (argparse.Namespace) with arguments it can't take."""

    def __reduce__(self):
        return (argparse.Namespace, (1, 2))


def _save(tmp_path, obj, name="c.pth"):
    path = tmp_path / name
    torch.save(obj, path)
    return path


def test_an_allowed_callable_with_wrong_arguments_is_one_line_naming_the_file(tmp_path):
    path = _save(tmp_path, {"args": _WrongArguments(), "model": {"w": torch.ones(2)}})
    with pytest.raises(CheckpointError, match=f"{path}.*damaged or not a PyTorch checkpoint"):
        read_torch_file(path)


@pytest.mark.parametrize("key", [3, (1, 2), b"w"])
def test_tensor_names_must_be_strings(tmp_path, key):
    path = _save(tmp_path, {key: torch.ones(2), "b": torch.ones(2)})
    with pytest.raises(CheckpointError, match="named by a"):
        read_state_dict(path)
    path = _save(tmp_path, {"model": {key: torch.ones(2)}})
    with pytest.raises(CheckpointError, match="named by a"):
        read_state_dict(path)


@pytest.mark.parametrize("tensor, kind", [
    (lambda: torch.empty(3, device="meta"), "on device meta"),
    (lambda: torch.eye(3).to_sparse(), "layout torch.sparse_coo"),
    (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "nested"),
])
def test_meta_sparse_and_nested_tensors_are_refused(tmp_path, tensor, kind):
    path = _save(tmp_path, {"head.weight": tensor()})
    with pytest.raises(CheckpointError, match=kind):
        read_torch_file(path)


def test_an_expanded_tensor_is_refused_before_it_is_copied_anywhere(tmp_path):
    """A 4-byte storage viewed as 30,000 x 30,000 (stride 0): refused on its strides, nothing allocated."""
    path = _save(tmp_path, {"head.weight": torch.zeros(1).expand(30000, 30000)})
    assert path.stat().st_size < 100_000
    with pytest.raises(CheckpointError, match=r"overlapping strides \(0, 0\)"):
        read_state_dict(path)
    overlapping = torch.zeros(10).as_strided((5, 5), (1, 1))  # rows that share elements
    with pytest.raises(CheckpointError, match="overlapping strides"):
        read_torch_file(_save(tmp_path, {"w": overlapping}))


def test_views_and_transposes_that_each_hold_every_element_once_load(tmp_path):
    base = torch.arange(24.0).reshape(4, 6)
    state = {"t": base.t(), "slice": base[:, ::2], "row": base[1:2], "empty": torch.zeros(0, 3)}
    loaded, _ = read_state_dict(_save(tmp_path, state))
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_a_deflated_record_is_refused_before_it_is_inflated(tmp_path):
    """A record compressed to a few kB that inflates to 64 MB: refused from the zip directory alone."""
    plain = _save(tmp_path, {"w": torch.zeros(16 << 20)}, "plain.pth")
    packed = tmp_path / "packed.pth"
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert packed.stat().st_size < 1 << 20
    with pytest.raises(CheckpointError, match="is compressed"):
        read_torch_file(packed)


def test_a_record_longer_than_the_file_is_refused(tmp_path):
    path = _save(tmp_path, {"w": torch.zeros(1000)})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] + data[-2000:])  # the directory kept, the records cut
    with pytest.raises(CheckpointError, match=str(path)):
        read_torch_file(path)


def test_a_legacy_torch_file_is_refused(tmp_path):
    path = tmp_path / "old.pth"
    torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy"):
        read_torch_file(path)


def test_deep_and_self_referencing_containers_are_bounded(tmp_path):
    deep: list = [torch.ones(1)]
    for _ in range(200):
        deep = [deep]
    with pytest.raises(CheckpointError, match="nested more than"):
        read_torch_file(_save(tmp_path, {"x": deep}))
    shared: list = [torch.ones(1)]
    for _ in range(30):  # 2**30 paths through 30 lists: each list visited once
        shared = [shared, shared]
    assert read_torch_file(_save(tmp_path, {"x": shared}))


def test_an_optimizer_state_with_int_keys_is_not_a_state_dict_but_reads(tmp_path):
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([weight])
    weight.sum().backward()
    optimizer.step()
    state = read_torch_file(_save(tmp_path, {"optimizer": optimizer.state_dict(), "model": {"w": torch.ones(2)}}))
    assert 0 in state["optimizer"]["state"]


@pytest.mark.parametrize("change, message", [
    ({"dim": 8.0}, "dim"), ({"num_classes": 3.0}, "num_classes"), ({"depth": True}, "depth"),
    ({"layerscale": 1}, "layerscale"), ({"mlp_ratio": "4"}, "mlp_ratio"), ({"norm": 3}, "norm"),
])
def test_checkpoint_config_values_of_the_wrong_type_are_refused(tmp_path, change, message):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=2, num_classes=3)
    path = tmp_path / "m.safetensors"
    resmlp.save(model, path)
    from safetensors.torch import load_file, save_file

    save_file(load_file(path), str(path), metadata={"format": "resmlp",
                                                    "config": json.dumps({**model.config.to_dict(), **change})})
    with pytest.raises(CheckpointError, match=message):
        resmlp.load(path)


def test_non_finite_metadata_numbers_are_refused(tmp_path):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=2, num_classes=3)
    path = tmp_path / "m.safetensors"
    resmlp.save(model, path)
    from safetensors.torch import load_file, save_file

    config = json.dumps(model.config.to_dict()).replace('"depth": 2', '"depth": 1e400')
    save_file(load_file(path), str(path), metadata={"format": "resmlp", "config": config})
    with pytest.raises(CheckpointError, match="not a finite number"):
        resmlp.load(path)


def test_a_file_with_no_config_and_an_incomplete_trunk_is_a_checkpoint_error(tmp_path):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=2, num_classes=3)
    state = {k: v for k, v in model.state_dict().items() if "channel_mlp.fc1" not in k}
    with pytest.raises(CheckpointError, match="can't be read|cannot infer"):
        resmlp.load(_save(tmp_path, state))


def test_the_field_checks_are_strict():
    assert check_int(3, "n", "f", 0, 5) == 3
    assert check_float(3, "x", "f", 0, 5) == 3.0
    assert check_str("a", "s", "f", ("a", "b")) == "a"
    assert check_bool(False, "b", "f") is False
    for call in (lambda: check_int(3.0, "n", "f", 0, 5), lambda: check_int(True, "n", "f", 0, 5),
                 lambda: check_int(6, "n", "f", 0, 5), lambda: check_float(float("nan"), "x", "f", 0, 5),
                 lambda: check_float("1", "x", "f", 0, 5), lambda: check_str("c", "s", "f", ("a", "b")),
                 lambda: check_bool(1, "b", "f")):
        with pytest.raises(CheckpointError, match="^f: "):
            call()
    with pytest.raises(ConfigError, match="n=9"):
        check_int(9, "n", "config.json", 0, 5, error=ConfigError)


@pytest.mark.parametrize("pre", [{"mean": [None, 0.5, 0.5]}, {"crop_pct": 1e-9}, {"crop_pct": "big"},
                                 {"interpolation": 3}])
def test_preprocessing_metadata_is_checked_when_the_model_is_built(tmp_path, pre):
    """resmlp.load puts the metadata's preprocessing into timm's pretrained_cfg: each value typed there too."""
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=2, num_classes=3)
    path = resmlp.save(model, tmp_path / "m.safetensors", metadata={"preprocess": pre})
    with pytest.raises(CheckpointError, match="checkpoint preprocess metadata"):
        resmlp.load(path)


def test_a_timm_weights_file_goes_through_the_reader_too(tmp_path):
    """--teacher-weights / distill.weights: the same checks as every checkpoint (NaN weights, int names)."""
    from resmlp.build import load_weights_file

    model = torch.nn.Linear(2, 2)
    state = model.state_dict()
    torch.save({"model": {**state, "weight": torch.full((2, 2), float("nan"))}}, tmp_path / "nan.pth")
    with pytest.raises(CheckpointError, match="NaN"):
        load_weights_file(model, tmp_path / "nan.pth", "the teacher")
    torch.save({0: state["weight"]}, tmp_path / "int.pth")
    with pytest.raises(CheckpointError, match="named by a int"):
        load_weights_file(model, tmp_path / "int.pth", "the teacher")
    torch.save({"model": state}, tmp_path / "ok.pth")
    assert load_weights_file(model, tmp_path / "ok.pth", "the teacher") is model

"""No code from data, ever: a payload planted in every file the project reads is refused, never run.

Each payload would create a marker folder when unpickled (or YAML-constructed) by a permissive reader.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from resmlp.checkpoint import read_checkpoint, torch_load
from resmlp.data import build_dataset
from resmlp.errors import CheckpointError, DataError


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _cifar10_folder(root: Path, meta: object, batch: object | None = None) -> Path:
    """A CIFAR-10 python-pickle folder written like the originals (protocol 2, bytes keys)."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump(meta, f, protocol=2)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        content = batch if batch is not None else {
            b"batch_label": b"training batch", b"labels": [0, 1],
            b"data": rng.integers(0, 256, (2, 3072), dtype=np.uint8), b"filenames": [b"a.png", b"b.png"]}
        with open(base / name, "wb") as f:
            pickle.dump(content, f, protocol=2)
    return root


def test_the_restricted_unpickler_still_reads_real_cifar_layouts(tmp_path):
    names = {b"label_names": [f"c{i}".encode() for i in range(10)], b"num_cases_per_batch": 10000}
    root = _cifar10_folder(tmp_path, names)
    train = build_dataset("cifar10", "train", root, in_chans=3)
    assert len(train) == 10 and train.class_names[3] == "c3" and train[1][1] == 1


@pytest.mark.parametrize("where", ["meta", "batch"])
def test_a_payload_in_a_cifar_file_is_refused_and_never_runs(tmp_path, where):
    marker = tmp_path / "pwned"
    names = {b"label_names": [f"c{i}".encode() for i in range(10)]}
    if where == "meta":
        root = _cifar10_folder(tmp_path / "d", {**names, b"x": _Payload(marker)})
    else:
        root = _cifar10_folder(tmp_path / "d", names, {b"data": np.zeros((1, 3072), np.uint8), b"labels": [0],
                                                        b"evil": _Payload(marker)})
    with pytest.raises(DataError, match=r"refusing to read .*posix\.mkdir.*never code"):
        build_dataset("cifar10", "train", root, in_chans=3)
    assert not marker.exists()


def test_a_cifar_batch_of_the_wrong_shape_is_a_data_error(tmp_path):
    names = {b"label_names": [b"a"] * 10}
    root = _cifar10_folder(tmp_path, names, {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]})
    with pytest.raises(DataError, match=r"not a CIFAR batch.*\(2, 100\)"):
        build_dataset("cifar10", "test", root, in_chans=3)


@pytest.mark.parametrize("labels, message", [
    ([0.0, 1.5], "label 0.0 is not an integer"),  # float labels were truncated into classes and scored
    ([0, 10], r"label 10 is outside \[0, 10\)"), ([-1, 0], "label -1 is outside"),
    ([2**70, 0], "not an integer class index|not integer class"), ([None, 0], "label None is not"),
    ([True, 0], "label True is not"), ([0], "expected a list of 2 labels"), (np.array([0.5, 1.0]), "float64"),
])
def test_cifar_labels_are_integers_in_range_one_per_image(tmp_path, labels, message):
    names = {b"label_names": [b"a"] * 10}
    root = _cifar10_folder(tmp_path, names, {b"data": np.zeros((2, 3072), np.uint8), b"labels": labels})
    with pytest.raises(DataError, match=message):
        build_dataset("cifar10", "test", root, in_chans=3)


def test_cifar_data_must_be_an_array_not_a_list_repeating_one_row(tmp_path):
    """A list naming one row N times is a few bytes per image in the file, N full rows once converted."""
    row = list(range(256)) * 12
    root = _cifar10_folder(tmp_path, {b"label_names": [b"a"] * 10}, {b"data": [row] * 3, b"labels": [0, 0, 0]})
    with pytest.raises(DataError, match="expected a uint8 array of shape \\(N, 3072\\), got list"):
        build_dataset("cifar10", "test", root, in_chans=3)


def test_a_payload_in_a_torch_checkpoint_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "state.pt"
    torch.save({"version": 1, "model": {"w": torch.zeros(1)}, "x": _Payload(marker)}, path)
    for reader in (torch_load, read_checkpoint):
        with pytest.raises(CheckpointError, match="never run code"):
            reader(path)
    assert not marker.exists()


def test_a_payload_in_a_yaml_recipe_or_override_is_refused_and_never_runs(tmp_path):
    import yaml

    from resmlp.train.config import load_config

    marker = tmp_path / "pwned"
    payload = f"!!python/object/apply:os.mkdir [{str(marker)!r}]"
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(f"model:\n  dim: {payload}\n")
    with pytest.raises(yaml.YAMLError):
        load_config(recipe)
    with pytest.raises(yaml.YAMLError):
        load_config("fashion-mnist-quick", [f"model.dim={payload}"])
    assert not marker.exists()

"""A torch zip whose directory entries share one stored record (issue 44, T1): refused by the checkpoint reader
before torch reads it, at every command that reads a checkpoint."""

from __future__ import annotations

import struct
import zipfile

import pytest
import torch

import resmlp
from resmlp.checkpoint_reader import read_torch_file
from resmlp.cli import main
from resmlp.errors import CheckpointError

CENTRAL = b"PK\x01\x02"


def shared_records(path, entries: int = 3, numel: int = 1000):
    """torch.save of `entries` equal tensors, then every central-directory entry pointed at the first data
    record: torch reads `entries` storages out of one record's bytes (250 entries of 4 MiB: 1 GiB)."""
    torch.save({f"w{i}": torch.zeros(numel) for i in range(entries)}, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        first = next(r for r in archive.infolist() if r.filename.endswith("/data/0"))
    at = data.find(CENTRAL)
    while at >= 0:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        name = bytes(data[at + 46: at + 46 + name_length]).decode()
        if "/data/" in name:
            struct.pack_into("<I", data, at + 42, first.header_offset)
        at = data.find(CENTRAL, at + 4)
    path.write_bytes(bytes(data))
    return path


def test_the_crafted_file_is_what_torch_reads_as_more_than_it_holds(tmp_path):
    """The attack is real: torch itself reads three 4000-byte storages from one 4000-byte record."""
    path = shared_records(tmp_path / "shared.pth")
    loaded = torch.load(path, weights_only=True)
    assert sorted(loaded) == ["w0", "w1", "w2"]
    assert sum(t.untyped_storage().nbytes() for t in loaded.values()) == 3 * 4000


def test_records_sharing_bytes_are_refused_before_torch_reads(tmp_path):
    path = shared_records(tmp_path / "shared.pth")
    with pytest.raises(CheckpointError, match=r"records '.*/data/0' and '.*/data/1' overlap"):
        read_torch_file(path)


def test_a_file_torch_wrote_still_reads(tmp_path):
    """torch.save's records (with their alignment padding in the extra field) are disjoint and fit the file."""
    path = tmp_path / "ok.pth"
    torch.save({"a": torch.ones(3), "b": torch.zeros(5, 7), "n": {"c": torch.arange(4)}}, path)
    assert read_torch_file(path)["b"].shape == (5, 7)


def test_a_record_whose_local_header_is_missing_is_refused(tmp_path):
    path = tmp_path / "m.pth"
    torch.save({"w": torch.zeros(100)}, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        record = next(r for r in archive.infolist() if r.filename.endswith("/data/0"))
    data[record.header_offset: record.header_offset + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="no local header"):
        read_torch_file(path)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return shared_records(tmp_path_factory.mktemp("doors") / "shared.pth")


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    from PIL import Image

    path = tmp_path_factory.mktemp("img") / "a.png"
    Image.new("RGB", (16, 16)).save(path)
    return path


@pytest.mark.parametrize("command", [
    ["predict", "{ckpt}", "{image}"],
    ["eval", "{ckpt}", "--data", "synthetic"],
    ["eval-knn", "{ckpt}", "--data", "synthetic"],
    ["export", "{ckpt}", "--output", "{out}/m.onnx"],
    ["analyze", "{ckpt}", "--output", "{out}/a"],
    ["finetune", "{ckpt}", "--output", "{out}/f", "--set", "data.kind=synthetic"],
    ["train", "--output", "{out}/t", "--model", "{ckpt}", "--set", "data.kind=synthetic"],
    ["train", "--output", "{out}/d", "--distill", "{ckpt}", "--set", "data.kind=synthetic"],
    ["train", "--output", "{out}/r", "--resume", "{ckpt}", "--set", "data.kind=synthetic"],
    ["translate", "decode", "{ckpt}"],
])
def test_every_door_that_reads_a_checkpoint_refuses_it_in_one_line(tmp_path, capsys, shared, image, command):
    argv = [a.format(ckpt=shared, image=image, out=tmp_path) for a in command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "overlap" in err and "Traceback" not in err and len(err.strip().splitlines()) <= 2


def test_a_model_file_torch_wrote_still_loads_through_resmlp_load(tmp_path):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=3)
    torch.save(model.state_dict(), tmp_path / "m.pth")
    assert resmlp.load(tmp_path / "m.pth").config.dim == 8

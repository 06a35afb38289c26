"""Hostile shards and shard writing (issue 48, items 1-6, 9, 17): `resmlp data shards` writes through
resmlp.fileio, refuses unusable counts and a damaged or outdated progress file; the wds: source skips labels that
are not plain numbers, refuses a bad index.json and an enormous brace pattern in one line, and a mid-epoch resume
over rewritten shards is refused."""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from resmlp.data.loading.loaders import StreamPosition
from resmlp.data.per_image.decoded import DecodedStream
from resmlp.data.records import MAX_CLASSES, Source, Unreadable
from resmlp.data.shards import write_shards
from resmlp.data.sources import open_source
from resmlp.data.sources.wds import _label
from resmlp.errors import ConfigError, DataError
from resmlp.train.state import check_same_shards


def _synthetic(train: int = 12, val: int = 4):
    return open_source("synthetic", synthetic_size=(train, val), synthetic_classes=2, img_size=8)


def _quiet(_: str) -> None:
    pass


def test_a_planted_symlink_at_a_shards_name_is_replaced_not_followed(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_bytes(b"precious")
    for name in ("train-000000.tar", "train-000000.tar.tmp"):  # the final name and the old temporary's
        (out / name).symlink_to(victim)
    write_shards(_synthetic(), out, 1 << 30, shard_records=100, log=_quiet)
    assert victim.read_bytes() == b"precious"
    assert not (out / "train-000000.tar").is_symlink() and tarfile.is_tarfile(out / "train-000000.tar")


@pytest.mark.parametrize(("options", "message"), [
    ({"shard_records": -1}, "--shard-records -1: expected at least 1"),
    ({"shard_records": 0}, "--shard-records 0: expected at least 1"),
    ({"val_size": -3}, "--val-size -3: expected 0"),
    ({"val_size": 12}, r"--val-size 12: the val split carved from train must be smaller than it \(12 records\)"),
])
def test_unusable_counts_are_refused_before_anything_is_written(tmp_path, options, message):
    synthetic = _synthetic()
    source = Source(synthetic.spec, {"train": synthetic.records("train")})  # a train split alone, as a folder's
    with pytest.raises(ConfigError, match=message):
        write_shards(source, tmp_path / "out", 1 << 30, log=_quiet, **options)
    assert not (tmp_path / "out").exists()


def _killed_run(out: Path, source) -> dict:
    """A run of write_shards stopped after its first shard; returns its progress file's contents."""
    def stop(_: str) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_shards(source, out, 1 << 30, shard_records=4, log=stop)
    return json.loads((out / "index.partial.json").read_text())


@pytest.mark.parametrize(("damage", "message"), [
    (lambda s: s["next"].update(train="4"), "split 'train' next position '4' is not within"),
    (lambda s: s["next"].update(train=10**9), "next position 1000000000 is not within its 12 records"),
    (lambda s: s["splits"]["train"][0].update(name="../../elsewhere.tar"), "shard 0 of 'train' is not train-000000"),
    (lambda s: s["splits"]["train"][0].update(bytes=True), "shard 0 of 'train' is not train-000000.tar at its"),
    (lambda s: s.update(skipped=-1), "expected splits, next and skipped"),
])
def test_a_damaged_progress_file_is_refused(tmp_path, damage, message):
    state = _killed_run(tmp_path / "out", _synthetic())
    damage(state)
    (tmp_path / "out" / "index.partial.json").write_text(json.dumps(state))
    with pytest.raises(ConfigError, match=message):
        write_shards(_synthetic(), tmp_path / "out", 1 << 30, shard_records=4, log=_quiet)


def test_a_source_changed_since_the_shards_were_begun_is_refused(tmp_path):
    _killed_run(tmp_path / "out", _synthetic())
    with pytest.raises(ConfigError, match="the source's records changed since these shards were begun"):
        write_shards(_synthetic(train=16), tmp_path / "out", 1 << 30, shard_records=4, log=_quiet)


@pytest.mark.parametrize("text", [b"\xc2\xb2", b"--1", b"1" * 5000, "\u0663".encode(), b"+1"])
def test_cls_labels_that_are_not_plain_numbers_are_unreadable(text):
    assert isinstance(_label({"cls": text}), Unreadable)


def test_json_labels_nested_too_deeply_or_huge_are_unreadable():
    assert isinstance(_label({"json": b"[" * 100_000 + b"]" * 100_000}), Unreadable)
    assert isinstance(_label({"json": b"1" * 5000}), Unreadable)
    assert _label({"cls": b" 7\n"}) == 7 and _label({"json": b'{"label": 3}'}) == 3


def _index(folder: Path, classes: list, shards: list) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "index.json").write_text(json.dumps({"format": "resmlp-webdataset-1", "classes": classes,
                                                   "splits": {"train": shards}}))
    return folder


@pytest.mark.parametrize(("classes", "shards", "message"), [
    (["a", "b"], [{"name": "s.tar", "samples": 1, "bytes": 10}] * 2, "shard s.tar is listed twice"),
    (["a", "b"], [{"name": "s.tar", "samples": -1, "bytes": 10}], "counts: integers from 0"),
    (["a", "b"], [{"name": "s.tar", "samples": True, "bytes": 10}], "counts: integers from 0"),
    (["a", "a"], [{"name": "s.tar", "samples": 1, "bytes": 10}], "class name 'a' appears more than once"),
    ([f"c{i}" for i in range(MAX_CLASSES + 1)], [], "more than the 100,000 this project accepts"),
])
def test_a_bad_index_is_refused_in_one_line(tmp_path, classes, shards, message):
    with pytest.raises(DataError, match=message):
        open_source(f"wds:{_index(tmp_path / 'shards', classes, shards)}")


def test_an_enormous_brace_pattern_is_refused_before_it_is_expanded(tmp_path):
    started = time.perf_counter()
    with pytest.raises(DataError, match="names 100,000,000 shards, more than the 1,000,000 accepted"):
        open_source(f"wds:{tmp_path}/x-{{0..99999999}}.tar")
    assert time.perf_counter() - started < 5  # braceexpand itself takes ~30 s on this range


def test_a_mid_epoch_resume_over_rewritten_shards_is_refused(tmp_path):
    out = tmp_path / "shards"
    write_shards(_synthetic(), out, 1 << 30, shard_records=4, log=_quiet)
    records = open_source(f"wds:{out}").records("train")
    trainer = SimpleNamespace(sampler=StreamPosition(DecodedStream(records), 0, 1, 0, 0, 4), state_path="last.pth")
    state = {"step_in_epoch": 1, "stream_shards": records.fingerprint()}
    check_same_shards(trainer, state)  # the same shards: resumed
    shard = out / "train-000000.tar"
    data = shard.read_bytes()
    shard.write_bytes(data)  # rewritten in place: same name and size, a new modification time
    os.utime(shard, (time.time() + 10, time.time() + 10))
    with pytest.raises(ValueError, match="stopped mid-epoch over shards that have changed since"):
        check_same_shards(trainer, state)
    check_same_shards(trainer, {**state, "step_in_epoch": 0})  # at an epoch's start nothing is skipped

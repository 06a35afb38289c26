"""WebDataset shards: `resmlp data shards` writes them, the wds: source reads them with the webdataset library,
split across ranks and workers (no record twice, every record once an epoch), seeded, resumed exactly, and
damaged shards refused or skipped."""

from __future__ import annotations

import io
import shutil
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from resmlp.data import build_dataset, collate_skipping
from resmlp.data.per_image.decoded import decoded, to_image
from resmlp.data.records import StreamPlan
from resmlp.data.shards import parse_size, write_shards
from resmlp.data.sources import open_source
from resmlp.errors import ConfigError, DataError


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """64 training and 16 validation records of the synthetic source in shards of 4 records each."""
    out = tmp_path_factory.mktemp("wds") / "shards"
    source = open_source("synthetic", synthetic_size=(64, 16), synthetic_classes=4, img_size=16, seed=0)
    write_shards(source, out, parse_size("1GB"), seed=0, shard_records=4, log=lambda _: None)
    return out


class _Names(IterableDataset):
    """The record names of one pass: what each DataLoader worker of a rank yields, in the rank's order."""

    def __init__(self, records, plan: StreamPlan) -> None:
        self.records, self.plan = records, plan

    def __iter__(self):
        return (key[3].split("#")[1] for key, _, _ in self.records.samples(self.plan))


def _rank_order(records, **plan) -> list[str]:
    plan = StreamPlan(**{"num_workers": 2, "batch_size": 4, **plan})
    loader = DataLoader(_Names(records, plan), batch_size=plan.batch_size, num_workers=2, collate_fn=list)
    return [name for batch in loader for name in batch]


def test_ranks_and_workers_read_every_record_once_an_epoch(shards):
    records = open_source(f"wds:{shards}").records("train")
    assert len(records) == 64 and records.class_names == [f"class_{c}" for c in range(4)]
    epoch = [_rank_order(records, world_size=2, rank=r, seed=5) for r in (0, 1)]
    assert len(epoch[0]) == len(epoch[1]) == 32 == records.epoch_length(StreamPlan(world_size=2, num_workers=2,
                                                                                   batch_size=4))
    assert set(epoch[0]).isdisjoint(epoch[1]) and len(set(epoch[0]) | set(epoch[1])) == 64
    assert _rank_order(records, world_size=2, rank=0, seed=5) == epoch[0]  # seeded
    assert _rank_order(records, world_size=2, rank=0, seed=5, epoch=1) != epoch[0]  # reshuffled each epoch


def test_a_resumed_epoch_neither_repeats_nor_skips(shards):
    records = open_source(f"wds:{shards}").records("train")
    full = _rank_order(records, seed=3, epoch=1)
    for batches_done in (1, 2, 5):
        assert _rank_order(records, seed=3, epoch=1, skip=4 * batches_done) == full[4 * batches_done:]


def test_evaluation_reads_every_record_once_in_order(shards):
    val = build_dataset(f"wds:{shards}", "val", None, 3, transform=lambda im: torch.zeros(1))
    assert len(val) == 16
    images, labels, skipped = collate_skipping(list(val))
    assert skipped == 0 and len(labels) == 16


def test_shards_resume_after_a_kill_and_refuse_another_source(tmp_path):
    source = open_source("synthetic", synthetic_size=(24, 8), synthetic_classes=2, img_size=8)
    calls = []

    def stop_after_two(line: str) -> None:
        calls.append(line)
        if len(calls) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_shards(source, tmp_path / "s", 1 << 30, shard_records=5, log=stop_after_two)
    assert (tmp_path / "s" / "index.partial.json").is_file()
    index = write_shards(source, tmp_path / "s", 1 << 30, shard_records=5, log=lambda _: None)
    straight = write_shards(source, tmp_path / "t", 1 << 30, shard_records=5, log=lambda _: None)
    assert index["splits"] == straight["splits"]
    for name in (s["name"] for shards in index["splits"].values() for s in shards):
        assert (tmp_path / "s" / name).read_bytes() == (tmp_path / "t" / name).read_bytes()
    with pytest.raises(ConfigError, match="already holds finished shards"):
        write_shards(source, tmp_path / "s", 1 << 30, log=lambda _: None)
    with pytest.raises(ConfigError, match="--shard-size '1 parsec'"):
        parse_size("1 parsec")


def _tar(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_hostile_shards_are_refused_in_one_line_or_skipped_and_counted(shards, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    first = copy / "train-000000.tar"
    first.write_bytes(first.read_bytes()[:1000])  # truncated
    with pytest.raises(DataError, match="train-000000.tar is 1000 bytes, not the .* of index.json"):
        open_source(f"wds:{copy}")
    with tarfile.open(shards / "train-000000.tar") as tar:
        image = next(tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".png"))
    _tar(tmp_path / "bad-0.tar", {"a.png": image, "a.cls": b"1", "b.png": image, "c.png": image, "c.cls": b"99",
                                  "d.png": b"\x89PNG broken", "d.cls": b"0"})
    (tmp_path / "classes.txt").write_text("x\ny\n")
    stream = open_source(f"wds:{tmp_path}/bad-{{0..0}}.tar", class_map=str(tmp_path / "classes.txt"), length=4)
    val = decoded(stream.records("train"), 3, lambda im: torch.zeros(1))
    with pytest.warns(UserWarning) as caught:
        images, labels, skipped = collate_skipping(list(val))
    reasons = " ".join(str(w.message) for w in caught)
    assert skipped == 3 and labels.tolist() == [1]
    assert "no label member" in reasons and "outside [0, 2)" in reasons and "cannot read image" in reasons
    counted = open_source(f"wds:{tmp_path}/bad-{{0..0}}.tar").records("train")  # no index, no class map: counted
    assert len(counted) == 4 and counted.class_names == [str(c) for c in range(100)]  # labels up to 99


def test_a_missing_extra_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "webdataset", None)
    with pytest.raises(ConfigError, match=r"needs the webdataset package: pip install 'resmlp\[data\]'"):
        open_source("wds:/nowhere/{0..1}.tar")


def test_in_memory_sources_become_png_shards_that_decode_to_the_same_pixels(shards):
    source = open_source("synthetic", synthetic_size=(64, 16), synthetic_classes=4, img_size=16, seed=0)
    arrays = source.records("val")
    val = open_source(f"wds:{shards}").records("val")
    got = {}
    for key, payload, label in val.samples(StreamPlan(train=False)):
        got[int(key[3].split("#")[1])] = (np.asarray(to_image(payload, "L", None, "x")), label)
    assert len(got) == 16
    for index, (pixels, label) in got.items():
        assert np.array_equal(pixels, arrays.images[index]) and label == arrays.labels[index]


@pytest.mark.parametrize("val_name", ["validation", "valid"])
def test_split_in_a_pattern_stands_for_timms_and_the_hubs_val_names(shards, tmp_path, val_name):
    for shard in shards.glob("*.tar"):
        split, number = shard.name.split("-")
        (tmp_path / f"{val_name if split == 'val' else split}-{number}").symlink_to(shard)
    (tmp_path / "classes.txt").write_text("".join(f"class_{c}\n" for c in range(4)))
    source = open_source(f"wds:{tmp_path}/{{split}}-{{000000..000003}}.tar", class_map=str(tmp_path / "classes.txt"),
                         length=64)
    assert "val" in source.splits
    assert source.records("val").paths[0] == f"{tmp_path}/{val_name}-000000.tar"

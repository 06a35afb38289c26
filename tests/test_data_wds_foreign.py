"""Shards as other tools write them, read with only `--data wds:DIR`: webdataset's ShardWriter in the Hugging
Face Hub's naming (`NAME-train-000000.tar`, `NAME-validation-000000.tar`, no index), and plain tar files in
timm's naming with timm's `_info.json` (train and validation with different shard counts). Counts and classes
nobody wrote down are counted once from the headers and kept in the run's listing cache."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from resmlp.cli import main
from resmlp.data.sources import open_source, wds_census
from resmlp.errors import DataError

TINY = ["--set", "model.img_size=16", "--set", "model.patch_size=8", "--set", "model.dim=16", "--set",
        "model.depth=1", "--set", "model.in_chans=3", "--set", "schedule.epochs=1", "--set", "schedule.warmup_epochs=0",
        "--set", "train.batch_size=4", "--set", "train.progress=false", "--set", "train.compile=false", "--set",
        "data.num_workers=0", "--set", "train.amp=none", "--set", "train.device=cpu", "--set", "train.threads=1"]


def _jpeg(i: int) -> bytes:
    pixels = np.random.default_rng(i).normal(80 + 100 * (i % 3 == 0), 30, (18, 20, 3)).clip(0, 255)
    out = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def _hub_shards(folder: Path) -> None:
    import webdataset as wds

    folder.mkdir()
    for split, n in (("train", 24), ("validation", 8)):
        with wds.ShardWriter(str(folder / f"imagenet-1k-{split}-%06d.tar"), maxcount=4, verbose=0) as sink:
            for i in range(n):
                sink.write({"__key__": f"{split}_{i:05d}", "jpg": _jpeg(i), "cls": i % 3})


def _timm_shards(folder: Path) -> None:
    folder.mkdir()
    info = {"name": "tiny", "splits": {}}
    for split, n, per in (("train", 24, 6), ("validation", 8, 8)):
        names, lengths = [], []
        for shard in range(n // per):
            name = f"tiny-{split}-{shard:04d}.tar"
            with tarfile.open(folder / name, "w") as tar:
                for i in range(shard * per, (shard + 1) * per):
                    for suffix, data in (("jpg", _jpeg(i)), ("cls", str(i % 3).encode())):
                        member = tarfile.TarInfo(f"{i:06d}.{suffix}")
                        member.size = len(data)
                        tar.addfile(member, io.BytesIO(data))
            names.append(name)
            lengths.append(per)
        info["splits"][split] = {"name": split, "num_samples": n, "filenames": names, "shard_lengths": lengths}
    (folder / "_info.json").write_text(json.dumps(info))


@pytest.mark.parametrize("writer", [_hub_shards, _timm_shards], ids=["hub-shardwriter", "timm-tar-info"])
def test_foreign_shards_train_with_only_data(tmp_path, writer):
    writer(tmp_path / "shards")
    source = open_source(f"wds:{tmp_path / 'shards'}", index_cache=str(tmp_path / "run"))
    assert source.splits == ("train", "val")
    assert len(source.records("train")) == 24 and len(source.records("val")) == 8
    assert source.records("train").class_names == ["0", "1", "2"]  # counted from the labels
    assert main(["train", "--data", f"wds:{tmp_path / 'shards'}", "--output", str(tmp_path / "run"), *TINY]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 1


def test_counts_are_taken_once_then_from_the_cache(tmp_path, monkeypatch):
    _hub_shards(tmp_path / "shards")
    first = open_source(f"wds:{tmp_path / 'shards'}", index_cache=str(tmp_path / "run"))
    assert (tmp_path / "run" / "data_index").is_dir()
    monkeypatch.setattr(wds_census, "_count_shard", lambda path: pytest.fail("the cache was not used"))
    again = open_source(f"wds:{tmp_path / 'shards'}", index_cache=str(tmp_path / "run"))
    assert len(again.records("train")) == len(first.records("train")) == 24


def test_a_lying_info_file_is_one_line(tmp_path):
    _timm_shards(tmp_path / "shards")
    info = json.loads((tmp_path / "shards" / "_info.json").read_text())
    info["splits"]["train"]["filenames"][0] = "../elsewhere.tar"
    (tmp_path / "shards" / "_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match="plain names in this folder"):
        open_source(f"wds:{tmp_path / 'shards'}")

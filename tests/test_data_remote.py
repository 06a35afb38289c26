"""Shards and parquet files read from real servers on 127.0.0.1 (tests/remote_servers.py): HTTP with range
requests and S3 (moto's server mode), the same records as the local files; faults injected by a proxy end in
a retry that recovers, a skipped shard named and counted, or one line; the node-local cache; the census left
out where _info.json gives the counts, its labels checked as they are read."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DataLoader, IterableDataset

from resmlp.data.records import StreamPlan, Unreadable
from resmlp.data.shards import parse_size, write_shards
from resmlp.data.sources import open_source
from resmlp.data.sources.remote import RemoteOptions, is_url
from resmlp.data.sources.shard_cache import cached, evict
from resmlp.errors import ConfigError, DataError

pytest.importorskip("s3fs")
pytest.importorskip("moto")
from remote_servers import FaultProxy, http_server, s3_server, upload  # noqa: E402

FAST = dict(retries=2, timeout=2.0, backoff=0.01)  # small bounds: a stall costs seconds, not minutes


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """40 training records in 5 shards of 8, 8 val and 8 test, written by resmlp data shards (index.json)."""
    out = tmp_path_factory.mktemp("remote") / "shards"
    source = open_source("synthetic", synthetic_size=(40, 8), synthetic_classes=4, img_size=16, seed=0)
    write_shards(source, out, parse_size("1GB"), seed=0, shard_records=8, log=lambda _: None)
    return out


@pytest.fixture(scope="module")
def s3(shards):
    with s3_server() as endpoint:
        upload(endpoint, "bkt", shards, "wds")
        yield endpoint


def _records(records, **plan) -> list[tuple[str, bytes | str, int]]:
    """(shard file and key, payload, label) of one single-worker pass, the host left out of the name."""
    plan = StreamPlan(**{"num_workers": 0, "batch_size": 8, **plan})
    return [(key[3].rsplit("/", 1)[-1], payload, label) for key, payload, label in records.samples(plan)]


def test_http_and_s3_give_the_local_records_in_the_local_order(shards, s3):
    local = _records(open_source(f"wds:{shards}").records("train"), seed=3)
    with http_server(shards) as url:
        for spec in (f"wds:{url}/train-{{000000..000004}}.tar", f"wds:{url}/"):
            source = open_source(spec, remote=RemoteOptions(**FAST))
            assert source.splits == (("train", "val", "test") if spec.endswith("/") else ("train",))
            assert _records(source.records("train"), seed=3) == local
    source = open_source("wds:s3://bkt/wds/{split}-{000000..000004}.tar".replace("{split}-{000000..000004}",
                                                                                "train-{000000..000004}"),
                         remote=RemoteOptions(endpoint_url=s3, **FAST))
    assert _records(source.records("train"), seed=3) == local
    folder = open_source("wds:s3://bkt/wds", remote=RemoteOptions(endpoint_url=s3, **FAST))
    assert folder.records("train").class_names == ["class_0", "class_1", "class_2", "class_3"]
    assert len(folder.records("val")) == 8


@pytest.mark.parametrize("fault", ["503", "drop", "stall", "truncate"])
def test_a_passing_fault_is_retried_and_loses_nothing(shards, fault):
    local = _records(open_source(f"wds:{shards}").records("train"), seed=1)
    with http_server(shards) as url, FaultProxy(url, [{"match": "train-000002", "fault": fault, "times": 2}],
                                                stall_seconds=5) as proxy:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no shard skipped
            records = open_source(f"wds:{proxy.url}/", remote=RemoteOptions(retries=2, timeout=0.5,
                                                                            backoff=0.01)).records("train")
            assert _records(records, seed=1) == local
        assert proxy.hits == [2]


def test_a_shard_that_keeps_failing_is_skipped_named_and_counted_or_stops_the_run(shards):
    with http_server(shards) as url, FaultProxy(url, [{"match": "train-000003", "fault": "503"}]) as proxy:
        records = open_source(f"wds:{proxy.url}/", remote=RemoteOptions(**FAST)).records("train")
        with pytest.warns(UserWarning, match=r"skipping shard .*train-000003\.tar: .*HTTP 503 Service Unavailable "
                                             r"after 3 tries"):
            read = _records(records, seed=0)
        unreadable = [r for r in read if isinstance(r[1], Unreadable)]
        assert len(read) == 40 and len(unreadable) == 8  # its 8 records missing: counted, not silently lost
        assert unreadable[0][0] == "train-000003.tar" and "skipped" in unreadable[0][1]
        stopping = open_source(f"wds:{proxy.url}/", remote=RemoteOptions(on_error="stop", **FAST)).records("train")
        with pytest.raises(DataError, match=r"^shard .*train-000003\.tar can't be read: .*503") as caught:
            _records(stopping, seed=0)
        assert "\n" not in str(caught.value)


def test_an_object_changed_after_listing_is_detected_not_trained_on(shards, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    with http_server(copy) as url:
        records = open_source(f"wds:{url}/", remote=RemoteOptions(**FAST)).records("train")
        before = records.fingerprint()
        path = copy / "train-000001.tar"
        path.write_bytes(path.read_bytes())  # the same bytes, rewritten: another ETag
        os.utime(path, ns=(1, 1))
        with pytest.warns(UserWarning, match=r"train-000001\.tar: .*changed since the run listed it"):
            read = _records(records, seed=0)
        assert sum(isinstance(r[1], Unreadable) for r in read) == 8
        again = open_source(f"wds:{url}/", remote=RemoteOptions(**FAST)).records("train")
        assert again.fingerprint() != before  # a mid-epoch resume over it is refused (resmlp.train.state)


def test_the_cache_fetches_each_shard_once_per_node_and_stays_bounded(shards, tmp_path):
    cache = tmp_path / "cache"
    with http_server(shards) as url, FaultProxy(url) as proxy:
        options = RemoteOptions(cache_dir=str(cache), **FAST)
        records = open_source(f"wds:{proxy.url}/", remote=options).records("train")
        first = _records(records, seed=2)
        stats = records.stats
        with ThreadPoolExecutor(4) as pool:  # four readers at once: one fetch (a lock per entry)
            paths = list(pool.map(lambda _: cached(stats[0], options), range(4)))
        gets = [p for m, p in proxy.requests if m == "GET" and p.endswith(".tar")]
        assert sorted(gets) == sorted(f"/train-{n:06d}.tar" for n in range(5))  # each fetched once
        assert len(set(paths)) == 1
    assert _records(records, seed=2) == first  # the server is gone: read from the cache
    entries = sorted(cache.glob("*.shard"))
    assert len(entries) == 5 and not list(cache.glob("*.tmp"))
    sizes = sum(p.stat().st_size for p in entries)
    for age, path in enumerate(entries):
        os.utime(path, ns=(age * 10**9, age * 10**9))
    removed = evict(cache, sizes - 1, keep=entries[0])
    assert removed == [entries[1]]  # the least recently used, not the one kept


def test_a_damaged_cache_entry_of_the_wrong_size_is_fetched_again(shards, tmp_path):
    with http_server(shards) as url:
        options = RemoteOptions(cache_dir=str(tmp_path / "cache"), **FAST)
        records = open_source(f"wds:{url}/", remote=options).records("train")
        path = cached(records.stats[0], options)
        path.write_bytes(b"cut")
        assert cached(records.stats[0], options).read_bytes() == (shards / "train-000000.tar").read_bytes()


def test_parquet_from_s3_streams_the_dataset_with_its_class_names(tmp_path, s3):
    datasets = pytest.importorskip("datasets")
    from PIL import Image

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)) for _ in range(12)]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog"])})
    dataset = datasets.Dataset.from_dict({"image": images, "label": [i % 2 for i in range(12)]}, features=features)
    folder = tmp_path / "pq"
    folder.mkdir()
    for shard in range(3):
        dataset.shard(3, shard, contiguous=True).to_parquet(str(folder / f"train-{shard:05d}-of-00003.parquet"))
    upload(s3, "bkt", folder, "pq/data")
    source = open_source("hf:s3://bkt/pq/", remote=RemoteOptions(endpoint_url=s3, **FAST))
    records = source.records("train")
    assert len(records) == 12 and records.class_names == ["cat", "dog"] and records.num_shards == 3
    read = _records(records, batch_size=4)
    assert sorted(label for _, _, label in read) == [0] * 6 + [1] * 6
    assert all(payload[:8] == b"\x89PNG\r\n\x1a\n" for _, payload, _ in read)  # as stored, undecoded
    with http_server(folder) as url:  # over HTTP, which lists nothing: a pattern
        pattern = open_source(f"hf:{url}/{{split}}-{{00000..00002}}-of-00003.parquet", remote=RemoteOptions(**FAST))
        assert pattern.splits == ("train",)
        assert [r[1:] for r in _records(pattern.records("train"), batch_size=4)] == [r[1:] for r in read]
        with pytest.raises(DataError, match="HTTP lists no folders"):
            open_source(f"hf:{url}/", remote=RemoteOptions(**FAST))


def test_urls_without_their_library_or_through_a_shell_are_one_line():
    assert is_url("s3://b/k") and is_url("https://h/x.tar") and not is_url("/data/x.tar")
    with pytest.raises(ConfigError, match=r"pipe: URLs run a command"):
        open_source("wds:pipe:curl -s http://host/x.tar")
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"^gs://b/x-0\.tar: reading gs:// URLs needs the gcsfs "
                                              r"package: pip install gcsfs$"):
            open_source("wds:gs://b/x-{0..1}.tar")


def test_remote_shards_without_counts_or_classes_are_refused_before_training(shards, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(shards / "train-000000.tar", bare)
    with http_server(bare) as url:
        with pytest.raises(DataError, match="need their classes named"):
            open_source(f"wds:{url}/train-{{000000..000000}}.tar", remote=RemoteOptions(**FAST))
        with pytest.raises(DataError, match=r"needs its index\.json or _info\.json"):
            open_source(f"wds:{url}/", remote=RemoteOptions(**FAST))


def _timm_info(folder: Path, shards: Path, num_classes: int) -> None:
    """timm's _info.json for the train shards copied into `folder` (counts from index.json)."""
    index = json.loads((shards / "index.json").read_text())
    train = index["splits"]["train"]
    for shard in train:
        shutil.copy(shards / shard["name"], folder)
    (folder / "_info.json").write_text(json.dumps({"num_classes": num_classes, "splits": {"train": {
        "name": "train", "filenames": [s["name"] for s in train], "shard_lengths": [s["samples"] for s in train],
        "num_samples": sum(s["samples"] for s in train)}}}))


def test_info_json_gives_the_counts_without_a_census_and_a_label_beyond_it_is_one_line(shards, tmp_path,
                                                                                        monkeypatch):
    folder = tmp_path / "timm"
    folder.mkdir()
    _timm_info(folder, shards, num_classes=4)
    import resmlp.data.sources.wds as wds

    monkeypatch.setattr(wds, "census", lambda *a: pytest.fail("counted the shards though _info.json gives them"))
    records = open_source(f"wds:{folder}").records("train")
    assert len(records) == 40 and len(records.class_names) == 4
    assert len(_records(records)) == 40
    _timm_info(folder, shards, num_classes=2)  # a lie: the labels go up to 3
    lying = open_source(f"wds:{folder}").records("train")
    with pytest.raises(DataError, match=r"label [23] is outside the 2 classes the shard info gives") as caught:
        _records(lying)
    assert "\n" not in str(caught.value)
    with http_server(folder) as url:  # the same from a server
        remote = open_source(f"wds:{url}/", remote=RemoteOptions(**FAST)).records("train")
        assert len(remote) == 40 and len(remote.class_names) == 2
        with pytest.raises(DataError, match="outside the 2 classes"):
            _records(remote)


class _Names(IterableDataset):
    def __init__(self, records, plan: StreamPlan) -> None:
        self.records, self.plan = records, plan

    def __iter__(self):
        return (key[3].rsplit("/", 1)[-1] for key, _, _ in self.records.samples(self.plan))


def test_dataloader_workers_each_open_their_own_connections(shards, s3):
    """The source is listed in the parent; forked workers read through filesystems of their own."""
    records = open_source("wds:s3://bkt/wds/", remote=RemoteOptions(endpoint_url=s3, **FAST)).records("train")
    plan = StreamPlan(num_workers=2, batch_size=4, seed=4)
    loader = DataLoader(_Names(records, plan), batch_size=4, num_workers=2, collate_fn=list)
    names = [name for batch in loader for name in batch]
    local = open_source(f"wds:{shards}").records("train")
    loader = DataLoader(_Names(local, plan), batch_size=4, num_workers=2, collate_fn=list)
    assert names == [name for batch in loader for name in batch] and len(set(names)) == len(names) == 32


@pytest.mark.parametrize("key, value, message", [
    ("data.shard_errors", "maybe", "data.shard_errors: skip or stop"),
    ("data.remote_timeout", "0", "data.remote_timeout: seconds"),
    ("data.endpoint_url", "minio:9000", "data.endpoint_url: an http:// or https:// URL"),
])
def test_bad_remote_keys_are_one_line(key, value, message, capsys, tmp_path):
    from resmlp.cli import main

    assert main(["train", "--data", "wds:s3://bkt/x/", "--output", str(tmp_path / "run"), "--set", f"{key}={value}",
                 "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_s3_object_replaced_after_listing_is_skipped_before_it_is_read(shards, s3):
    import boto3

    upload(s3, "bkt", shards, "replaced")
    records = open_source("wds:s3://bkt/replaced/", remote=RemoteOptions(endpoint_url=s3, **FAST)).records("train")
    client = boto3.client("s3", endpoint_url=s3, region_name="us-east-1")
    client.put_object(Bucket="bkt", Key="replaced/train-000001.tar",
                      Body=(shards / "train-000002.tar").read_bytes())  # another shard's records, another ETag
    with pytest.warns(UserWarning, match=r"skipping shard s3://bkt/replaced/train-000001\.tar: .*changed"):
        read = _records(records, seed=0)
    names = [name for name, payload, _ in read if not isinstance(payload, Unreadable)]
    assert len(names) == 32 and not any(n.startswith("train-000001.tar#") for n in names)

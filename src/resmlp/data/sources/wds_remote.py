"""WebDataset shards in object storage or behind HTTP: `wds:s3://…`, `wds:gs://…`, `wds:https://…`.

The same grammar as local shards (resmlp.data.sources.wds): a brace pattern, `{split}` standing for each split's
names, or a folder URL; the counts and classes come from an `index.json` (resmlp data shards) or timm's
`_info.json` beside the shards (read through the same checks as local ones), the classes else from
data.class_map. Shards in a store are never counted by reading them all (the census of local foreign shards):
without an index a pattern's train split takes data.epoch_length, and its classes data.class_map. Every shard
is listed once at the start (size and ETag: one listing per folder for S3/GCS, a HEAD per shard over HTTP); a
missing one, or one whose size differs from the index, is refused before training. The listing is the shards'
fingerprint in the run's state: a mid-epoch resume over shards changed since is refused
(resmlp.train.state). Reading, retries, the cache and skipped shards: resmlp.data.sources.remote and
resmlp.data.sources.shard_cache.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from resmlp.data.records import SPLITS, Payload, Source, SourceSpec, check_class_names
from resmlp.data.sources.remote import (
    ObjectStat,
    RemoteError,
    RemoteOptions,
    fingerprint,
    join,
    read_small,
    stat_all,
)
from resmlp.data.sources.shard_cache import shard_records
from resmlp.data.sources.wds import INDEX, MAX_SHARDS, SPLIT_NAMES, ShardFiles, expansions, read_index
from resmlp.data.sources.wds_census import INFO_NAMES, info_classes, info_splits
from resmlp.errors import ConfigError, DataError
from resmlp.fileio import MAX_JSON_BYTES


class RemoteShards(ShardFiles):
    """One split's shards in a store, as listed at the start (ObjectStat: URL, size, ETag)."""

    def __init__(self, stats: list[ObjectStat], counts: list[int] | None, class_names: list[str],
                 length: int | None, what: str, options: RemoteOptions) -> None:
        super().__init__([s.url for s in stats], counts, class_names, length, what)
        self.stats, self.options = stats, options

    def fingerprint(self) -> str:
        """A digest of the shards' URLs, sizes and ETags as listed."""
        return fingerprint(self.stats)

    def read_shard(self, index: int) -> Iterator[tuple[str, Payload, int]]:
        yield from shard_records(self.stats[index], self.options, self._read_stream)

    def _read_stream(self, stream: BinaryIO, url: str) -> Iterator[tuple[str, Payload, int]]:
        return self._read_tar(url, stream, fatal=RemoteError)


def remote_wds_source(spec: SourceSpec, length: int | None, class_map: str | None,
                      options: RemoteOptions) -> Source:
    """The splits of the URL `spec.arg` (see the module doc)."""
    arg = spec.arg
    named = expansions(arg.replace("{split}", "train"))
    if named > MAX_SHARDS:
        raise DataError(f"{arg} names {named:,} shards, more than the {MAX_SHARDS:,} accepted; check the brace range")
    if "{" not in arg and not arg.endswith(".tar"):
        return _folder(spec, arg.rstrip("/"), length, class_map, options)
    import braceexpand

    splits = SPLITS if "{split}" in arg else ("train",)
    found: dict[str, list[ObjectStat]] = {}
    for split in splits:
        for name in SPLIT_NAMES[split]:
            urls = list(braceexpand.braceexpand(arg.replace("{split}", name)))
            stats = stat_all(urls, options)
            if any(s is not None for s in stats):
                missing = [u for u, s in zip(urls, stats, strict=True) if s is None]
                if missing:
                    raise DataError(f"shard {missing[0]} of {arg} is missing ({len(missing)} in all); fix the pattern "
                                    "or restore the shards")
                found[split] = [s for s in stats if s is not None]
                break
    if "train" not in found:
        raise FileNotFoundError(f"no shard of {arg} exists" + (" for the train split" if len(splits) > 1 else ""))
    base = found["train"][0].url.rsplit("/", 1)[0]
    counts, classes = _beside(base, options)
    made = {}
    for split, stats in found.items():
        known = [counts.get(s.url.rsplit("/", 1)[1]) for s in stats]
        made[split] = _split(spec, split, stats, known if None not in known else None, classes, class_map, length,
                             options)
    return Source(spec, made)


def _beside(base: str, options: RemoteOptions) -> tuple[dict[str, int], list[str] | int | None]:
    """{shard name: count} and the classes from an index.json or _info.json in the folder URL `base`."""
    index = _fetched_json(base, INDEX, options)
    if index is not None:
        with _as_file(index, join(base, INDEX)) as path:
            read = read_index(path)
        return ({s["name"]: s["samples"] for shards in read["splits"].values() for s in shards}, read["classes"])
    for name in INFO_NAMES:
        info = _fetched_json(base, name, options)
        if info is not None:
            with _as_file(info, join(base, name)) as path:
                splits, classes = info_splits(path.parent, MAX_SHARDS), info_classes(path.parent)
            return ({Path(p).name: c for paths, counts in splits.values() for p, c in zip(paths, counts, strict=True)},
                    classes)
    return {}, None


def _folder(spec: SourceSpec, base: str, length: int | None, class_map: str | None,
            options: RemoteOptions) -> Source:
    """A folder URL: its index.json or _info.json lists the shards."""
    index = _fetched_json(base, INDEX, options)
    if index is not None:
        with _as_file(index, join(base, INDEX)) as path:
            read = read_index(path)
        listed = {split: ([join(base, s["name"]) for s in shards], [s["samples"] for s in shards],
                          [s["bytes"] for s in shards]) for split, shards in read["splits"].items()}
        classes: list[str] | int | None = read["classes"]
    else:
        info = next(((n, b) for n in INFO_NAMES if (b := _fetched_json(base, n, options)) is not None), None)
        if info is None:
            raise DataError(f"{spec}: a folder URL needs its {INDEX} or {INFO_NAMES[0]} (shards in a store are not "
                            "listed and counted); or name the shards by a pattern, wds:URL/train-{000000..000009}.tar")
        with _as_file(info[1], join(base, info[0])) as path:
            splits, classes = info_splits(path.parent, MAX_SHARDS), info_classes(path.parent)
        listed = {split: ([join(base, Path(p).name) for p in paths], counts, None)
                  for split, (paths, counts) in splits.items()}
    made = {}
    for split, (urls, counts, sizes) in listed.items():
        stats = stat_all(urls, options)
        for number, (url, obj) in enumerate(zip(urls, stats, strict=True)):
            if obj is None or (sizes is not None and obj.size != sizes[number]):
                state = "is missing" if obj is None else f"is {obj.size} bytes, not the {sizes[number]} of {INDEX}"
                raise DataError(f"shard {url} {state} (truncated or replaced); upload the shards again")
        made[split] = _split(spec, split, stats, counts, classes, class_map, length, options)  # type: ignore[arg-type]
    return Source(spec, made)


def _split(spec: SourceSpec, split: str, stats: list[ObjectStat], counts: list[int] | None,
           classes: list[str] | int | None, class_map: str | None, length: int | None,
           options: RemoteOptions) -> RemoteShards:
    from resmlp.data.sources.imagenet import read_class_map

    if class_map:
        names, source = check_class_names(read_class_map(class_map), class_map), f"data.class_map {class_map}"
    elif isinstance(classes, list):
        names, source = check_class_names(classes, f"{spec} shard info"), "the shard info"
    elif isinstance(classes, int):
        names, source = [str(c) for c in range(classes)], "the shard info"
    else:
        raise DataError(f"{spec}: shards in a store need their classes named (an {INDEX}, an {INFO_NAMES[0]} with "
                        "classes or num_classes, or --set data.class_map=FILE); they are not counted by reading "
                        "every shard")
    if counts is None and (split != "train" or length is None):
        raise DataError(f"{spec} {split}: the shards' record counts are unknown (no {INDEX} or {INFO_NAMES[0]} beside "
                        "them naming these shards)" + ("; give the train split's with --set data.epoch_length=N"
                                                       if split == "train" else ""))
    records = RemoteShards(stats, counts, names, length if split == "train" else None, f"{spec} {split}", options)
    records.classes_from = source
    return records


def _fetched_json(base: str, name: str, options: RemoteOptions) -> bytes | None:
    return read_small(join(base, name), MAX_JSON_BYTES, options)


class _as_file:
    """Bytes fetched from `url` as a file of a fresh temporary folder, for the local readers' checks (their
    one-line refusals name the URL)."""

    def __init__(self, data: bytes, url: str) -> None:
        self.data, self.url = data, url

    def __enter__(self) -> Path:
        self.folder = tempfile.TemporaryDirectory(prefix="resmlp-remote-")
        self.path = Path(self.folder.name) / self.url.rsplit("/", 1)[1]
        self.path.write_bytes(self.data)
        return self.path

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        self.folder.cleanup()
        if isinstance(error, (DataError, ConfigError)):
            raise type(error)(str(error).replace(str(self.path.parent) + "/", self.url.rsplit("/", 1)[0] + "/")
                              .replace(str(self.path.parent), self.url.rsplit("/", 1)[0])) from None

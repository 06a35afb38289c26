"""Parquet files of a Hugging Face dataset in object storage or behind HTTP: `hf:s3://BUCKET/imagenet/`,
`hf:https://HOST/data/train-{00000..00293}-of-00294.parquet`, streamed.

A folder URL (S3, GCS: listed) holds `*.parquet` files in it or in `data/`, named as the Hub names them
(the split is the name's first word, as resmlp.data.sources.hf reads local parquet); over HTTP, which lists
nothing, the files are named by a brace pattern (`{split}` as in wds:). Each file is a shard of the stream
(resmlp.data.sources.streams): its row count read from its footer at the start (a few kB a file), its rows
read in order, row group by row group, with pyarrow through a seekable range reader
(resmlp.data.sources.remote) or the node's cache (resmlp.data.sources.shard_cache). The classes are the
label's ClassLabel names in the `huggingface` metadata `datasets` writes into every parquet file (else
data.class_map); the image column is `image` (or `img`), stored as {bytes, path}, passed on undecoded.
Always streamed: a map-style read would fetch each image by its own request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from resmlp.data.records import Payload, Source, SourceSpec, Unreadable, check_class_names, optional_module
from resmlp.data.sources.hf import IMAGE_COLUMNS, LABEL_COLUMNS, SPLIT_WORDS
from resmlp.data.sources.remote import (
    ObjectStat,
    RemoteOptions,
    filesystem,
    fingerprint,
    open_object,
    retried,
    stat_all,
)
from resmlp.data.sources.shard_cache import shard_records
from resmlp.data.sources.streams import ShardedRecords, checked_label
from resmlp.data.sources.wds import MAX_SHARDS, SPLIT_NAMES, expansions
from resmlp.errors import DataError

ROWS_PER_BATCH = 256  # rows pyarrow decodes at a time from a row group (its images stay encoded)


class ParquetShards(ShardedRecords):
    """One split's parquet files in a store, as listed (URL, size, ETag), each a shard."""

    def __init__(self, stats: list[ObjectStat], counts: list[int], image: str, label: str, class_names: list[str],
                 what: str, options: RemoteOptions) -> None:
        super().__init__(len(stats), counts, class_names, None, what)
        self.stats, self.image, self.label, self.options = stats, image, label, options

    def fingerprint(self) -> str:
        return fingerprint(self.stats)

    def read_shard(self, index: int) -> Iterator[tuple[str, Payload, int]]:
        yield from shard_records(self.stats[index], self.options, self._rows)

    def _rows(self, stream: BinaryIO, url: str) -> Iterator[tuple[str, Payload, int]]:
        parquet = optional_module("pyarrow.parquet")
        row = 0
        for batch in parquet.ParquetFile(stream).iter_batches(ROWS_PER_BATCH, columns=[self.image, self.label]):
            for value, label in zip(batch.column(self.image).to_pylist(), batch.column(self.label).to_pylist(),
                                    strict=True):
                name, row = f"{url}[{row}]", row + 1
                checked = checked_label(label, len(self.class_names))
                data = value.get("bytes") if isinstance(value, dict) else None
                if isinstance(checked, Unreadable) or not data:
                    yield name, checked if isinstance(checked, Unreadable) else Unreadable("no image bytes"), -1
                else:
                    yield name, bytes(data), checked


def remote_hf_source(spec: SourceSpec, class_map: str | None, options: RemoteOptions) -> Source:
    """The splits of the URL `spec.arg` (see the module doc)."""
    grouped = _files(spec.arg, options)
    made, names = {}, set()
    for split, stats in grouped.items():
        made[split] = _split(spec, split, stats, class_map, options)
        names.add(tuple(made[split].class_names))
    if len(names) > 1:
        raise DataError(f"{spec}: the splits' label features name different classes; they must agree")
    return Source(spec, made)


def _files(arg: str, options: RemoteOptions) -> dict[str, list[ObjectStat]]:
    """{split: parquet files} of a pattern or a folder URL."""
    if "{" in arg or arg.endswith(".parquet"):
        import braceexpand

        if expansions(arg.replace("{split}", "train")) > MAX_SHARDS:
            raise DataError(f"{arg} names more than {MAX_SHARDS:,} files; check the brace range")
        found = {}
        for split in ("train", "val", "test") if "{split}" in arg else ("train",):
            for word in SPLIT_NAMES[split]:
                urls = list(braceexpand.braceexpand(arg.replace("{split}", word)))
                stats = stat_all(urls, options)
                if any(s is not None for s in stats):
                    if None in stats:
                        missing = urls[stats.index(None)]
                        raise DataError(f"{missing} of {arg} is missing ({stats.count(None)} in all)")
                    found[split] = [s for s in stats if s is not None]
                    break
        if "train" not in found:
            raise FileNotFoundError(f"no file of {arg} exists for the train split")
        return found
    protocol = arg.partition("://")[0].lower()
    if protocol in ("http", "https"):
        raise DataError(f"hf:{arg}: HTTP lists no folders; name the parquet files by a pattern, e.g. "
                        "hf:https://HOST/data/{split}-{00000..00293}-of-00294.parquet")
    fs = filesystem(arg, options)
    base = arg.rstrip("/")
    names = [f"{protocol}://{p}" for folder in (base, base + "/data")
             for p in retried(lambda f=folder: fs.glob(f + "/*.parquet"), folder, options)]
    if not names:
        raise FileNotFoundError(f"hf:{arg} holds no parquet files (in it or in data/)")
    grouped: dict[str, list[str]] = {}
    for url in sorted(names):
        word = re.split(r"[-_.]", url.rsplit("/", 1)[1], maxsplit=1)[0].lower()
        if word not in SPLIT_WORDS:
            raise DataError(f"{url}: its name does not start with a split (train, validation, test...)")
        grouped.setdefault(SPLIT_WORDS[word], []).append(url)
    if "train" not in grouped:
        raise DataError(f"hf:{arg} holds no train-*.parquet file")
    stats = {split: stat_all(urls, options) for split, urls in grouped.items()}
    return {split: [s for s in listed if s is not None] for split, listed in stats.items()}


def _split(spec: SourceSpec, split: str, stats: list[ObjectStat], class_map: str | None,
           options: RemoteOptions) -> ParquetShards:
    parquet = optional_module("pyarrow.parquet")
    counts, schema = [], None
    for obj in stats:
        def footer(obj: ObjectStat = obj) -> Any:
            with open_object(obj, options) as stream:
                return parquet.read_metadata(stream)

        try:
            meta = footer()
        except (DataError, FileNotFoundError):
            raise
        except Exception as e:  # pyarrow's ArrowInvalid: not a parquet file
            raise DataError(f"{obj.url} can't be read as parquet ({type(e).__name__}: {str(e)[:120]})") from None
        counts.append(meta.num_rows)
        schema = schema or meta.schema.to_arrow_schema()
    columns = list(schema.names)
    image = next((c for c in IMAGE_COLUMNS if c in columns), None)
    label = next((c for c in LABEL_COLUMNS if c in columns), None)
    what = f"{spec} {split}"
    if image is None or label is None:
        raise DataError(f"{what}: expected an image column ({' or '.join(IMAGE_COLUMNS)}) and a label column "
                        f"({' or '.join(LABEL_COLUMNS)}); it has {', '.join(columns[:10])}")
    return ParquetShards(stats, counts, image, label, _class_names(schema, label, class_map, what), what, options)


def _class_names(schema: Any, label: str, class_map: str | None, what: str) -> list[str]:
    """The label's ClassLabel names from the `huggingface` metadata `datasets` writes, else data.class_map."""
    if class_map:
        from resmlp.data.sources.imagenet import read_class_map

        return check_class_names(read_class_map(class_map), f"class map {class_map}")
    try:
        features = json.loads((schema.metadata or {}).get(b"huggingface", b"{}")).get("info", {}).get("features", {})
    except (ValueError, AttributeError, RecursionError):
        features = {}
    names = features.get(label, {}).get("names") if isinstance(features.get(label), dict) else None
    if not isinstance(names, list) or not names:
        raise DataError(f"{what}: the {label} column has no ClassLabel names in the files' metadata; give the "
                        "classes with --set data.class_map=FILE")
    return check_class_names(names, f"{what}: the {label} column's ClassLabel")

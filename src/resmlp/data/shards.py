"""Writing WebDataset shards from any source: `resmlp data shards SRC OUT --shard-size 1GB`.

Each split's records (a val split carved from train on request, by resmlp.data.splits) go, in an order
shuffled by `seed`, into OUT/<split>-NNNNNN.tar shards of about `shard_size` bytes (webdataset's TarWriter;
members KEY.<jpg|png|webp> as stored, KEY.cls the class index), and OUT/index.json lists every shard with
its record count and size plus the class names (resmlp.data.sources.wds reads it). Images stored as JPEG, PNG or
WebP are copied byte for byte; other formats and in-memory arrays are written as PNG (lossless).
Unreadable records are skipped, counted and reported.

Resumable: each finished shard is renamed into place and recorded in OUT/index.partial.json (with the
position reached), so a killed run started again continues after its last whole shard; the order is the
same because it is seeded. The progress file is checked before it is trusted (its shards named and sized as
written, its positions in range), and it records what each split's order was drawn from (the record count and
a digest of the record names): a source changed since is refused rather than continued in another order.
Shards and the index are written through resmlp.fileio (a fresh temporary renamed into place; a symlink
planted at a shard's name is replaced, never followed).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.data.per_image.decoded import to_image
from resmlp.data.records import MapRecords, Payload, Source, optional_module
from resmlp.data.sources.wds import INDEX, INDEX_FORMAT
from resmlp.data.splits import decide_splits
from resmlp.errors import ConfigError, DataError
from resmlp.fileio import atomic_write, read_json_object, write_json

PARTIAL = "index.partial.json"
UNITS = {"": 1, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
         "gib": 1 << 30}


def parse_size(text: str) -> int:
    """'1GB', '500MB', '64KiB' or a number of bytes, as a positive int."""
    stripped = text.strip().lower().replace(" ", "")
    digits = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(digits):]
    try:
        size = float(digits) * UNITS[unit]
    except (ValueError, KeyError):
        raise ConfigError(f"--shard-size {text!r}: expected a size such as 1GB, 500MB or 64KiB") from None
    if not 1 <= size <= 1 << 44:
        raise ConfigError(f"--shard-size {text!r}: expected from 1 byte to 16 TiB")
    return int(size)


def encoded(payload: Payload, what: str) -> tuple[str, bytes]:
    """(member suffix, bytes) of a record's image: JPEG, PNG and WebP as stored, anything else as PNG."""
    if isinstance(payload, bytes):
        if payload[:3] == b"\xff\xd8\xff":
            return "jpg", payload
        if payload[:8] == b"\x89PNG\r\n\x1a\n":
            return "png", payload
        if payload[:4] == b"RIFF" and payload[8:12] == b"WEBP":
            return "webp", payload
    image = to_image(payload, _mode(payload), None, what)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return "png", out.getvalue()


def _mode(payload: Payload) -> str:
    if isinstance(payload, np.ndarray):
        return "L" if payload.ndim == 2 else "RGB"
    return "RGB"


def write_shards(source: Source, out: str | Path, shard_size: int, seed: int = 0, shard_records: int | None = None,
                 val_size: int = 0, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write every split of `source` as shards in `out` (see the module doc); returns the index. shard_records:
    at most this many records a shard (equal counts balance the workers exactly, resmlp.data.sources.streams).
    val_size: a source without a val split gets one of that many records carved from train, as a training run
    carves it (resmlp.data.splits; seeded by `seed`); 0: the source's splits as they are."""
    wds = optional_module("webdataset")
    check_counts(source, shard_records, val_size)
    out = Path(out)
    splits = _splits(source, val_size, seed)
    for split, records in splits.items():
        if not isinstance(records, MapRecords):
            raise ConfigError(f"{source.spec} streams its {split} split; shard a folder, an hf: dataset read "
                              "whole, or Fashion-MNIST/CIFAR/synthetic")
    drawn_from = {split: _listing(records) for split, records in splits.items()}
    state = _resume_state(out, source, seed, val_size, drawn_from)
    for split, records in splits.items():
        order = np.random.default_rng([seed, ("train", "val", "test").index(split)]).permutation(len(records))
        shards, position = state["splits"].setdefault(split, []), state["next"].get(split, 0)
        while position < len(order):
            name = f"{split}-{len(shards):06d}.tar"
            count, position, size, skipped = _write_shard(wds, out / name, records, order, position, shard_size,
                                                         shard_records or len(order))
            if count:
                shards.append({"name": name, "samples": count, "bytes": size})
            else:
                (out / name).unlink()
            state["next"][split] = position
            state["skipped"] = state.get("skipped", 0) + skipped
            write_json(out / PARTIAL, state)
            log(f"{split}: {position}/{len(order)} records, {len(shards)} shard(s)")
    index = {"format": INDEX_FORMAT, "classes": state["classes"], "splits": state["splits"],
             "source": state["source"], "seed": seed, "skipped_unreadable": state.get("skipped", 0)}
    write_json(out / INDEX, index)
    (out / PARTIAL).unlink()
    return index


def check_counts(source: Source, shard_records: int | None, val_size: int) -> None:
    """--shard-records and --val-size refused in one line unless usable: at least one record a shard, and a val
    split of 0 (none carved) up to fewer records than train."""
    if shard_records is not None and shard_records < 1:
        raise ConfigError(f"--shard-records {shard_records}: expected at least 1 record a shard (or leave it out)")
    if val_size < 0:
        raise ConfigError(f"--val-size {val_size}: expected 0 (the splits as they are) or a positive count")
    if val_size and "val" not in source.splits and "train" in source.splits:
        train = len(source.records("train"))
        if val_size >= train:
            raise ConfigError(f"--val-size {val_size}: the val split carved from train must be smaller than it "
                              f"({train} records); give fewer")


def _listing(records: MapRecords) -> dict[str, Any]:
    """What a split's shuffled order is drawn from: its record count and a digest of the record names."""
    digest = hashlib.sha256()
    for index in range(len(records)):
        digest.update(records.name(index).encode("utf-8", "surrogateescape") + b"\0")
    return {"records": len(records), "names_sha256": digest.hexdigest()}


def _splits(source: Source, val_size: int, seed: int) -> dict[str, Any]:
    """{split: records} to write: the source's own, or with a val split carved from train."""
    if not val_size or "val" in source.splits:
        return {split: source.records(split) for split in source.splits}
    decided = decide_splits(source, val_size, seed)
    return {"train": decided.train, "val": decided.val, **({"test": decided.test} if decided.test is not None else {})}


def _resume_state(out: Path, source: Source, seed: int, val_size: int,
                  drawn_from: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The progress of an earlier, killed run of the same command (checked), or a fresh start."""
    classes = source.records(source.splits[0]).class_names
    fresh = {"format": INDEX_FORMAT, "source": str(source.spec), "seed": seed, "val_size": val_size,
             "classes": classes, "drawn_from": drawn_from, "splits": {}, "next": {}}
    if (out / INDEX).is_file():
        raise ConfigError(f"{out} already holds finished shards ({INDEX}); write into an empty folder")
    if not (out / PARTIAL).is_file():
        return fresh
    state = read_json_object(out / PARTIAL, "shard progress")
    if [state.get(k) for k in ("source", "seed", "val_size", "classes")] != [str(source.spec), seed, val_size, classes]:
        raise ConfigError(f"{out} holds shards of another source, seed or val size ({state.get('source')}, seed "
                          f"{state.get('seed')}, val size {state.get('val_size')}); write into an empty folder")
    if state.get("drawn_from") != drawn_from:
        raise ConfigError(f"{out}/{PARTIAL}: the source's records changed since these shards were begun (another "
                          "count or other names), so their order can't be continued; write into an empty folder")
    _check_progress(out, state, drawn_from)
    return state


def _check_progress(out: Path, state: dict[str, Any], drawn_from: dict[str, dict[str, Any]]) -> None:
    """The progress file as this module writes it: each split's shards named in order, present at their
    recorded size, and its next position within the split; else one ConfigError line."""
    splits, positions, skipped = state.get("splits"), state.get("next"), state.get("skipped", 0)
    where = f"{out / PARTIAL} is damaged"
    if not isinstance(splits, dict) or not isinstance(positions, dict) or not _count(skipped) \
            or not set(splits) <= set(drawn_from) or not set(positions) <= set(drawn_from):
        raise ConfigError(f"{where} (expected splits, next and skipped as written); write into an empty folder")
    for split, position in positions.items():
        if not _count(position) or position > drawn_from[split]["records"]:
            raise ConfigError(f"{where}: split {split!r} next position {position!r} is not within its "
                              f"{drawn_from[split]['records']} records; write into an empty folder")
    for split, shards in splits.items():
        if not isinstance(shards, list):
            raise ConfigError(f"{where}: split {split!r} is not a list of shards; write into an empty folder")
        for number, shard in enumerate(shards):
            name = f"{split}-{number:06d}.tar"
            if not isinstance(shard, dict) or shard.get("name") != name or not _count(shard.get("samples")) \
                    or not _count(shard.get("bytes")) or _size(out / name) != shard["bytes"]:
                raise ConfigError(f"{where}: shard {number} of {split!r} is not {name} at its recorded size; "
                                  "write into an empty folder")


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _size(path: Path) -> int | None:
    """The size of the regular file at `path` (not followed if a symlink), else None."""
    return path.lstat().st_size if path.is_file() and not path.is_symlink() else None


def _write_shard(wds: Any, path: Path, records: MapRecords, order: np.ndarray, position: int,
                 shard_size: int, max_records: int) -> tuple[int, int, int, int]:
    """Records from `position` into one shard at `path` (through resmlp.fileio.atomic_write: a fresh
    temporary renamed into place): (records written, next position, bytes, records skipped as unreadable)."""
    done = {"count": 0, "skipped": 0, "position": position}

    def write(tmp: Path) -> None:
        written = 0
        with open(tmp, "wb") as stream, wds.TarWriter(stream, encoder=False, mtime=0) as writer:
            while done["position"] < len(order) and written < shard_size and done["count"] < max_records:
                index = int(order[done["position"]])
                done["position"] += 1
                try:
                    payload, label = records[index]
                    suffix, data = encoded(payload, records.name(index))
                except DataError as e:
                    warnings.warn(f"skipping unreadable image {records.name(index)}: {e}", stacklevel=2)
                    done["skipped"] += 1
                    continue
                writer.write({"__key__": f"{index:09d}", suffix: data, "cls": str(label).encode()})
                done["count"] += 1
                written += len(data) + 1536  # the tar headers of the two members, padding included

    atomic_write(path, write)
    return done["count"], done["position"], path.stat().st_size, done["skipped"]

"""Shards written by other tools (webdataset's ShardWriter, plain tar, timm's and the Hugging Face Hub's sets):
their splits, record counts and classes found without resmlp's index.json.

- timm's `_info.json` (or `info.json`), which the Hub's WebDataset copies of ImageNet carry too:
  `{"splits": {NAME: {"filenames": [...], "shard_lengths": [...], ...}}}`, NAME `train`, `validation`...
  (timm.data.readers.reader_wds reads the same file); it gives each shard's record count. It names no classes:
  an optional `classes` list or `num_classes` is read where a writer added one.
- a folder of `*.tar` with neither file: each shard's split is the word its name holds between `-`, `_` or `.`
  (`train`; `val`, `validation` or `valid`; `test`), all train when no name holds one.
- counts and classes nobody wrote down are counted once: a pass over each shard's tar headers, reading only
  the tiny label members (`.cls`, `.json`), kept in the run's listing cache (resmlp.data.sources.index_cache)
  under the shards' names, sizes and modification times, so the next start reads the cache. Classes counted
  from labels are named by their index ("0", "1", ...): `data.class_map` names them.
"""

from __future__ import annotations

import json
import os
import re
import tarfile
from pathlib import Path

import numpy as np

from resmlp.data.records import MAX_CLASSES
from resmlp.data.sources.index_cache import index_path, load_index, save_index
from resmlp.errors import DataError
from resmlp.fileio import read_json_object

IMAGE_SUFFIXES = ("jpg", "jpeg", "png", "webp")
INFO_NAMES = ("_info.json", "info.json")  # timm's reader_wds looks for these, in this order
SPLIT_WORDS = {"train": ("train",), "val": ("val", "validation", "valid"), "test": ("test",)}
MAX_LABEL_BYTES = 4096  # a label member larger than this is no class number: left for the reader to skip
_LABEL = re.compile(r"-?[0-9]{1,18}")


def info_splits(folder: Path, max_shards: int) -> dict[str, tuple[list[str], list[int]]] | None:
    """timm's `_info.json` in `folder` as {split: (shard paths, record counts)}, checked; None without one."""
    path = next((folder / n for n in INFO_NAMES if (folder / n).is_file()), None)
    if path is None:
        return None
    info = read_json_object(path, "shard info")
    splits = info.get("splits")
    if not isinstance(splits, dict) or not splits:
        raise DataError(f"{path}: expected timm's shard info, {{\"splits\": {{NAME: {{\"filenames\": [...], "
                        "\"shard_lengths\": [...]}}}}; write an index with resmlp data shards instead")
    found: dict[str, tuple[list[str], list[int]]] = {}
    for name, split in splits.items():
        ours = next((s for s, words in SPLIT_WORDS.items() if name in words), None)
        if ours is None or ours in found:
            continue  # a split this project has no use for (or a second name for one it has)
        names, lengths = (split.get("filenames"), split.get("shard_lengths")) if isinstance(split, dict) else (0, 0)
        if not isinstance(names, list) or not isinstance(lengths, list) or len(names) != len(lengths) \
                or not names or len(names) > max_shards \
                or not all(isinstance(n, str) and n and "/" not in n and n not in (".", "..") for n in names) \
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in lengths) \
                or len(set(names)) != len(names):
            raise DataError(f"{path}: split {name!r} needs filenames (plain names in this folder, each once) and "
                            "as many shard_lengths (whole numbers from 0)")
        for n, c in zip(names, lengths, strict=True):  # a record takes a header block at least: counts bounded
            if os.path.isfile(folder / n) and c > os.path.getsize(folder / n) // tarfile.BLOCKSIZE:
                raise DataError(f"{path}: split {name!r} says shard {n} holds {c:,} records, more than its "
                                f"{os.path.getsize(folder / n):,} bytes can (a record takes {tarfile.BLOCKSIZE} at "
                                "least); write an index with resmlp data shards instead")
        found[ours] = ([str(folder / n) for n in names], lengths)
    shared = [(a, b, n) for a in found for b in found if a < b for n in set(found[a][0]) & set(found[b][0])]
    if shared:  # as read_index: a shard in two splits would score validation on training records
        a, b, n = shared[0]
        raise DataError(f"{path}: shard {os.path.basename(n)} is in both the {a} and the {b} split (and "
                        f"{len(shared) - 1} more); a shard belongs to one split: fix the file or write an index "
                        "with resmlp data shards")
    if "train" not in found:
        raise DataError(f"{path} names no train split (it has {', '.join(map(str, splits))})")
    return found


def info_classes(folder: Path) -> list[str] | int | None:
    """Class names (`classes`) or a class count (`num_classes`) where the info file gives them."""
    path = next((folder / n for n in INFO_NAMES if (folder / n).is_file()), None)
    info = read_json_object(path, "shard info") if path else {}
    classes, count = info.get("classes"), info.get("num_classes")
    if isinstance(classes, list) and all(isinstance(c, str) for c in classes):
        return classes
    if isinstance(count, int) and not isinstance(count, bool) and 0 < count <= MAX_CLASSES:
        return count
    return None


def discover(folder: Path, max_shards: int) -> dict[str, list[str]]:
    """The `*.tar` files of `folder` by split, from the split word in each name (see the module doc)."""
    # one rule for every form (_info.json, patterns, this): a shard is a regular file, links to one followed;
    # a .tar that is none (a dangling link, a FIFO, a folder) is refused by name, not skipped without a word
    tars = sorted(e.path for e in os.scandir(folder) if e.name.endswith(".tar"))
    odd = [p for p in tars if not os.path.isfile(p)]
    if odd:
        raise DataError(f"{odd[0]} (and {len(odd) - 1} more) is not a regular file nor a link to one; a shard is a "
                        "tar file: remove it or fix the link")
    if not tars:
        raise FileNotFoundError(f"{folder} holds no index.json, no {INFO_NAMES[0]} and no .tar shards")
    if len(tars) > max_shards:
        raise DataError(f"{folder} holds {len(tars):,} tar files, more than the {max_shards:,} shards accepted")
    found: dict[str, list[str]] = {}
    for path in tars:
        words = set(re.split(r"[-_.]", Path(path).name.lower()))
        split = next((s for s, names in SPLIT_WORDS.items() if words & set(names)), None)
        found.setdefault(split, []).append(path)
    if set(found) == {None}:
        return {"train": found[None]}
    if "train" not in found:
        raise DataError(f"{folder}: no shard's name says train (e.g. NAME-train-000000.tar); name the shards "
                        "with a pattern, wds:PATTERN")
    return {split: paths for split, paths in found.items() if split is not None}


def census(paths: list[str], cache: str | Path | None) -> tuple[list[int], int]:
    """Each shard's record count (keys with an image) and the largest label seen (-1: none), from a pass
    over the tar headers, or from the cache while the shards are unchanged."""
    stats = [os.stat(p) for p in paths]
    key = "\0".join(f"{p}\0{s.st_size}\0{s.st_mtime_ns}" for p, s in zip(paths, stats, strict=True))
    cached = index_path(cache, "wds-census", key) if cache is not None else None
    kept = load_index(cached) if cached is not None and cached.is_file() else None
    # every number bounded before use: a largest label past MAX_CLASSES would name a class list of that length
    if kept is not None and set(kept) == {"counts", "largest"} and len(kept["counts"]) == len(paths) \
            and (kept["counts"] >= 0).all() and kept["largest"].shape == (1,) \
            and -1 <= int(kept["largest"][0]) <= MAX_CLASSES \
            and all(int(c) <= s.st_size // tarfile.BLOCKSIZE for c, s in zip(kept["counts"], stats, strict=True)):
        return [int(c) for c in kept["counts"]], int(kept["largest"][0])
    counts, largest = [], -1
    for path in paths:
        count, top = _count_shard(path)
        counts.append(count)
        largest = max(largest, top)
    if cached is not None:
        save_index(cached, {"counts": np.asarray(counts, np.int64), "largest": np.asarray([largest], np.int64)})
    return counts, largest


def _count_shard(path: str) -> tuple[int, int]:
    """Records with an image in one tar, and their largest label: webdataset's grouping (a record is the
    members whose names agree up to the first dot of the file name), headers read, only labels' bytes read."""
    keys_with_image: set[str] = set()
    largest = -1
    try:
        with tarfile.open(path, "r:") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, _, base = member.name.rpartition("/")
                stem, dot, suffix = base.partition(".")
                key = f"{folder}/{stem}"
                if dot and suffix.lower() in IMAGE_SUFFIXES:
                    keys_with_image.add(key)
                elif suffix in ("cls", "json") and member.size <= MAX_LABEL_BYTES:
                    largest = max(largest, _label_of(tar.extractfile(member).read(), suffix))
    except (OSError, tarfile.TarError) as e:
        raise DataError(f"shard {path} can't be read as a tar ({e}); restore or remove it") from None
    return len(keys_with_image), min(largest, MAX_CLASSES)


def _label_of(data: bytes, suffix: str) -> int:
    text = data.decode("utf-8", "replace").strip()
    if suffix == "json":
        try:
            value = json.loads(text)
        except (ValueError, RecursionError):
            return -1
        value = value.get("label") if isinstance(value, dict) else value
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else ""
    return int(text) if _LABEL.fullmatch(text) else -1

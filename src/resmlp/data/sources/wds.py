"""WebDataset shards: the `wds:` source, read with the `webdataset` library.

A sample is the tar members sharing a key: `KEY.jpg|jpeg|png|webp` (the image as stored) and `KEY.cls` (the
class index as text) or `KEY.json` (`{"label": N}` or N). `wds:` names
- a folder written by `resmlp data shards`: its index.json lists each split's shards with their record counts
  and sizes, and the class names;
- or a pattern, brace-expanded (`/data/train-{000000..000146}.tar`); `{split}` in it stands for train, val
  (or timm's and the Hugging Face Hub's `validation`, `valid`) and test (`/data/{split}-{000000..000146}.tar`),
  else the shards are the train split. An index.json beside
  the shards gives the counts and class names;
- a folder of shards other tools wrote (timm's `_info.json`, the Hub's names, none at all):
  resmlp.data.sources.wds_census. Without an index, counts and classes nobody wrote down are counted once
  from the shards' headers and labels (cached in the run's data_index/); data.class_map names the classes.
Sharding, shuffling and resume: resmlp.data.sources.streams. A member that can't be used (no image, no label, a label
out of range) and a damaged shard's rest are skipped and counted; a shard whose size differs from the index
(truncated) and a missing shard are refused before training, in one line. A label that is not a plain number
(a `.cls` of `²`, `--1` or thousands of digits, a `.json` nested past Python's recursion limit) is such a member.
index.json is checked before use: a shard listed twice, a count that is negative or not an integer (true), and a
class list that repeats a name or exceeds resmlp.data.records.MAX_CLASSES are refused in one line. A brace
pattern's expansions are counted before it is expanded: more than MAX_SHARDS is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from resmlp.data.records import SPLITS, Payload, Source, SourceSpec, Unreadable, check_class_names, optional_module
from resmlp.data.sources.remote import refuse_pipe
from resmlp.data.sources.streams import ShardedRecords, checked_label
from resmlp.data.sources.wds_census import IMAGE_SUFFIXES, census, discover, info_classes, info_splits
from resmlp.errors import DataError
from resmlp.fileio import read_json_object

INDEX = "index.json"
INDEX_FORMAT = "resmlp-webdataset-1"
# The most shards a brace pattern may name. The largest public WebDataset sets (LAION-5B, DataComp-12.8B) are
# split into a few hundred thousand shards; a pattern naming more is a typo ({0..99999999}) whose expansion
# alone (braceexpand builds lists) would take minutes and gigabytes.
MAX_SHARDS = 1_000_000
# what `{split}` stands for: ours, and the names timm's --val-split and Hugging Face datasets give the val split
SPLIT_NAMES = {"train": ("train",), "val": ("val", "validation", "valid"), "test": ("test",)}
_LABEL = re.compile(r"-?[0-9]{1,18}")  # ASCII digits only: str.isdigit accepts '²', which int() refuses
_RANGE = re.compile(r"(-?[0-9]+)\.\.(-?[0-9]+)(?:\.\.(-?[0-9]+))?")


class ShardFiles(ShardedRecords):
    """One split's tar shards (local files), their record counts when an index gives them."""

    def __init__(self, paths: list[str], counts: list[int] | None, class_names: list[str], length: int | None,
                 what: str) -> None:
        super().__init__(len(paths), counts, class_names, length, what)
        self.paths = paths
        # where the classes came from when no census saw the labels (_info.json, data.class_map): a label outside
        # them is a lie of that file, and stops the run in one line instead of being skipped
        self.classes_from: str | None = None

    def fingerprint(self) -> str:
        """A digest of the shards' names, sizes and modification times: a shard rewritten since differs."""
        digest = hashlib.sha256()
        for path in self.paths:
            stat = os.stat(path)
            digest.update(f"{os.path.basename(path)}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        return digest.hexdigest()

    def read_shard(self, index: int) -> Iterator[tuple[str, Payload, int]]:
        path = self.paths[index]
        try:
            stream = open(path, "rb")  # noqa: SIM115 (closed below; the open's failure alone is caught) a local file: never webdataset's `pipe:` URLs, which run commands
        except OSError as e:
            warnings.warn(f"skipping shard {path}: {e.strerror or e}", stacklevel=2)
            return
        with stream:
            yield from self._read_tar(path, stream)

    def _read_tar(self, path: str, stream: BinaryIO, fatal: type[Exception] | None = None) -> Iterator[
            tuple[str, Payload, int]]:
        """The records of the tar in `stream`; damage ends the shard with a warning (an exception of type `fatal`
        is raised instead)."""
        wds = optional_module("webdataset")
        damaged = []

        def note(exn: Exception) -> bool:  # webdataset's handler: record the damage, go on with the next shard
            if fatal is not None and isinstance(exn, fatal):
                raise exn
            damaged.append(exn)
            return True

        files = wds.tariterators.tar_file_expander([{"url": path, "stream": stream}], handler=note)
        for sample in wds.tariterators.group_by_keys(files, handler=note):
            yield self._record(path, sample)
        if damaged:
            warnings.warn(f"shard {path} is damaged ({damaged[0]}); the rest of it was skipped", stacklevel=2)

    def _record(self, path: str, sample: dict) -> tuple[str, Payload, int]:
        name = f"{path}#{sample.get('__key__')}"
        image = next((sample[s] for s in IMAGE_SUFFIXES if s in sample), None)
        if image is None:
            return name, Unreadable(f"no image member (.{', .'.join(IMAGE_SUFFIXES)})"), -1
        label = _label(sample)
        if isinstance(label, Unreadable):
            return name, label, -1
        checked = checked_label(label, len(self.class_names))
        if isinstance(checked, Unreadable) and self.classes_from and _LABEL.fullmatch(str(label)):
            raise DataError(f"{name}: label {label} is outside the {len(self.class_names)} classes {self.classes_from} "
                            "gives; fix it, or give the classes with --set data.class_map=FILE")
        return (name, checked, -1) if isinstance(checked, Unreadable) else (name, image, checked)


def _label(sample: dict) -> object:
    if "cls" in sample:
        text = sample["cls"].decode("utf-8", "replace").strip()
        return int(text) if _LABEL.fullmatch(text) else Unreadable(f"its .cls {text[:40]!r} is not a class number")
    if "json" in sample:
        try:
            value = json.loads(sample["json"])
        except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's limit
            return Unreadable("its .json member is not JSON (or nested too deeply)")
        return value.get("label") if isinstance(value, dict) else value
    return Unreadable("no label member (.cls or .json)")


def wds_source(spec: SourceSpec, length: int | None = None, class_map: str | None = None,
               index_cache: str | Path | None = None) -> Source:
    """The splits of `spec.arg`: a folder with index.json, a folder of shards written by other tools
    (resmlp.data.sources.wds_census), or a brace pattern (see the module doc); a URL:
    resmlp.data.sources.wds_remote."""
    optional_module("webdataset")
    arg = spec.arg
    refuse_pipe(arg)
    if os.path.isdir(arg):
        index_path = Path(arg) / INDEX
        if index_path.is_file():
            return _indexed(spec, index_path, length)
        return _foreign(spec, Path(arg), length, class_map, index_cache)
    return _pattern(spec, length, class_map, index_cache)


def _foreign(spec: SourceSpec, folder: Path, length: int | None, class_map: str | None,
             index_cache: str | Path | None) -> Source:
    """A folder of shards without index.json: timm's _info.json gives splits and counts, else the names give
    the splits and one pass over the headers the counts (cached)."""
    info = info_splits(folder, MAX_SHARDS)
    found = {s: paths for s, (paths, _) in info.items()} if info else discover(folder, MAX_SHARDS)
    for paths in found.values():
        missing = [p for p in paths if not os.path.isfile(p)]
        if missing:
            raise DataError(f"shard {missing[0]} named by {folder}'s shard info is missing ({len(missing)} in all)")
    counts = {s: lengths for s, (_, lengths) in info.items()} if info else {}
    named = info_classes(folder) if info else None
    return _made(spec, found, counts, class_map, named, length, index_cache)


def _made(spec: SourceSpec, found: dict[str, list[str]], counts: dict[str, list[int]], class_map: str | None,
          named: list[str] | int | None, length: int | None, index_cache: str | Path | None) -> Source:
    """The splits' ShardFiles; counts and classes no file gave counted from the shards (wds_census)."""
    from resmlp.data.sources.imagenet import read_class_map

    largest, counted = -1, False
    for split, paths in found.items():
        if split not in counts or (class_map is None and named is None):
            counts[split], top = census(paths, index_cache)
            largest, counted = max(largest, top), True
    if class_map:
        classes = check_class_names(read_class_map(class_map), class_map)
    elif isinstance(named, list):
        classes = check_class_names(named, f"{spec} shard info")
    else:
        total = named if isinstance(named, int) else largest + 1
        if total < 1:
            raise DataError(f"{spec}: no record has a class label (.cls or .json); give the classes with "
                            "--set data.class_map=FILE")
        classes = check_class_names([str(c) for c in range(total)], f"{spec} labels")
    made = {split: ShardFiles(paths, counts[split], classes, length if split == "train" else None, f"{spec} {split}")
            for split, paths in found.items()}
    for records in made.values():
        records.classes_from = None if counted else f"data.class_map {class_map}" if class_map else "the shard info"
    return Source(spec, made)


def read_index(path: Path) -> dict:
    """index.json as `resmlp data shards` writes it, checked: {classes: [...], splits: {split: [shard...]}}."""
    index = read_json_object(path, "shard index")
    classes, splits = index.get("classes"), index.get("splits")
    if index.get("format") != INDEX_FORMAT or not isinstance(classes, list) or not classes \
            or not all(isinstance(c, str) for c in classes) or not isinstance(splits, dict):
        raise DataError(f"{path} is not a shard index ({INDEX_FORMAT}: format, classes, splits); rewrite the shards "
                        "with resmlp data shards")
    check_class_names(classes, str(path))
    seen: set[str] = set()
    for split, shards in splits.items():
        if split not in SPLITS or not isinstance(shards, list) or not all(
                isinstance(s, dict) and isinstance(s.get("name"), str) and "/" not in s["name"]
                and _count(s.get("samples")) and _count(s.get("bytes")) for s in shards):
            raise DataError(f"{path}: split {split!r} is not a list of shards {{name, samples, bytes}} (counts: "
                            "integers from 0)")
        for shard in shards:
            if shard["name"] in seen:
                raise DataError(f"{path}: shard {shard['name']} is listed twice (its records would be read twice); "
                                "rewrite the shards with resmlp data shards")
            seen.add(shard["name"])
    return index


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def expansions(pattern: str) -> int:
    """How many names braceexpand makes of `pattern`, counted without expanding it (an upper bound where
    braces are escaped)."""
    total, start = 1, 0
    while (opening := pattern.find("{", start)) >= 0:
        depth, end = 0, opening
        for end in range(opening, len(pattern)):
            depth += {"{": 1, "}": -1}.get(pattern[end], 0)
            if depth == 0:
                break
        if depth:  # unbalanced: braceexpand leaves the rest as it is
            return total
        total *= _group_size(pattern[opening + 1:end])
        start = end + 1
    return total


def _group_size(body: str) -> int:
    if numbers := _RANGE.fullmatch(body):
        if any(len(n) > 18 for n in numbers.groups() if n):
            return MAX_SHARDS + 1
        first, last, step = (int(n) if n else 1 for n in numbers.groups())
        return abs(last - first) // max(abs(step), 1) + 1
    if re.fullmatch(r"[A-Za-z]\.\.[A-Za-z]", body):
        return abs(ord(body[-1]) - ord(body[0])) + 1
    parts, depth, part = [], 0, ""
    for char in body:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(part)
            part = ""
        else:
            part += char
    return sum(expansions(p) for p in [*parts, part]) if parts else 1


def _indexed(spec: SourceSpec, index_path: Path, length: int | None) -> Source:
    index = read_index(index_path)
    made = {}
    for split, shards in index["splits"].items():
        paths = [str(index_path.parent / s["name"]) for s in shards]
        for path, shard in zip(paths, shards, strict=True):
            size = os.path.getsize(path) if os.path.isfile(path) else None
            if size != shard["bytes"]:
                state = "is missing" if size is None else f"is {size} bytes, not the {shard['bytes']} of {INDEX}"
                raise DataError(f"shard {path} {state} (truncated or replaced); write the shards again: "
                                "resmlp data shards resumes where it stopped")
        made[split] = ShardFiles(paths, [s["samples"] for s in shards], index["classes"],
                                 length if split == "train" else None, f"{spec} {split}")
    return Source(spec, made)


def _pattern(spec: SourceSpec, length: int | None, class_map: str | None,
             index_cache: str | Path | None) -> Source:
    import braceexpand

    pattern = spec.arg
    splits = SPLITS if "{split}" in pattern else ("train",)
    named = expansions(pattern.replace("{split}", "train"))
    if named > MAX_SHARDS:
        raise DataError(f"{pattern} names {named:,} shards, more than the {MAX_SHARDS:,} accepted; check the "
                        "brace range (e.g. {000000..000146})")
    found = {}
    for split in splits:
        for name in SPLIT_NAMES[split]:
            paths = list(braceexpand.braceexpand(pattern.replace("{split}", name)))
            if any(os.path.isfile(p) for p in paths):
                found[split] = paths
                break
    if "train" not in found:
        raise FileNotFoundError(f"no shard of {pattern} exists" + (" for the train split" if len(splits) > 1 else ""))
    missing = [p for paths in found.values() for p in paths if not os.path.isfile(p)]
    if missing:
        raise DataError(f"shard {missing[0]} of {pattern} is missing ({len(missing)} in all); fix the pattern or "
                        "restore the shards")
    beside = Path(found["train"][0]).parent / INDEX
    if not beside.is_file():
        return _made(spec, found, {}, class_map, None, length, index_cache)
    index = read_index(beside)
    counts = {s["name"]: s["samples"] for shards in index["splits"].values() for s in shards}
    made = {}
    for split, paths in found.items():
        known = [counts.get(Path(p).name) for p in paths]
        made[split] = ShardFiles(paths, known if None not in known else None, index["classes"],
                                 length if split == "train" else None, f"{spec} {split}")
    return Source(spec, made)

"""Hugging Face datasets from local files: the `hf:` source, read with the `datasets` library.

`hf:DIR` names
- a dataset saved with `datasets` (`save_to_disk`: a DatasetDict of splits, or one Dataset, the train split),
  read with `datasets.load_from_disk` (memory-mapped Arrow, nothing loaded up front); or
- a folder of parquet files, as the Hub stores `imagenet-1k` (`train-00000-of-00294.parquet`, in DIR or
  DIR/data/): the split is the file name's first word (validation is val), read with
  `datasets.Dataset.from_parquet`.
The image column is `image` (or `img`), the label column `label` (or `labels`); the class names come from
the label's ClassLabel feature (else data.class_map, else the indices). Records are the image's encoded bytes
as stored (the Image feature with decode=False), never decoded here.

Map-style by default; with data.streaming, each split is read as a stream of contiguous shards of its Arrow
table (`Dataset.shard(contiguous=True)`, read in order), split across ranks and workers as
resmlp.data.sources.streams states. Not datasets' own IterableDataset: it splits itself again inside each DataLoader
worker, so a worker past its shard count gets nothing. Parquet files are converted to Arrow once by
`from_parquet` (datasets' cache) in both modes: streaming saves memory and random reads, not that copy.
Wrong columns and labels out of range are refused in one line before training.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.data.images import read_image_bytes
from resmlp.data.records import (
    MAX_CLASSES,
    MapRecords,
    Payload,
    Source,
    SourceSpec,
    Unreadable,
    check_class_names,
    optional_module,
)
from resmlp.data.sources.remote import refuse_pipe
from resmlp.data.sources.streams import ShardedRecords, checked_label
from resmlp.errors import DataError
from resmlp.fileio import read_json_object

IMAGE_COLUMNS, LABEL_COLUMNS = ("image", "img"), ("label", "labels")
SPLIT_WORDS = {"train": "train", "training": "train", "val": "val", "valid": "val", "validation": "val",
               "test": "test"}
STREAM_SHARDS = 64  # shards of a streamed split (at most its number of records): enough for 8 ranks x 8 workers


def _payload(value: Any, what: str) -> Payload:
    """The bytes of an Image feature's undecoded value ({'bytes', 'path'})."""
    if isinstance(value, dict) and value.get("bytes") is not None:
        return bytes(value["bytes"])
    if isinstance(value, dict) and value.get("path"):
        return read_image_bytes(value["path"])
    raise DataError(f"{what} has no image bytes nor path")


class HfRecords(MapRecords):
    """One split of a datasets.Dataset, its image column undecoded."""

    def __init__(self, dataset: Any, image: str, labels: np.ndarray, class_names: list[str], what: str) -> None:
        super().__init__(labels, class_names)
        self.dataset, self.image, self.what = dataset, image, what

    def payload(self, index: int) -> Payload:
        return _payload(self.dataset[int(index)][self.image], self.name(index))

    def name(self, index: int) -> str:
        return f"{self.what}[{int(index)}]"

    def subset(self, indices: np.ndarray) -> HfRecords:
        return HfRecords(self.dataset.select(indices), self.image, self.labels[indices], self.class_names,
                         f"{self.what} subset")


class HfStream(ShardedRecords):
    """One split read as a stream, shard by shard."""

    def __init__(self, dataset: Any, image: str, label: str, class_names: list[str], what: str) -> None:
        shards = max(1, min(STREAM_SHARDS, len(dataset)))
        counts = [_bounds(len(dataset), shards, i).stop - _bounds(len(dataset), shards, i).start
                  for i in range(shards)]
        super().__init__(shards, counts, class_names, None, what)
        self.dataset, self.image, self.label = dataset, image, label

    def read_shard(self, index: int) -> Iterator[tuple[str, Payload, int]]:
        # datasets' own IterableDataset splits itself again inside each DataLoader worker (a worker past its
        # shard count gets nothing), which would break the contract of resmlp.data.sources.streams: a shard here is a
        # contiguous slice of the memory-mapped Arrow table, read in order, batch by batch
        rows = self.dataset.shard(self.num_shards, index, contiguous=True)
        start = _bounds(len(self.dataset), self.num_shards, index).start
        for offset, row in enumerate(rows):
            name = f"{self.what}[{start + offset}]"
            label = checked_label(row[self.label], len(self.class_names))
            if isinstance(label, Unreadable):
                yield name, label, -1
                continue
            try:
                yield name, _payload(row[self.image], name), label
            except DataError as e:
                yield name, Unreadable(str(e)), -1


def _bounds(size: int, shards: int, index: int) -> slice:
    """The rows of contiguous shard `index` of `shards`, as datasets cuts them (the first size % shards one
    longer)."""
    div, mod = divmod(size, shards)
    start = div * index + min(index, mod)
    return slice(start, start + div + (index < mod))


def hf_source(spec: SourceSpec, streaming: bool = False, class_map: str | None = None) -> Source:
    """The splits of `spec.arg` (see the module doc); a URL: resmlp.data.sources.hf_remote."""
    refuse_pipe(spec.arg)
    datasets = optional_module("datasets")
    root = Path(spec.arg)
    if not root.is_dir():
        raise FileNotFoundError(f"hf: {root} does not exist (a folder written by save_to_disk, or of parquet files)")
    splits = _load(datasets, root)
    if not splits:
        raise DataError(f"hf:{root} holds no split; expected a train split at least")
    made = {}
    for split, dataset in splits.items():
        made[split] = _records(datasets, dataset, f"{spec} {split}", streaming, class_map)
    names = {tuple(r.class_names) for r in made.values()}
    if len(names) > 1:
        raise DataError(f"{spec}: the splits' label features name different classes; they must agree")
    return Source(spec, made)


def _load(datasets: Any, root: Path) -> dict[str, Any]:
    if (root / "dataset_dict.json").is_file():
        splits = _saved_splits(root)
        loaded = {s: _guarded(lambda s=s: datasets.load_from_disk(str(root / s)), f"hf:{root / s}") for s in splits}
        return {SPLIT_WORDS[s]: d for s, d in loaded.items()}
    if (root / "dataset_info.json").is_file() or (root / "state.json").is_file():
        _check_data_files(root)
        return {"train": _guarded(lambda: datasets.load_from_disk(str(root)), f"hf:{root}")}
    files = sorted(p for folder in (root, root / "data") if folder.is_dir() for p in folder.glob("*.parquet"))
    if not files:
        raise FileNotFoundError(f"hf:{root} holds neither a dataset saved with datasets (save_to_disk) nor parquet "
                                "files (DIR/train-*.parquet or DIR/data/train-*.parquet)")
    grouped: dict[str, list[str]] = {}
    for path in files:
        word = re.split(r"[-_.]", path.name, maxsplit=1)[0].lower()
        if word not in SPLIT_WORDS:
            raise DataError(f"{path}: its name does not start with a split (train, validation, test...)")
        grouped.setdefault(SPLIT_WORDS[word], []).append(str(path))
    datasets.disable_progress_bars()  # one bar per file and split: noise before the training's own bar
    unreadable = "its parquet files can't be read as one dataset per split (damaged, or two schemas in one split)"
    return {split: _guarded(lambda split=split, paths=paths: datasets.Dataset.from_parquet(
        paths, split="train" if split == "train" else "test"), f"hf:{root}", unreadable)
        for split, paths in grouped.items()}


def _saved_splits(root: Path) -> list[str]:
    """The splits dataset_dict.json names, checked before datasets joins them to the folder: known split words
    only (a name such as ../other would load another dataset), each a folder whose data files are its own."""
    splits = read_json_object(root / "dataset_dict.json", "datasets' split list").get("splits")
    if not isinstance(splits, list) or not splits:
        raise DataError(f"{root / 'dataset_dict.json'} names no splits (an empty DatasetDict); save the dataset "
                        "with its train split")
    for split in splits:
        if split not in SPLIT_WORDS:
            raise DataError(f"{root}: split {str(split)[:40]!r} is not one of {', '.join(SPLIT_WORDS)}")
        _check_data_files(root / split)
    return splits


def _check_data_files(folder: Path) -> None:
    """The Arrow files state.json names are plain files of `folder`: datasets opens whatever path it holds
    (../other/data.arrow, an absolute path, a link out), and the run would train on another dataset."""
    state = folder / "state.json"
    if not state.is_file():
        raise DataError(f"{folder} has no state.json; it is not a dataset written by save_to_disk")
    files = read_json_object(state, "datasets' state").get("_data_files")
    if not isinstance(files, list) or not files:
        raise DataError(f"{state}: expected a list of data files under \"_data_files\"")
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        path = folder / name if isinstance(name, str) else None
        if path is None or Path(name).name != name or name in (".", "..") or path.is_symlink() or not path.is_file():
            raise DataError(f"{state}: data file {str(name)[:80]!r} is not a file of {folder} (state.json may "
                            "name only the Arrow files saved beside it)")


def _guarded(call: Callable[[], Any], where: str, what: str = "can't be read as a saved dataset") -> Any:
    """datasets' or pyarrow's own exceptions (a damaged file, features in dataset_info.json that disagree with
    the Arrow data, two schemas) as one line naming the folder."""
    datasets = optional_module("datasets")
    try:
        return call()
    except (OSError, ValueError, TypeError, KeyError, IndexError, datasets.exceptions.DatasetsError) as e:
        cause = e.__cause__ or e  # DatasetGenerationError's own message is only "An error occurred..."
        reason = (str(cause).splitlines() or [type(cause).__name__])[0][:200]
        raise DataError(f"{where}: {what}: {type(cause).__name__}: {reason}") from None


def _records(datasets: Any, dataset: Any, what: str, streaming: bool, class_map: str | None):
    columns = list(dataset.column_names)
    image = next((c for c in IMAGE_COLUMNS if c in columns), None)
    label = next((c for c in LABEL_COLUMNS if c in columns), None)
    if image is None or label is None or not isinstance(dataset.features[image], datasets.Image):
        raise DataError(f"{what}: expected an image column ({' or '.join(IMAGE_COLUMNS)}, of the Image feature) and a "
                        f"label column ({' or '.join(LABEL_COLUMNS)}); it has {', '.join(columns[:10])}")
    dataset = _guarded(lambda: dataset.cast_column(image, datasets.Image(decode=False)), what,
                       f"its {image} column can't be read undecoded")
    labels = _guarded(lambda: np.asarray(dataset.data.column(label).to_numpy(zero_copy_only=False)), what,
                      f"its {label} column can't be read")
    if labels.dtype.kind not in "iu":
        raise DataError(f"{what}: the {label} column holds {labels.dtype}, not class indices")
    class_names = _class_names(datasets, dataset.features[label], labels, class_map, label, what)
    bad = labels[(labels < 0) | (labels >= len(class_names))]
    if bad.size:
        raise DataError(f"{what}: label {int(bad[0])} is outside [0, {len(class_names)}) (the {len(class_names)} "
                        "classes of the label feature); the dataset and its classes disagree")
    if streaming:
        return HfStream(dataset, image, label, class_names, what)
    return HfRecords(dataset, image, labels.astype(np.int64), class_names, what)


def _class_names(datasets: Any, feature: Any, labels: np.ndarray, class_map: str | None, column: str,
                 what: str) -> list[str]:
    if isinstance(feature, datasets.ClassLabel):
        return check_class_names(feature.names, f"{what}: the {column} column's ClassLabel")
    if class_map:
        from resmlp.data.sources.imagenet import read_class_map

        return check_class_names(read_class_map(class_map), f"class map {class_map}")
    # no names: the classes are 0..max label, counted before the list of names is made (one row labelled 2**31
    # would otherwise make two billion names, then a head and a K x K confusion matrix of that size)
    count = int(labels.max()) + 1 if labels.size else 1
    if count > MAX_CLASSES:
        raise DataError(f"{what}: the {column} column's largest label {count - 1:,} makes {count:,} classes, more than "
                        f"{MAX_CLASSES:,} (the evaluation's {count:,} x {count:,} confusion matrix alone would take "
                        f"~{count**2 * 8 / 2**30:,.0f} GiB); fix the labels, or give the column a ClassLabel feature")
    return [str(i) for i in range(max(count, 1))]

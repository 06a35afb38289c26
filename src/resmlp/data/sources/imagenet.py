"""Image folders as ImageNet is stored: the `folder:DIR` source.

DIR holds one folder per split, under the names timm accepts: train (training), val (valid, validation),
test. A split folder holds either
- one folder per class, `<class>/<image>` (a class folder may be a symlink: followed at this level only, so
  no walk loops), or
- ImageNet's raw validation layout: the images flat, with a ground-truth file beside them or in DIR:
  `LOC_<split>_solution.csv` (the Kaggle/ILSVRC download: `ImageId,PredictionString`, the synset first) or
  `<split>.txt` (`name label` per line, the label a class index or name).
Class names come from a class map file when given (`data.class_map`: one class per line, its index the line
number, as timm's --class-map), else from the training split's class folders, sorted. Every split is
mapped through that one list: a class folder the list lacks is an error, not a shifted label.

Listing is fast at ImageNet's 1.28 M files: one `os.scandir` per folder, no `os.stat` or open per file
(resmlp.data.sources.walk.list_files); an unreadable file is found, skipped and counted when it is read. The file
names live in one byte buffer plus offsets (`PackedNames`), numpy arrays that DataLoader workers share
after fork without the reference-count writes that copy a Python list of strings into each worker.
`folder:FILE.tar` reads a tar of such a folder in place (resmlp.data.sources.imagenet_tar).
Safety kept from before: an empty class folder and a flat folder without ground truth are refused; files
that are not regular (FIFOs) are never opened (resmlp.data.images).
"""

from __future__ import annotations

import csv
import hashlib
import os
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS

from resmlp.data.images import read_image_bytes
from resmlp.data.records import MapRecords, Source, SourceSpec
from resmlp.data.sources.walk import list_files
from resmlp.errors import DataError

SPLIT_NAMES = {"train": ("train", "training"), "val": ("val", "valid", "validation"), "test": ("test",)}
MAX_CLASS_MAP_BYTES = 64 << 20
MAX_GROUND_TRUTH_BYTES = 1 << 30


def is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)  # .JPEG (ImageNet's own names) too


class PackedNames:
    """Strings in one uint8 buffer plus int64 offsets: two numpy arrays, however many names."""

    def __init__(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self.buffer, self.offsets = buffer, offsets

    @classmethod
    def pack(cls, names: Sequence[str]) -> PackedNames:
        encoded = [name.encode("utf-8", "surrogateescape") for name in names]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8).copy(), offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, index: int) -> str:
        start, end = self.offsets[index], self.offsets[index + 1]
        return self.buffer[start:end].tobytes().decode("utf-8", "surrogateescape")

    def subset(self, indices: np.ndarray) -> PackedNames:
        return PackedNames.pack([self[int(i)] for i in indices])


class FileRecords(MapRecords):
    """Image files under `root` (names relative to it) with labels; the payload is the file's bytes."""

    def __init__(self, root: str | Path, names: PackedNames, labels: np.ndarray, class_names: Sequence[str]) -> None:
        super().__init__(labels, class_names)
        self.root, self.names = str(root), names

    def path(self, index: int) -> str:
        return os.path.join(self.root, self.names[index])

    def payload(self, index: int) -> bytes:
        return read_image_bytes(self.path(index))

    def name(self, index: int) -> str:
        return self.path(index)

    def subset(self, indices: np.ndarray) -> FileRecords:
        return FileRecords(self.root, self.names.subset(indices), self.labels[indices], self.class_names)


def folder_source(spec: SourceSpec, class_map: str | None = None, index_cache: str | Path | None = None) -> Source:
    """The splits found in folder `spec.arg` (see the module doc); DataError if it has no training split."""
    root = Path(spec.arg)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist (expected {root}/train/<class>/<image>.jpg)")
    folders = split_folders(root)
    if "train" not in folders and "val" not in folders and "test" not in folders:
        raise FileNotFoundError(f"{root} has no train/ folder (nor training/, val/, validation/ or test/); expected "
                                f"{root}/train/<class>/<image>.jpg and {root}/val/<class>/<image>.jpg")
    names: list[str] = []

    def classes() -> list[str]:
        if not names:
            first = folders.get("train") or next(iter(folders.values()))
            names.extend(read_class_map(class_map) if class_map else class_folders(first))
            if not names:
                raise ValueError(f"{first} has no class sub-folders; expected the layout {first}/<class>/<image>.jpg")
        return names

    def records(split: str) -> FileRecords:
        if index_cache is None or not class_folders(folders[split]):
            return split_records(folders[split], root, split, classes(), bool(class_map))
        return cached_records(folders[split], root, split, classes(), bool(class_map), Path(index_cache))

    return Source(spec, {split: (lambda s=split: records(s)) for split in folders})


def split_folders(root: Path) -> dict[str, Path]:
    """{split: folder} of the split folders in `root`, under any of their names (split_names)."""
    with os.scandir(root) as entries:
        present = [e.name for e in entries if e.is_dir()]
    return {split: root / name for split, name in split_names(present, str(root)).items()}


def split_names(present: Iterable[str], where: str) -> dict[str, str]:
    """{split: name} of the split folder names among `present` (timm's synonyms); two names for one split (val/
    and validation/) are an error, not a guess."""
    present = set(present)
    found = {}
    for split, synonyms in SPLIT_NAMES.items():
        named = [name for name in synonyms if name in present]
        if len(named) > 1:
            raise DataError(f"{where} has {' and '.join(n + '/' for n in named)}: both name the {split} split; "
                            "keep one (rename or move the other)")
        if named:
            found[split] = named[0]
    return found


def class_folders(split_dir: Path) -> list[str]:
    """The class folder names of a split folder, sorted; symlinks to folders count (followed here only)."""
    with os.scandir(split_dir) as entries:
        return sorted(e.name for e in entries if e.is_dir())  # is_dir follows a symlink; d_type answers the rest


def read_class_map(path: str | Path) -> list[str]:
    """A class map file: one class name per line, its index the line number (timm's --class-map .txt)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"class map {path} does not exist (data.class_map: a text file, one class per line)")
    if path.stat().st_size > MAX_CLASS_MAP_BYTES:
        raise DataError(f"class map {path} is larger than {MAX_CLASS_MAP_BYTES} bytes; it holds one class per line")
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines()]
    names = [line.split()[0] for line in lines if line]
    duplicates = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) != len(names) else []
    if not names or duplicates:
        raise DataError(f"class map {path}: expected one distinct class name per line, got "
                        + (f"{', '.join(duplicates[:5])} more than once" if duplicates else "no names"))
    return names


def split_records(split_dir: Path, root: Path, split: str, classes: list[str], mapped: bool,
                  visited: list[str] | None = None) -> FileRecords:
    """The records of one split folder: class folders, or a flat folder with its ground-truth file. `visited`
    receives the folders listed (relative to the split folder)."""
    visited = [] if visited is None else visited
    present = class_folders(split_dir)
    if not present:
        return _ground_truth_records(split_dir, root, split, classes)
    files_by_class = {}
    for name in present:
        inside: list[str] = []
        files_by_class[name] = list_files(split_dir / name, is_image_name, folders=inside)
        visited.extend(f"{name}/{rel}" if rel else name for rel in inside)
    names, labels = label_class_files(str(split_dir), split, files_by_class, classes, mapped)
    return FileRecords(split_dir, PackedNames.pack(names), labels, classes)


def label_class_files(split_dir: str, split: str, files_by_class: dict[str, list[str]], classes: list[str],
                      mapped: bool) -> tuple[list[str], np.ndarray]:
    """The names (`<class>/<file>`) and labels of a split's class folders, `files_by_class` {class folder: its
    image files, in torchvision's order}; every class folder must be in `classes` (and, without a class map,
    be all of them), and none empty. Shared by folders and tars of them (resmlp.data.sources.imagenet_tar)."""
    present = sorted(files_by_class)
    index = {name: i for i, name in enumerate(classes)}
    unknown = [name for name in present if name not in index]
    if unknown:
        where = "the class map" if mapped else f"the training split's {len(classes)} class folders"
        raise DataError(f"{split_dir} has class folder(s) {', '.join(unknown[:5])} that {where} lacks; the class "
                        "lists must agree (fix the folders or the class map, data.class_map)")
    if not mapped and present != classes:
        missing = sorted(set(classes) - set(present))
        raise DataError(f"train and {split} classes differ: {split_dir} lacks {', '.join(missing[:5])}; both splits "
                        "need the same class folders (or give a class map, data.class_map)")
    empty = [name for name in present if not files_by_class[name]]
    if empty:
        raise ValueError(f"class folder(s) with no images in {split_dir}: {', '.join(empty[:10])}; remove them "
                         f"or add images (extensions {', '.join(IMG_EXTENSIONS)})")
    names = [f"{name}/{f}" for name in present for f in files_by_class[name]]
    labels = np.asarray([index[name] for name in present for _ in files_by_class[name]], dtype=np.int64)
    return names, labels


def cached_records(split_dir: Path, root: Path, split: str, classes: list[str], mapped: bool,
                   cache: Path) -> FileRecords:
    """split_records, kept in `cache` (the run's folder) between starts of a run: valid while every folder
    listed keeps its modification time (a file added, removed or renamed changes its folder's), so a restart
    reads one stat per folder instead of listing them again."""
    key = hashlib.sha256(f"{split_dir.resolve()}\0{classes}".encode()).hexdigest()[:16]
    path = cache / "data_index" / f"{split}-{key}.npz"
    try:
        with np.load(path) as saved:
            folders = PackedNames(saved["folder_buffer"], saved["folder_offsets"])
            mtimes = [os.stat(split_dir / folders[i]).st_mtime_ns for i in range(len(folders))]
            names, labels = PackedNames(saved["buffer"], saved["offsets"]), saved["labels"]
            consistent = len(names) == len(labels) and (not len(labels) or 0 <= labels.min() <= labels.max()
                                                        < len(classes))
            if consistent and np.array_equal(np.asarray(mtimes, dtype=np.int64), saved["mtimes"]):
                return FileRecords(split_dir, names, labels, classes)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):  # no cache, a folder gone, damage: list
        pass
    visited: list[str] = [""]
    records = split_records(split_dir, root, split, classes, mapped, visited)
    folders = PackedNames.pack(visited)
    mtimes = np.asarray([os.stat(split_dir / f).st_mtime_ns for f in visited], dtype=np.int64)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, buffer=records.names.buffer, offsets=records.names.offsets, labels=records.labels,
                 folder_buffer=folders.buffer, folder_offsets=folders.offsets, mtimes=mtimes)
        os.replace(tmp, path)
    except OSError:  # a read-only run folder: no cache, the listing stands
        pass
    return records


def _ground_truth_records(split_dir: Path, root: Path, split: str, classes: list[str]) -> FileRecords:
    """ImageNet's flat validation folder, labelled by LOC_<split>_solution.csv or <split>.txt."""
    files = list_files(split_dir, is_image_name, max_entries=10_000_000)
    truth_file = _find_ground_truth(split_dir, root, split)
    if truth_file is None:
        if not files:
            raise ValueError(f"{split_dir} has no class sub-folders; expected the layout "
                             f"{split_dir}/<class>/<image>.jpg")
        raise DataError(f"{split_dir} holds {len(files)} images but no class folders and no ground-truth file: add "
                        f"{root}/LOC_{split_dir.name}_solution.csv or {root}/{split_dir.name}.txt (`name label` per "
                        f"line), or sort the images into {split_dir}/<class>/")
    names, labels = label_flat_files(files, _read_ground_truth(truth_file, classes), str(truth_file), str(split_dir))
    return FileRecords(split_dir, PackedNames.pack(names), labels, classes)


def label_flat_files(files: list[str], truth: dict[str, int], truth_file: str, split_dir: str
                     ) -> tuple[list[str], np.ndarray]:
    """A flat validation folder's files and their labels from its ground truth ({image name or stem: label});
    every image must have one."""
    unlabeled = [f for f in files if f.split("/")[-1] not in truth and Path(f).stem not in truth]
    if unlabeled:
        raise DataError(f"{truth_file} has no label for {len(unlabeled)} image(s) of {split_dir}, e.g. {unlabeled[0]}; "
                        "the ground truth must name every image")
    return files, np.asarray([truth.get(f.split("/")[-1], truth.get(Path(f).stem)) for f in files], dtype=np.int64)


def _find_ground_truth(split_dir: Path, root: Path, split: str) -> Path | None:
    for folder in (split_dir, root):
        for name in {split_dir.name, split}:
            for candidate in (f"LOC_{name}_solution.csv", f"{name}.txt"):
                if (folder / candidate).is_file():
                    return folder / candidate
    return None


def _read_ground_truth(path: Path, classes: list[str]) -> dict[str, int]:
    """{image name or stem: class index} from a Kaggle solution CSV or a `name label` text file."""
    if path.stat().st_size > MAX_GROUND_TRUTH_BYTES:
        raise DataError(f"{path} is larger than {MAX_GROUND_TRUTH_BYTES} bytes; a ground-truth file is a few MB")
    return parse_ground_truth(path.read_text(encoding="utf-8", errors="replace"), path.suffix == ".csv", str(path),
                              classes)


def parse_ground_truth(text: str, solution_csv: bool, what: str, classes: list[str]) -> dict[str, int]:
    """{image name or stem: class index} from the text of a Kaggle solution CSV (`solution_csv`) or of a
    `name label` file named `what`."""
    index = {name: i for i, name in enumerate(classes)}
    if solution_csv:
        rows = list(csv.reader(text.splitlines()))
        if not rows or [c.strip() for c in rows[0][:2]] != ["ImageId", "PredictionString"]:
            raise DataError(f"{what} is not an ILSVRC solution file: expected the header ImageId,PredictionString")
        pairs = [(row[0].strip(), (row[1].split() or [""])[0]) for row in rows[1:] if len(row) >= 2]
    else:
        pairs = [tuple(line.split()[:2]) for line in text.splitlines() if line.strip()]
        bad = next((p for p in pairs if len(p) != 2), None)
        if bad is not None:
            raise DataError(f"{what}: line {' '.join(bad)!r} is not `name label`")
    truth = {}
    for name, label in pairs:
        if label in index:
            truth[name] = index[label]
        elif label.isdigit() and int(label) < len(classes):
            truth[name] = int(label)
        else:
            raise DataError(f"{what}: label {label!r} of {name} is neither one of the {len(classes)} classes nor an "
                            f"index below {len(classes)}; the ground truth and the class list disagree")
    return truth

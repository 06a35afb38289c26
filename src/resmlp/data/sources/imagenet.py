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
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
from torchvision.datasets.folder import IMG_EXTENSIONS

from resmlp.data.images import read_image_bytes
from resmlp.data.records import MAX_CLASSES, MapRecords, Source, SourceSpec, check_class_names
from resmlp.data.sources.index_cache import index_path, load_index, safe_names, save_index
from resmlp.data.sources.walk import list_files
from resmlp.errors import DataError

SPLIT_NAMES = {"train": ("train", "training"), "val": ("val", "valid", "validation"), "test": ("test",)}
MAX_CLASS_MAP_BYTES = 64 << 20
# a ground-truth file has one line per image (ImageNet's val: 50,000 lines of a name, a synset and boxes)
MAX_GROUND_TRUTH_BYTES = 256 << 20
MAX_GROUND_TRUTH_LINES = 10_000_000  # resmlp.data.sources.walk.MAX_WALK_ENTRIES: one line per image at most
MAX_BLANK_LINES = 1_000  # blank lines tolerated beyond one line per entry (trailing newlines, paragraph breaks)


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
    """The class folder names of a split folder, sorted; symlinks to folders count (followed here only).
    More than MAX_CLASSES entries are refused while listing, before a list of that size is kept."""
    found = []
    with os.scandir(split_dir) as entries:
        for entry in entries:
            if entry.is_dir():  # is_dir follows a symlink; d_type answers the rest
                found.append(entry.name)
                if len(found) > MAX_CLASSES:
                    raise DataError(f"{split_dir} has more than {MAX_CLASSES:,} class folders; name the folder "
                                    "that holds one folder per class")
    return sorted(found)


def read_class_map(path: str | Path) -> list[str]:
    """A class map file: one class name per line, its index the line number (timm's --class-map .txt);
    bounded in bytes before it is read and in classes (resmlp.data.records.check_class_names)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"class map {path} does not exist (data.class_map: a text file, one class per line)")
    if path.stat().st_size > MAX_CLASS_MAP_BYTES:
        raise DataError(f"class map {path} is larger than {MAX_CLASS_MAP_BYTES} bytes; it holds one class per line")
    text = path.read_text(encoding="utf-8-sig", errors="replace")  # -sig: a BOM is not part of the first name
    if text.count("\n") > MAX_CLASSES + MAX_BLANK_LINES:  # before splitting: a file of newlines is millions of strs
        raise DataError(f"class map {path} has more than {MAX_CLASSES:,} lines; it holds one class per line")
    return check_class_names([line.split()[0] for line in text.splitlines() if line.strip()], f"class map {path}")


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
    """split_records, kept in `cache`/data_index/ (resmlp.data.sources.index_cache) between starts of a run:
    valid while every folder listed keeps its modification time (a file added, removed or renamed changes its
    folder's), so a restart reads one stat per folder instead of listing them again. Cached names and labels
    are checked before use (relative names inside the split, labels in range); a cache failing them is ignored."""
    path = index_path(cache, split, f"{split_dir.resolve()}\0{classes}")
    if path is None:  # a folder that can't hold a cache: list
        return split_records(split_dir, root, split, classes, mapped)
    saved = load_index(path)
    if saved is not None:
        restored = _restore(saved, split_dir, classes)
        if restored is not None:
            return restored
    visited: list[str] = [""]
    records = split_records(split_dir, root, split, classes, mapped, visited)
    folders = PackedNames.pack(visited)
    mtimes = np.asarray([os.stat(split_dir / f).st_mtime_ns for f in visited], dtype=np.int64)
    save_index(path, {"buffer": records.names.buffer, "offsets": records.names.offsets,
                      "folder_buffer": folders.buffer, "folder_offsets": folders.offsets, "mtimes": mtimes})
    return records


def _restore(saved: dict[str, np.ndarray], split_dir: Path, classes: list[str]) -> FileRecords | None:
    """The cached records, if the cache is well formed, its names safe, each in a class folder of `classes` and
    every listed folder unchanged; else None (list again). The labels are derived from the names (`<class>/...`),
    as listing derives them: a label number stored in the cache (earlier versions wrote them) is never read."""
    try:
        names = PackedNames(saved["buffer"], saved["offsets"])
        folders = PackedNames(saved["folder_buffer"], saved["folder_offsets"])
        mtimes = saved["mtimes"]
    except KeyError:
        return None
    if not (safe_names(names.buffer, names.offsets) and safe_names(folders.buffer, folders.offsets)):
        return None
    if len(mtimes) != len(folders):
        return None
    index = {name: i for i, name in enumerate(classes)}
    data, bounds = names.buffer.tobytes(), names.offsets.tolist()
    labels = np.asarray([index.get(data[a:b].decode("utf-8", "surrogateescape").partition("/")[0], -1)
                         for a, b in zip(bounds[:-1], bounds[1:], strict=True)], dtype=np.int64)
    if len(labels) and labels.min() < 0:  # a name outside every class folder: not this split's listing
        return None
    try:
        now = [os.stat(split_dir / folders[i]).st_mtime_ns for i in range(len(folders))]
    except OSError:  # a folder gone
        return None
    return FileRecords(split_dir, names, labels, classes) if np.array_equal(now, mtimes) else None


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
    names, labels = label_flat_files(files, read_ground_truth(truth_file, classes), str(truth_file), str(split_dir))
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


def read_ground_truth(path: Path, classes: list[str]) -> dict[str, int]:
    """{image name or stem: class index} from a Kaggle solution CSV or a `name label` text file."""
    if path.stat().st_size > MAX_GROUND_TRUTH_BYTES:
        raise DataError(f"{path} is larger than {MAX_GROUND_TRUTH_BYTES} bytes; a ground-truth file has one short "
                        "line per image")
    return parse_ground_truth(decode_ground_truth(path.read_bytes()), path.suffix == ".csv", str(path), classes)


def decode_ground_truth(data: bytes) -> str:
    """A ground-truth file's text: UTF-8, a byte-order mark dropped (Windows editors write one, and it would
    otherwise become part of the first image's name)."""
    return data.decode("utf-8-sig", errors="replace")


def parse_ground_truth(text: str, solution_csv: bool, what: str, classes: list[str]) -> dict[str, int]:
    """{image name or stem: class index} from the text of a Kaggle solution CSV (`solution_csv`) or of a
    `name label` file named `what`. Every refusal is one line naming `what` and the line: too many lines
    (counted before any is split), a malformed line, a label that is neither a class nor an index, one image
    given two different labels."""
    lines = text.count("\n") + (not text.endswith("\n"))
    if lines > MAX_GROUND_TRUTH_LINES:
        raise DataError(f"{what} has {lines:,} lines, more than the {MAX_GROUND_TRUTH_LINES:,} images a dataset "
                        "folder may hold; a ground-truth file has one line per image")
    index = {name: i for i, name in enumerate(classes)}
    truth: dict[str, int] = {}
    for line, name, label in _ground_truth_rows(text, solution_csv, what):
        found = _class_index(label, index, len(classes))
        if found is None:
            raise DataError(f"{what}, line {line}: label {label[:40]!r} of {name[:80]} is neither one of the "
                            f"{len(classes)} classes nor an index below {len(classes)}; the ground truth and the "
                            "class list disagree")
        if truth.setdefault(name, found) != found:
            raise DataError(f"{what}, line {line}: {name[:80]} is labelled {classes[found]} here but "
                            f"{classes[truth[name]]} on an earlier line; each image needs one label")
    return truth


def _ground_truth_rows(text: str, solution_csv: bool, what: str) -> Iterator[tuple[int, str, str]]:
    """(line number, image name, label) of each non-blank row, read line by line (no list of every line)."""
    if solution_csv:
        reader = csv.reader(io.StringIO(text))
        header = next(reader, [])
        if [c.strip() for c in header[:2]] != ["ImageId", "PredictionString"]:
            raise DataError(f"{what} is not an ILSVRC solution file: expected the header ImageId,PredictionString")
        for row in reader:
            if len(row) >= 2:
                yield reader.line_num, row[0].strip(), (row[1].split() or [""])[0]
        return
    for line, text_line in enumerate(io.StringIO(text), 1):
        fields = text_line.split()
        if not fields:
            continue
        if len(fields) < 2:
            raise DataError(f"{what}, line {line}: {text_line.strip()[:80]!r} is not `name label`")
        yield line, fields[0], fields[1]


def _class_index(label: str, index: dict[str, int], count: int) -> int | None:
    """A label's class index: a class name, or a decimal index below `count` (ASCII digits only: `²` and `٣`
    are digits to str.isdigit but not to int)."""
    if label in index:
        return index[label]
    if label.isascii() and label.isdigit() and len(label) <= 9 and int(label) < count:
        return int(label)
    return None

"""CIFAR-10 / CIFAR-100 in the original python-pickle layout (cifar-10-batches-py/, cifar-100-python/).

Read directly instead of through torchvision.datasets.CIFAR10, which refuses any copy whose files
don't match the md5 sums of the original archive (subsets, re-packed copies), and which unpickles them
with plain pickle.load: a data folder could then run code. Here the pickles are read by an unpickler
that knows only the few names CIFAR's files contain (numpy's array reconstruction), so a planted
payload is refused with a message, never run.
"""

from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.data.arrays import ArrayDataset
from resmlp.data.records import ArrayRecords
from resmlp.errors import DataError

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "batches.meta", b"label_names", b"labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "meta", b"fine_label_names", b"fine_labels"),
}


def cifar(kind: str, split: str, data_dir: str | Path, in_chans: int = 3, transform=None) -> ArrayDataset:
    """Split 'train' or 'test' of `kind` ('cifar10' or 'cifar100') from `data_dir` or its parent."""
    records = cifar_records(kind, split, data_dir)
    return ArrayDataset(records.images, records.labels, records.class_names, in_chans=in_chans, transform=transform)


def cifar_records(kind: str, split: str, data_dir: str | Path) -> ArrayRecords:
    """Split 'train' or 'test' of `kind` as records (resmlp.data.sources): uint8 (N, 32, 32, 3) arrays."""
    folder, train_files, test_files, meta_file, names_key, labels_key = _LAYOUT[kind]
    root = Path(data_dir)
    base = root if (root / meta_file).is_file() else root / folder
    if not (base / meta_file).is_file():
        raise FileNotFoundError(
            f"{kind} not found: expected {root}/{folder}/{meta_file} (the python version of the dataset, "
            f"https://www.cs.toronto.edu/~kriz/cifar.html, extracted with tar xzf)"
        )
    names = _class_names(_field(_unpickle(base / meta_file), names_key, base / meta_file), base / meta_file)
    images, labels = [], []
    for name in train_files if split == "train" else test_files:
        path = base / name
        batch = _unpickle(path)
        data = _field(batch, b"data", path)
        # an array, not a list: a list can name one row 60,000 times in a few kB, and converting it would
        # allocate every copy; an array's bytes are in the file
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
                or data.shape[1] != 3 * 32 * 32:
            what = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
            raise DataError(f"{path} is not a CIFAR batch: expected a uint8 array of shape (N, 3072), got {what}")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(_labels(_field(batch, labels_key, path), len(data), len(names), path))
    return ArrayRecords(np.concatenate(images), np.concatenate(labels), names)


MAX_CLASSES = 100_000
MAX_NAME_LENGTH = 1000


def _class_names(names: Any, path: Path) -> list[str]:
    if not isinstance(names, list) or not 0 < len(names) <= MAX_CLASSES \
            or not all(isinstance(n, (bytes, str)) and len(n) <= MAX_NAME_LENGTH for n in names):
        raise DataError(f"{path} is not a CIFAR meta file: expected a list of 1 to {MAX_CLASSES} class names "
                        f"(strings of at most {MAX_NAME_LENGTH} characters)")
    return [_text(n) for n in names]


def _labels(labels: Any, count: int, num_classes: int, path: Path) -> np.ndarray:
    """The batch's labels as int64, each an integer (not 1.5 or True: a float would be truncated into a class
    silently) in [0, num_classes)."""
    if not isinstance(labels, (list, np.ndarray)) or len(labels) != count:
        size = len(labels) if isinstance(labels, (list, np.ndarray)) else type(labels).__name__
        raise DataError(f"{path} is not a CIFAR batch: expected a list of {count} labels (one per image), got {size}")
    if isinstance(labels, list) and not all(type(v) is int or isinstance(v, np.integer) for v in labels):
        bad = next(v for v in labels if not (type(v) is int or isinstance(v, np.integer)))
        raise DataError(f"{path}: label {bad!r:.40} is not an integer class index; the file is damaged")
    array = np.asarray(labels)
    if array.dtype.kind not in "iu":  # an object array (ints past 64 bits) or a float/bool array
        raise DataError(f"{path}: its labels are {array.dtype}, not integer class indices; the file is damaged")
    outside = array[(array < 0) | (array >= num_classes)] if count else array
    if len(outside):
        raise DataError(f"{path}: label {int(outside[0])} is outside [0, {num_classes}) (the {num_classes} class "
                        "names of the dataset's meta file); the file is damaged")
    return array.astype(np.int64)


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """The one function Python 3 writes into protocol-2 pickles of bytes (as _codecs.encode(s, 'latin1'))."""
    if codecs.lookup(encoding).name != "iso8859-1":
        raise pickle.UnpicklingError(f"refusing _codecs.encode with encoding {encoding!r}")
    return text.encode("latin-1")


# Everything a CIFAR pickle needs: numpy's array (and scalar) reconstruction, and the bytes encoding of
# Python 3 writers. The original files were written by Python 2's cPickle and use only the first three.
_ALLOWED: dict[tuple[str, str], Any] = {
    **{(module, "_reconstruct"): np.ndarray.__reduce__(np.zeros(0))[0]
       for module in ("numpy.core.multiarray", "numpy._core.multiarray")},
    **{(module, "scalar"): np.float64(0).__reduce__()[0]
       for module in ("numpy.core.multiarray", "numpy._core.multiarray")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


class _CifarUnpickler(pickle.Unpickler):
    """Python's documented way to restrict unpickling (overriding find_class): no other name resolves."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"it refers to {module}.{name}, which no CIFAR file contains") from None


def _unpickle(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR file {path} is missing")
    try:
        with open(path, "rb") as f:
            obj = _CifarUnpickler(f, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise DataError(f"refusing to read {path}: not a CIFAR python-pickle file ({e}); CIFAR files may hold "
                        "only arrays, lists and strings, never code. Re-download the dataset") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path} is not a CIFAR file: it holds a {type(obj).__name__}, not a dict")
    return obj


def _field(batch: dict, key: bytes, path: Path) -> Any:
    """batch[key], with the str key of files re-pickled by Python 3 accepted too."""
    for k in (key, key.decode()):
        if k in batch:
            return batch[k]
    raise DataError(f"{path} is not a CIFAR file: it has no {key.decode()!r} entry")


def _text(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)

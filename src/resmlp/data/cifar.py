"""CIFAR-10 / CIFAR-100 in the original python-pickle layout (cifar-10-batches-py/, cifar-100-python/).

Read directly instead of through torchvision.datasets.CIFAR10, which refuses any copy whose files
don't match the md5 sums of the original archive (subsets, re-packed copies).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from resmlp.data.arrays import ArrayDataset

MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
_LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"],
                "batches.meta", b"label_names", b"labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], "meta", b"fine_label_names", b"fine_labels"),
}


def cifar(kind: str, split: str, data_dir: str | Path, in_chans: int = 3, transform=None) -> ArrayDataset:
    """Split 'train' or 'test' of `kind` ('cifar10' or 'cifar100') from `data_dir` or its parent."""
    folder, train_files, test_files, meta_file, names_key, labels_key = _LAYOUT[kind]
    root = Path(data_dir)
    base = root if (root / meta_file).is_file() else root / folder
    if not (base / meta_file).is_file():
        raise FileNotFoundError(
            f"{kind} not found: expected {root}/{folder}/{meta_file} (the python version of the dataset, "
            f"https://www.cs.toronto.edu/~kriz/cifar.html, extracted with tar xzf)"
        )
    # the CIFAR files are pickles: only load copies you trust
    names = [n.decode() for n in _unpickle(base / meta_file)[names_key]]
    images, labels = [], []
    for name in train_files if split == "train" else test_files:
        batch = _unpickle(base / name)
        images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.extend(batch[labels_key])
    return ArrayDataset(np.concatenate(images), np.asarray(labels), names, in_chans=in_chans, transform=transform)


def _unpickle(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"CIFAR file {path} is missing")
    with open(path, "rb") as f:
        return pickle.load(f, encoding="bytes")

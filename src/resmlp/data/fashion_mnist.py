"""Fashion-MNIST from its original IDX files (gzipped or raw), by default from the Debian package."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from resmlp.data.arrays import ArrayDataset

DEFAULT_DIR = Path("/usr/share/datasets/fashion-mnist")
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")
# channel statistics of the 60k training images, scaled to [0, 1]
MEAN, STD = (0.286,), (0.353,)
_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
HOW_TO_GET = (
    "Install the Debian/Ubuntu package (sudo apt-get install -y dataset-fashion-mnist puts the files in "
    f"{DEFAULT_DIR}), or download the four *-ubyte.gz files from "
    "https://github.com/zalandoresearch/fashion-mnist and pass their folder with --data-dir DIR "
    "(data.dir in a recipe)."
)


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (the MNIST container: magic, dims, big-endian payload); .gz is decompressed.

    A dozen lines of numpy; torchvision's reader is private API and wants its own folder layout.
    """
    path = Path(path)
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path} is not an IDX file of unsigned bytes (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path} is truncated: header says {shape}, payload has {data.size} bytes")
    return data.reshape(shape)


def find_idx(data_dir: Path, stem: str) -> Path:
    """The IDX file `stem` in `data_dir`, gzipped or not (the two naming schemes in circulation)."""
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        if (data_dir / name).is_file():
            return data_dir / name
    raise FileNotFoundError(f"Fashion-MNIST file {stem}.gz not found in {data_dir}. {HOW_TO_GET}")


def fashion_mnist(split: str, data_dir: str | Path | None = None, in_chans: int = 1,
                  transform=None) -> ArrayDataset:
    """The 'train' (60k) or 'test' (10k) split as an ArrayDataset of 28x28 grayscale images."""
    data_dir = Path(data_dir) if data_dir else DEFAULT_DIR
    if not data_dir.is_dir():
        raise FileNotFoundError(f"Fashion-MNIST folder {data_dir} does not exist. {HOW_TO_GET}")
    images_name, labels_name = _FILES[split]
    images = read_idx(find_idx(data_dir, images_name))
    labels = read_idx(find_idx(data_dir, labels_name))
    return ArrayDataset(images, labels, CLASS_NAMES, in_chans=in_chans, transform=transform)

"""Fashion-MNIST from its original IDX files (gzipped or raw), by default from the Debian package."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from resmlp.data.arrays import ArrayDataset
from resmlp.data.images import check_image_size
from resmlp.data.records import ArrayRecords
from resmlp.data.sources.walk import is_regular_file
from resmlp.errors import DataError

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


MAX_IDX_BYTES = 1 << 30  # 20x Fashion-MNIST's training images: a bound on a gzip bomb's expansion


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (the MNIST container: magic, dims, big-endian payload); .gz is decompressed.

    A dozen lines of numpy; torchvision's reader is private API and wants its own folder layout. Any damage
    (corrupt gzip, a header of 0 or more than 4 dimensions, a payload of the wrong size) is a DataError
    naming the file.
    """
    path = Path(path)
    raw = _read_bounded(path)
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    if not 1 <= ndim <= 4 or len(raw) < 4 + 4 * ndim:
        raise DataError(f"{path}: IDX header declares {ndim} dimension(s); image and label files have 1 to 4 "
                        "(a damaged or hand-made file)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise DataError(f"{path} is truncated: header says {shape}, payload has {data.size} bytes")
    return data.reshape(shape)


def _read_bounded(path: Path) -> bytes:
    """The file's bytes (decompressed), at most MAX_IDX_BYTES of them whether gzipped or not; regular files only
    (a FIFO would block the read)."""
    if not is_regular_file(path):
        raise DataError(f"{path} is not a regular file (a FIFO, socket or device?)")
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read(MAX_IDX_BYTES + 1)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path} is not a readable gzip file ({e}); re-download it") from None
    if len(raw) > MAX_IDX_BYTES:
        raise DataError(f"{path} holds more than {MAX_IDX_BYTES} bytes; a Fashion-MNIST file is 47 MB")
    return raw


def find_idx(data_dir: Path, stem: str) -> Path:
    """The IDX file `stem` in `data_dir`, gzipped or not (the two naming schemes in circulation)."""
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        if (data_dir / name).is_file():
            return data_dir / name
    if (data_dir / "train").is_dir():  # an ImageNet-style folder given to the default kind
        raise FileNotFoundError(f"{data_dir} holds train/, an image folder, not Fashion-MNIST's IDX files: add "
                                "--set data.kind=folder (resmlp train) or pass it as --data DIR (eval, probes)")
    raise FileNotFoundError(f"Fashion-MNIST file {stem}.gz not found in {data_dir}. {HOW_TO_GET}")


def fashion_mnist(split: str, data_dir: str | Path | None = None, in_chans: int = 1,
                  transform=None) -> ArrayDataset:
    """The 'train' (60k) or 'test' (10k) split as an ArrayDataset of 28x28 grayscale images."""
    records = fashion_mnist_records(split, data_dir)
    return ArrayDataset(records.images, records.labels, CLASS_NAMES, in_chans=in_chans, transform=transform)


def fashion_mnist_records(split: str, data_dir: str | Path | None = None) -> ArrayRecords:
    """The 'train' (60k) or 'test' (10k) split's 28x28 grayscale images, as records (resmlp.data.sources)."""
    data_dir = Path(data_dir) if data_dir else DEFAULT_DIR
    if not data_dir.is_dir():
        raise FileNotFoundError(f"Fashion-MNIST folder {data_dir} does not exist. {HOW_TO_GET}")
    images_name, labels_name = _FILES[split]
    images_path, labels_path = find_idx(data_dir, images_name), find_idx(data_dir, labels_name)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or min(images.shape) == 0:
        raise DataError(f"{images_path}: expected images of shape (N, height, width), got {images.shape}")
    check_image_size(images.shape[2], images.shape[1], f"each image of {images_path}")
    if labels.shape != images.shape[:1] or (labels.size and labels.max() >= len(CLASS_NAMES)):
        raise DataError(f"{labels_path}: expected {len(images)} labels from 0 to {len(CLASS_NAMES) - 1} (one per "
                        f"image of {images_path.name}), got shape {labels.shape}")
    return ArrayRecords(images, labels, CLASS_NAMES)

"""Oxford Flowers-102 (Nilsback & Zisserman 2008) in its released layout: the `flowers102:DIR` source.

DIR holds what the three downloads of https://www.robots.ox.ac.uk/~vgg/data/flowers/102/ extract to:
`jpg/image_00001.jpg` ... `jpg/image_08189.jpg` (102flowers.tgz), `imagelabels.mat` (`labels`: each image's
class, 1 to 102, in image order) and `setid.mat` (`trnid`, `valid`, `tstid`: the 1-based image numbers of the
train, val and test splits, 1,020 / 1,020 / 6,149 images), the same files torchvision's Flowers102 reads.
Classes are named by their label in the files ("1" ... "102"; the release has no class names file), label i
the class at index i - 1. Every number is checked before use: the labels are integers from 1, the split ids
are image numbers that exist, no image twice in a split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from resmlp.data.records import MAX_CLASSES, Source, SourceSpec
from resmlp.data.sources.imagenet import FileRecords, PackedNames
from resmlp.data.sources.matfiles import integer_array, read_mat_variable
from resmlp.data.sources.walk import MAX_WALK_ENTRIES
from resmlp.errors import DataError

SPLIT_IDS = {"train": "trnid", "val": "valid", "test": "tstid"}
LAYOUT = "jpg/image_NNNNN.jpg, imagelabels.mat and setid.mat (Flowers-102 as released)"


def flowers102_source(spec: SourceSpec) -> Source:
    """The three splits of the Flowers-102 folder `spec.arg`; the .mat files are read when a split is first asked
    for."""
    root = Path(spec.arg)
    if not (root / "jpg").is_dir():
        raise FileNotFoundError(f"Flowers-102 folder {root} has no jpg/ folder; expected {root}/{LAYOUT}")
    labels: list[np.ndarray] = []

    def all_labels() -> np.ndarray:
        if not labels:
            raw = read_mat_variable(root / "imagelabels.mat", "labels", MAX_WALK_ENTRIES, "`labels`, one class "
                                    "(1 to 102) per image")
            labels.append(integer_array(raw, 1, MAX_CLASSES, f"{root / 'imagelabels.mat'}: labels"))
        return labels[0]

    def records(split: str) -> FileRecords:
        every = all_labels()
        where = root / "setid.mat"
        ids = integer_array(read_mat_variable(where, SPLIT_IDS[split], len(every), f"`{SPLIT_IDS[split]}`, the "
                                              f"1-based image numbers of the {split} split"),
                            1, len(every), f"{where}: {SPLIT_IDS[split]} (image numbers of imagelabels.mat)")
        if len(np.unique(ids)) != len(ids):
            raise DataError(f"{where}: {SPLIT_IDS[split]} names an image twice; each image is in a split once")
        classes = [str(i) for i in range(1, int(every.max()) + 1)]
        names = PackedNames.pack([f"image_{i:05d}.jpg" for i in ids.tolist()])
        return FileRecords(root / "jpg", names, every[ids - 1] - 1, classes)

    return Source(spec, {split: (lambda s=split: records(s)) for split in SPLIT_IDS}, "imagenet")

"""The per-image path: raw records (resmlp.data.sources) decoded to images, then a transform (timm's).

An unreadable record (a file that is gone, truncated or corrupt; an image over the pixel bound) comes back as
None with a warning, and `resmlp.data.loading.samplers.collate_skipping` drops and counts it. A readable image whose
transform fails is a bug in the transform, not a bad file: it is raised, naming the image.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, IterableDataset

from resmlp.data.arrays import ArrayDataset, _pil_mode
from resmlp.data.images import decode_image
from resmlp.data.loading.samplers import sample_seed
from resmlp.data.records import (
    ArrayRecords,
    MapRecords,
    Payload,
    StreamPlan,
    StreamRecords,
    Unreadable,
    skip_unreadable,
)
from resmlp.errors import DataError


def to_image(payload: Payload, mode: str, max_pixels: int | None, what: str) -> Image.Image:
    """A record's payload as a PIL image of `mode` ('L' or 'RGB'); DataError if it can't be decoded."""
    if isinstance(payload, np.ndarray):
        image = Image.fromarray(payload)
        return image if image.mode == mode else image.convert(mode)
    return decode_image(payload, 1 if mode == "L" else 3, max_pixels, what=what)


def load(records: Any, index: int, mode: str, max_pixels: int | None, transform: Callable | None):
    """(transform(image), label) of map record `index`, or None (warned) when it can't be read."""
    what = records.name(index)
    try:
        payload, label = records[index]
        image = to_image(payload, mode, max_pixels, what)
    except DataError as e:
        return skip_unreadable(what, e)
    return _transformed(image, label, transform, what)


def _transformed(image: Image.Image, label: int, transform: Callable | None, what: str):
    if transform is None:
        return image, label
    try:
        return transform(image), label
    except DataError as e:  # too large once resized (Preprocess's guard): unreadable like a corrupt file
        return skip_unreadable(what, e)
    except Exception as e:
        raise RuntimeError(f"the transform failed on the readable image {what}: {type(e).__name__}: {e}") from e


class DecodedDataset(Dataset):
    """Map records decoded and transformed; item i is (transform(image), label) or None (unreadable)."""

    def __init__(self, records: MapRecords, in_chans: int = 3, transform: Callable | None = None,
                 max_image_pixels: int | None = None) -> None:
        self.records, self.in_chans, self.transform = records, in_chans, transform
        self.mode, self.max_image_pixels = _pil_mode(in_chans), max_image_pixels

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int):
        return load(self.records, index, self.mode, self.max_image_pixels, self.transform)

    @property
    def labels(self) -> np.ndarray:
        return self.records.labels

    @property
    def targets(self) -> list[int]:
        return self.records.labels.tolist()

    @property
    def class_names(self) -> list[str]:
        return self.records.class_names

    @property
    def classes(self) -> list[str]:
        return self.records.class_names

    @property
    def samples(self) -> list[tuple[str, int]]:
        """(file or record name, label) of every record, in order (torchvision ImageFolder's attribute)."""
        return [(self.records.name(i), int(label)) for i, label in enumerate(self.records.labels)]

    def subset(self, indices: np.ndarray, transform: Callable | None = None) -> DecodedDataset:
        return DecodedDataset(self.records.subset(indices), self.in_chans, transform, self.max_image_pixels)


class DecodedStream(IterableDataset):
    """Stream records decoded and transformed, the augmentation seeded by each record's key as SeededDataset
    seeds map records; yields (image, label) or None. `plan` (a StreamPlan) says which pass: the trainer and
    the evaluators set it before each pass."""

    def __init__(self, records: StreamRecords, in_chans: int = 3, transform: Callable | None = None) -> None:
        self.records, self.in_chans, self.transform = records, in_chans, transform
        self.mode, self.plan = _pil_mode(in_chans), StreamPlan(train=False)

    @property
    def class_names(self) -> list[str]:
        return self.records.class_names

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator:
        for key, payload, label in self.records.samples(self.plan):
            what = str(key[3])
            if isinstance(payload, Unreadable):
                yield skip_unreadable(what, payload)
                continue
            seed = sample_seed(key)
            random.seed(seed)
            np.random.seed(seed)
            torch.default_generator.manual_seed(seed)
            try:
                image = to_image(payload, self.mode, None, what)
            except DataError as e:
                yield skip_unreadable(what, e)
                continue
            yield _transformed(image, label, self.transform, what)


def decoded(records: Any, in_chans: int, transform: Callable | None):
    """The per-image dataset of `records`: ArrayDataset for in-memory arrays (the batched paths index its
    arrays), DecodedDataset for encoded files, DecodedStream for streams."""
    if isinstance(records, ArrayRecords):
        return ArrayDataset(records.images, records.labels, records.class_names, in_chans, transform)
    if isinstance(records, StreamRecords):
        return DecodedStream(records, in_chans, transform)
    return DecodedDataset(records, in_chans, transform)

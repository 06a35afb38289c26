"""A small learnable synthetic dataset for tests: a fixed random template per class, plus noise."""

from __future__ import annotations

import numpy as np

from resmlp.data.arrays import ArrayDataset
from resmlp.data.records import ArrayRecords


def synthetic(split: str, num_images: int, num_classes: int, img_size: int, in_chans: int = 1,
              seed: int = 0, transform=None) -> ArrayDataset:
    """`num_images` uint8 images, each 60% its class's template and 40% fresh noise: easy to learn."""
    records = synthetic_records(split, num_images, num_classes, img_size, seed)
    return ArrayDataset(records.images, records.labels, records.class_names, in_chans=in_chans, transform=transform)


def synthetic_records(split: str, num_images: int, num_classes: int, img_size: int, seed: int = 0) -> ArrayRecords:
    """The split's images as records (resmlp.data.sources); see `synthetic`."""
    templates = np.random.default_rng(seed).uniform(0, 255, (num_classes, img_size, img_size))
    rng = np.random.default_rng([seed, {"train": 0, "val": 1, "test": 2}[split]])
    labels = np.arange(num_images) % num_classes
    rng.shuffle(labels)
    noise = rng.uniform(0, 255, (num_images, img_size, img_size))
    images = (0.6 * templates[labels] + 0.4 * noise).astype(np.uint8)
    names = [f"class_{c}" for c in range(num_classes)]
    return ArrayRecords(images, labels, names)

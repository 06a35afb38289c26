"""In-memory image datasets (Fashion-MNIST, CIFAR, synthetic): uint8 arrays turned into PIL images."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from resmlp.runtime import canonical_device


class ArrayDataset(Dataset):
    """uint8 images (N, H, W) or (N, H, W, 3) with integer labels; yields (transform(PIL image), label).

    `in_chans` picks the PIL mode handed to the transform: 1 -> "L", 3 -> "RGB" (grayscale is repeated,
    colour is converted to luminance), so every dataset works with either kind of model.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        class_names: Sequence[str],
        in_chans: int = 3,
        transform: Callable | None = None,
    ) -> None:
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        if len(images) == 0:
            raise ValueError("the dataset has zero images")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.class_names = list(class_names)
        self.mode = _pil_mode(in_chans)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int):
        image = Image.fromarray(self.images[index])
        if image.mode != self.mode:
            image = image.convert(self.mode)
        if self.transform is not None:
            image = self.transform(image)
        return image, int(self.labels[index])

    def subset(self, indices: np.ndarray, transform: Callable | None = None) -> ArrayDataset:
        """The images at `indices` (copied), with `transform`."""
        out = ArrayDataset(self.images[indices], self.labels[indices], self.class_names, transform=transform)
        out.mode = self.mode
        return out

    def on_device(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(images, labels) as tensors on `device`, copied there once and kept: whole-batch augmentation then
        indexes them where the model runs, and no image crosses the bus again."""
        device = canonical_device(device)  # `cuda` and `cuda:0` are one device: one copy
        cached = getattr(self, "_device_copy", None)
        if cached is None or cached[0].device != device:
            cached = (torch.from_numpy(self.images).to(device), torch.from_numpy(self.labels).to(device))
            self._device_copy = cached
        return cached

    @property
    def targets(self) -> list[int]:
        return self.labels.tolist()


def _pil_mode(in_chans: int) -> str:
    if in_chans not in (1, 3):
        raise ValueError(f"image datasets give 1 (grayscale) or 3 (RGB) channels, not in_chans={in_chans}")
    return "L" if in_chans == 1 else "RGB"


def stratified_split(labels: np.ndarray, size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) sorted indices: `size` indices held out with each class in its share, seeded."""
    if not 0 < size < len(labels):
        raise ValueError(f"a validation split of {size} images needs 0 < size < {len(labels)} (the training set)")
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    quota = np.floor(counts / len(labels) * size).astype(int)
    quota[np.argsort(-(counts / len(labels) * size - quota))[: size - quota.sum()]] += 1  # largest remainders
    # each class's indices in ascending order, from one stable sort (not a scan of every label per class: at
    # ImageNet-21k's 21,841 classes and 14 M images that is 3e11 comparisons); the same draws as per-class scans
    members = np.split(np.argsort(labels, kind="stable"), np.cumsum(counts)[:-1])
    held = np.concatenate([rng.permutation(inside)[:q] for inside, q in zip(members, quota, strict=True)])
    mask = np.zeros(len(labels), dtype=bool)
    mask[held] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)

"""ImageNet-layout folders (root/<class>/<image>) where an unreadable image is skipped, not fatal."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import numpy as np
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS

from resmlp.data.images import max_image_pixels as default_max_pixels
from resmlp.data.images import open_image
from resmlp.data.walk import regular_files
from resmlp.errors import DataError


class SkippingImageFolder(ImageFolder):
    """torchvision's ImageFolder whose unreadable images come back as None (dropped by `collate_skipping`).

    Unreadable means corrupt, truncated, of an unknown format, or larger than `max_image_pixels` (a
    decompression bomb): all are skipped and counted alike. A decoded image whose transform fails is not
    unreadable: that error is raised. Empty class folders and empty datasets are
    errors at construction, before any training starts.
    """

    def __init__(self, root: str | Path, in_chans: int = 3, transform=None,
                 max_image_pixels: int | None = None) -> None:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"image folder {root} does not exist (expected {root}/<class>/<image>.jpg)")
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        if not classes:
            raise ValueError(f"{root} has no class sub-folders; expected the layout {root}/<class>/<image>.jpg")
        empty = [c for c in classes if next(regular_files(root / c, _is_image_name), None) is None]
        if empty:
            raise ValueError(f"class folder(s) with no images in {root}: {', '.join(empty[:10])}; remove them "
                             f"or add images (extensions {', '.join(IMG_EXTENSIONS)})")
        super().__init__(str(root), transform=transform)
        self.in_chans = in_chans
        # the bound resolved here, in the process that builds the dataset: a bad $RESMLP_MAX_IMAGE_PIXELS is
        # one ConfigError now, not a traceback from a loader worker at the first image
        self.max_image_pixels = default_max_pixels() if max_image_pixels is None else max_image_pixels
        self.class_names = list(self.classes)

    def make_dataset(self, directory: str, class_to_idx: dict[str, int], extensions=None, is_valid_file=None,
                     allow_empty: bool = False) -> list[tuple[str, int]]:
        """(path, class) of every regular image file, walked by `resmlp.data.walk.regular_files`: torchvision's
        walk follows folder symlinks (two links to `..`: an exponential walk) and takes a FIFO named x.png."""
        return [(str(path), index) for name, index in sorted(class_to_idx.items())
                for path in regular_files(Path(directory) / name, _is_image_name)]

    @property
    def labels(self) -> np.ndarray:
        return np.asarray(self.targets, dtype=np.int64)

    def subset(self, indices: np.ndarray, transform=None) -> SkippingImageFolder:
        """The images at `indices`, with `transform`: a validation split carved from a folder without val/."""
        out = copy.copy(self)
        out.samples = [self.samples[i] for i in indices]
        out.imgs, out.targets = out.samples, [target for _, target in out.samples]
        out.transform = transform
        return out

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        try:
            image = open_image(path, self.in_chans, self.max_image_pixels)
            if self.transform is not None:
                image = self.transform(image)
        except DataError as e:  # a file that does not decode, or too large once resized (Preprocess's guard)
            warnings.warn(f"skipping unreadable image {path}: {e}", stacklevel=1)
            return None
        except Exception as e:
            # an augmentation's failure is a bug in the augmentation, not a corrupt file: it is raised (naming the
            # image) instead of silently dropping a healthy image from training
            raise RuntimeError(f"the transform failed on the readable image {path}: {type(e).__name__}: {e}") from e
        return image, target


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)

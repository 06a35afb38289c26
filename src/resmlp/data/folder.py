"""ImageNet-layout folders (root/<class>/<image>) where an unreadable image is skipped, not fatal."""

from __future__ import annotations

import warnings
from pathlib import Path

from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import IMG_EXTENSIONS


class SkippingImageFolder(ImageFolder):
    """torchvision's ImageFolder whose corrupt images come back as None (dropped by `collate_skipping`).

    Empty class folders and empty datasets are errors at construction, before any training starts.
    """

    def __init__(self, root: str | Path, in_chans: int = 3, transform=None) -> None:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"image folder {root} does not exist (expected {root}/<class>/<image>.jpg)")
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        if not classes:
            raise ValueError(f"{root} has no class sub-folders; expected the layout {root}/<class>/<image>.jpg")
        empty = [c for c in classes if not any(_is_image(p) for p in (root / c).rglob("*"))]
        if empty:
            raise ValueError(f"class folder(s) with no images in {root}: {', '.join(empty[:10])}; remove them "
                             f"or add images (extensions {', '.join(IMG_EXTENSIONS)})")
        super().__init__(str(root), transform=transform)
        self.mode = "L" if in_chans == 1 else "RGB"
        self.class_names = list(self.classes)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        try:
            image = self.loader(path).convert(self.mode)
            if self.transform is not None:
                image = self.transform(image)
        except (OSError, ValueError, SyntaxError) as e:  # what PIL raises for truncated or garbage files
            warnings.warn(f"skipping unreadable image {path}: {e}", stacklevel=1)
            return None
        return image, target


def _is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMG_EXTENSIONS

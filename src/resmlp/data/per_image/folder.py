"""One folder of class folders (root/<class>/<image>) as a dataset whose unreadable images are skipped.

Listed by resmlp.data.sources.imagenet (os.scandir, no stat per file), read as raw records and decoded by
resmlp.data.per_image.decoded; kept as a class for callers that name a class-folder root directly (data.test_dir).
"""

from __future__ import annotations

from pathlib import Path

from resmlp.data.images import max_image_pixels as default_max_pixels
from resmlp.data.per_image.decoded import DecodedDataset
from resmlp.data.sources.imagenet import FileRecords, class_folders, split_records


def class_folder_records(root: str | Path) -> FileRecords:
    """The records of root/<class>/<image>, classes sorted; errors (missing folder, no classes, an empty class)
    before any training starts."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} does not exist (expected {root}/<class>/<image>.jpg)")
    classes = class_folders(root)
    if not classes:
        raise ValueError(f"{root} has no class sub-folders; expected the layout {root}/<class>/<image>.jpg")
    return split_records(root, root.parent, root.name, classes, False)


class SkippingImageFolder(DecodedDataset):
    """torchvision's ImageFolder's listing and order, whose unreadable images come back as None (dropped and
    counted by `collate_skipping`). Unreadable means missing, corrupt, truncated, of an unknown format, not a
    regular file, or larger than `max_image_pixels` (a decompression bomb)."""

    def __init__(self, root: str | Path, in_chans: int = 3, transform=None,
                 max_image_pixels: int | None = None) -> None:
        # the bound resolved here, in the process that builds the dataset: a bad $RESMLP_MAX_IMAGE_PIXELS is
        # one ConfigError now, not a traceback from a loader worker at the first image
        bound = default_max_pixels() if max_image_pixels is None else max_image_pixels
        super().__init__(class_folder_records(root), in_chans, transform, bound)

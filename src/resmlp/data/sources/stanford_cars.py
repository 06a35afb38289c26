"""Stanford Cars (Krause et al. 2013): the `stanford-cars:DIR` source, in the devkit's layout or a folder layout.

The devkit layout (the release, as torchvision's StanfordCars reads it): `devkit/cars_meta.mat` (`class_names`,
196 make-model-year names), `devkit/cars_train_annos.mat` and `cars_test_annos_withlabels.mat` (in DIR or in
devkit/; `annotations`: a struct per image with `fname` and `class`, 1-based, plus the bounding box, unused),
the images in `cars_train/` and `cars_test/` (or `cars_train/cars_train/`, as Kaggle's copy nests them). Splits:
train (8,144 images) and test (8,041); a run carves its validation images from train (data.val_size).

The folder layouts common on the Hub (Kaggle's "stanford-car-dataset-by-classes-folder": `train/<class name>/`,
`test/<class name>/`, under `car_data/car_data/` or not) are image folders: DIR with train/ and test/ class
folders is read as `folder:DIR` is (resmlp.data.sources.imagenet). The Hub's parquet copies are `hf:DIR`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from resmlp.data.records import MAX_CLASSES, Source, SourceSpec, check_class_names
from resmlp.data.sources.imagenet import FileRecords, PackedNames, folder_source, split_folders
from resmlp.data.sources.matfiles import integer_array, read_mat_variable
from resmlp.data.sources.walk import MAX_WALK_ENTRIES
from resmlp.errors import DataError

ANNOTATIONS = {"train": "cars_train_annos.mat", "test": "cars_test_annos_withlabels.mat"}
IMAGES = {"train": "cars_train", "test": "cars_test"}
LAYOUT = ("devkit/cars_meta.mat, devkit/cars_train_annos.mat, cars_test_annos_withlabels.mat, cars_train/ and "
          "cars_test/ (the devkit layout), or train/<class>/ and test/<class>/ folders")
MAX_NAME_CHARS = 255


def stanford_cars_source(spec: SourceSpec, index_cache: str | Path | None = None) -> Source:
    """Stanford Cars in `spec.arg` (see the module doc)."""
    root = Path(spec.arg)
    if not root.is_dir():
        raise FileNotFoundError(f"Stanford Cars folder {root} does not exist; expected {LAYOUT}")
    for folder in (root, root / "car_data", root / "car_data" / "car_data"):
        if folder.is_dir() and not (root / "devkit").is_dir() and split_folders(folder):
            return folder_source(SourceSpec("folder", str(folder)), index_cache=index_cache)
    if not (root / "devkit").is_dir():
        raise FileNotFoundError(f"{root} has neither devkit/ nor train/ and test/ class folders; expected {LAYOUT}")
    classes: list[str] = []

    def class_names() -> list[str]:
        if not classes:
            raw = read_mat_variable(root / "devkit" / "cars_meta.mat", "class_names", MAX_CLASSES,
                                    "`class_names`, the 196 car models")
            if raw.dtype.kind not in "UO" or not all(isinstance(n, str) for n in raw.tolist()):
                raise DataError(f"{root / 'devkit' / 'cars_meta.mat'}: class_names must be strings")
            classes.extend(check_class_names([str(n) for n in raw.tolist()], str(root / "devkit" / "cars_meta.mat")))
        return classes

    def records(split: str) -> FileRecords:
        names = class_names()
        annos = next((f for f in (root / ANNOTATIONS[split], root / "devkit" / ANNOTATIONS[split]) if f.is_file()),
                     root / "devkit" / ANNOTATIONS[split])
        table = read_mat_variable(annos, "annotations", MAX_WALK_ENTRIES, "`annotations`, one struct (fname, class) "
                                  "per image")
        fields = table.dtype.names or ()
        if "fname" not in fields or "class" not in fields:
            raise DataError(f"{annos}: annotations have fields {', '.join(fields) or 'none'}; expected fname and class"
                            + (" (the test split needs cars_test_annos_withlabels.mat, with labels)"
                               if split == "test" else ""))
        files = [_plain_name(f, annos) for f in table["fname"].tolist()]
        labels = integer_array(np.asarray(table["class"].tolist()), 1, len(names), f"{annos}: class")
        folder = root / IMAGES[split]
        if (folder / IMAGES[split]).is_dir():  # Kaggle's copy: cars_train/cars_train/*.jpg
            folder = folder / IMAGES[split]
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is missing; expected the {split} images named in {annos}")
        return FileRecords(folder, PackedNames.pack(files), labels - 1, names)

    return Source(spec, {split: (lambda s=split: records(s)) for split in ANNOTATIONS}, "imagenet")


def _plain_name(name: object, where: Path) -> str:
    """An annotation's image name: a plain file name (no folder, no `..`), else one DataError line."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (".", "..") \
            or len(name) > MAX_NAME_CHARS:
        raise DataError(f"{where}: fname {str(name)[:80]!r} is not an image file name (expected e.g. 00001.jpg)")
    return name

"""iNaturalist 2018 and 2019 (Van Horn et al. 2018) in their released layout: the `inat2018:DIR` and
`inat2019:DIR` sources, labelled as DeiT's INatDataset labels them (DeiT's `--data-set INAT` / `INAT19`).

DIR holds the COCO-style annotation files `train2018.json` and `val2018.json` (`train2019.json`,
`val2019.json`): `images` (`id`, `file_name`), `annotations` (`image_id`, `category_id`), `categories`; and the
images, `train_val2018/<supercategory>/<category id>/<image>.jpg` as the file names say (DeiT reads them from
`train_val2018/<category id>/<image>.jpg`, the supercategory folder left out: either layout is found). The
2018 release's `categories.json` (the full taxonomy, one entry per category id), when in DIR, names the
categories, as in DeiT; else the annotation file's own `categories` do.

Classes are at the level DeiT uses by default (`--inat-category name`, the species: 8,142 classes in 2018,
1,010 in 2019), numbered as DeiT numbers them: in the order each first appears in the training file's
annotations. The splits are train and val (the test files have no labels). Every number read is checked
before use: the files' sizes, the counts, each image's one annotation, category ids that exist, names that
stay inside DIR.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.data.records import MAX_CLASSES, Source, SourceSpec, check_class_names
from resmlp.data.sources.imagenet import FileRecords, PackedNames
from resmlp.data.sources.walk import MAX_WALK_ENTRIES
from resmlp.errors import DataError

MAX_JSON_BYTES = 1 << 30  # train2018.json is under 200 MB
CATEGORY_LEVEL = "name"  # DeiT main.py's --inat-category default
MAX_NAME_CHARS = 4096


def inaturalist_source(spec: SourceSpec, year: int) -> Source:
    """iNaturalist `year` in `spec.arg` (see the module doc): train and val, read when first asked for."""
    root = Path(spec.arg)
    if not (root / f"train{year}.json").is_file():
        raise FileNotFoundError(f"iNaturalist {year} folder {root} has no train{year}.json; expected "
                                f"{root}/train{year}.json, {root}/val{year}.json and {root}/train_val{year}/")
    state: dict[str, Any] = {}

    def classes() -> tuple[dict[int, str], dict[str, int]]:
        if not state:
            train = _read_json(root / f"train{year}.json")
            names = _category_names(root, train, root / f"train{year}.json")
            _, category_ids = _labelled_images(train, root / f"train{year}.json", names)
            order: dict[str, int] = {}
            for category in category_ids:  # DeiT's numbering: by first appearance in the training annotations
                order.setdefault(names[category], len(order))
            check_class_names(list(order), str(root / f"train{year}.json"))
            state.update(names=names, order=order, train=train)
        return state["names"], state["order"]

    def records(split: str) -> FileRecords:
        names, order = classes()
        path = root / f"{split}{year}.json"
        data = state.pop("train") if split == "train" else _read_json(path)
        files, category_ids = _labelled_images(data, path, names)
        unknown = [c for c in dict.fromkeys(category_ids) if names[c] not in order]
        if unknown:
            raise DataError(f"{path}: category {unknown[0]} ({names[unknown[0]][:60]!r}) has no training image in "
                            f"train{year}.json; its classes are the training file's")
        files = _image_layout(root, files, path)
        labels = np.asarray([order[names[c]] for c in category_ids], dtype=np.int64)
        return FileRecords(root, PackedNames.pack(files), labels, list(order))

    return Source(spec, {split: (lambda s=split: records(s)) for split in ("train", "val")}, "imagenet")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing (the iNaturalist annotation file of that split)")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DataError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MB; an iNaturalist annotation file is smaller")
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path} is not JSON ({str(e)[:80]}); expected iNaturalist's COCO-style annotations") from None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations")):
        raise DataError(f"{path} is not an iNaturalist annotation file: expected an object with lists `images` and "
                        "`annotations`")
    if len(data["images"]) > MAX_WALK_ENTRIES or len(data["annotations"]) > MAX_WALK_ENTRIES:
        raise DataError(f"{path} lists more than {MAX_WALK_ENTRIES:,} images; it is not one dataset's annotations")
    return data


def _category_names(root: Path, train: dict[str, Any], where: Path) -> dict[int, str]:
    """{category id: its name at CATEGORY_LEVEL}, from categories.json in `root` (DeiT's source) or the training
    file's `categories`."""
    source = root / "categories.json"
    entries: Any = _read_json_list(source) if source.is_file() else train.get("categories")
    what = source if source.is_file() else where
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_CLASSES:
        raise DataError(f"{what}: expected a list of 1 to {MAX_CLASSES:,} categories")
    names: dict[int, str] = {}
    for position, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise DataError(f"{what}: category {position} is not an object")
        ident = entry.get("id", position)  # DeiT indexes categories.json by position: the id
        name = entry.get(CATEGORY_LEVEL)
        if type(ident) is not int or not isinstance(name, str) or not name or len(name) > MAX_NAME_CHARS:
            raise DataError(f"{what}: category {position} needs an integer id and a non-empty {CATEGORY_LEVEL!r}")
        names[ident] = name
    return names


def _read_json_list(path: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise DataError(f"{path} is larger than {MAX_JSON_BYTES >> 20} MB")
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise DataError(f"{path} is not JSON ({str(e)[:80]})") from None


def _labelled_images(data: dict[str, Any], path: Path, names: dict[int, str]) -> tuple[list[str], list[int]]:
    """(file names, category ids) of the file's images in its order, each image with exactly one annotation of a
    known category."""
    category_of: dict[int, int] = {}
    for position, note in enumerate(data["annotations"]):
        image, category = (note.get("image_id"), note.get("category_id")) if isinstance(note, dict) else (None, None)
        if type(image) is not int or type(category) is not int:
            raise DataError(f"{path}: annotation {position} needs integer image_id and category_id")
        if category not in names:
            raise DataError(f"{path}: annotation {position} names category {category}, which the categories lack")
        if category_of.setdefault(image, category) != category:
            raise DataError(f"{path}: image {image} has two annotations with different categories")
    files, categories = [], []
    for position, image in enumerate(data["images"]):
        ident, name = (image.get("id"), image.get("file_name")) if isinstance(image, dict) else (None, None)
        if type(ident) is not int or not isinstance(name, str):
            raise DataError(f"{path}: image {position} needs an integer id and a file_name")
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or "\\" in name or not name or len(name) > MAX_NAME_CHARS:
            raise DataError(f"{path}: image file_name {name[:80]!r} is not a relative path inside the dataset folder")
        if ident not in category_of:
            raise DataError(f"{path}: image {ident} ({name[:80]}) has no annotation; each image needs its category")
        files.append(name)
        categories.append(category_of[ident])
    if not files:
        raise DataError(f"{path} lists no images")
    return files, categories


def _image_layout(root: Path, files: list[str], where: Path) -> list[str]:
    """The files as named (`train_val2018/Plantae/7477/x.jpg`), or in DeiT's layout without the supercategory
    (`train_val2018/7477/x.jpg`): decided by the first image, the one the folder has."""
    first = files[0]
    if (root / first).is_file():
        return files
    parts = first.split("/")
    if len(parts) == 4 and (root / parts[0] / parts[2] / parts[3]).is_file():
        return [f"{p[0]}/{p[2]}/{p[3]}" if len(p) == 4 else name for name in files for p in [name.split("/")]]
    raise FileNotFoundError(f"{root / first} is missing (nor in DeiT's layout without the supercategory folder); "
                            f"expected the images {where.name} names, under {root}")

"""ImageNet-V2 (Recht et al. 2019) in its released layout: the `imagenetv2:DIR` source, an evaluation set.

The three released test sets (imagenetv2-matched-frequency.tar.gz, imagenetv2-threshold0.7.tar.gz,
imagenetv2-top-images.tar.gz) extract to `imagenetv2-matched-frequency-format-val/`,
`imagenetv2-threshold0.7-format-val/` and `imagenetv2-top-images-format-val/`: one folder per class named by
the class's ImageNet-1k index (`0` ... `999`), 10 `.jpeg` images each. DIR is one of those folders, or a folder
holding exactly one of them.

The folder name is the label: class i is the i-th ImageNet-1k class in the 1k order (the sorted WordNet ids,
n01440764 first: timm's ImageNetInfo('imagenet-1k'), the order of ILSVRC2012's sorted class folders), so the
source's class names are those 1,000 synsets and a model trained on ImageNet-1k (its classes in that order, or
a published 1,000-class head) is scored as on ImageNet-val. A model whose classes are not ImageNet-1k's is
refused in one line (check_imagenet1k_model). The source has one split, `test`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from resmlp.data.records import Source, SourceSpec
from resmlp.data.sources.imagenet import FileRecords, PackedNames, is_image_name
from resmlp.data.sources.walk import list_files
from resmlp.errors import DataError

IMAGENET_CLASSES = 1000
# the released folders (imagenetv2-*.tar.gz extracted), and the names the lead and papers use for them
VARIANTS = ("imagenetv2-matched-frequency-format-val", "imagenetv2-threshold0.7-format-val",
            "imagenetv2-top-images-format-val")
MAX_IMAGES = 1_000_000  # the released sets have 10,000 images each


def imagenet1k_synsets() -> list[str]:
    """The 1,000 ImageNet-1k WordNet ids in the 1k order (timm's metadata, sorted as ILSVRC2012's class folders)."""
    from timm.data import ImageNetInfo

    return list(ImageNetInfo("imagenet-1k").label_names())


def imagenet_v2_source(spec: SourceSpec) -> Source:
    """The ImageNet-V2 folder `spec.arg` (see the module doc): one `test` split, listed when first read."""
    folder = find_variant(Path(spec.arg))
    return Source(spec, {"test": lambda: imagenet_v2_records(folder)}, "imagenet")


def find_variant(root: Path) -> Path:
    """`root` itself when it holds the class folders, else the one released folder inside it."""
    if not root.is_dir():
        raise FileNotFoundError(f"ImageNet-V2 folder {root} does not exist (expected {root}/<0..999>/<image>.jpeg, "
                                f"e.g. {VARIANTS[0]}/)")
    inside = [name for name in VARIANTS if (root / name).is_dir()]
    if len(inside) > 1:
        raise DataError(f"{root} holds {len(inside)} ImageNet-V2 sets ({', '.join(inside)}); name one, e.g. "
                        f"imagenetv2:{root / inside[0]}")
    return root / inside[0] if inside else root


def imagenet_v2_records(folder: Path) -> FileRecords:
    """The images of a V2 folder labelled by their class folder's index; one DataError line for a folder name
    that is not an index below 1,000, or a folder without class folders."""
    with os.scandir(folder) as entries:
        classes = sorted(e.name for e in entries if e.is_dir())
    if not classes:
        raise DataError(f"{folder} has no class folders; expected ImageNet-V2's layout {folder}/<0..999>/<image>.jpeg "
                        f"(one of {', '.join(VARIANTS)})")
    bad = [name for name in classes if not (name.isascii() and name.isdigit() and len(name) <= 4
                                            and int(name) < IMAGENET_CLASSES and str(int(name)) == name)]
    if bad:
        raise DataError(f"{folder}/{bad[0][:80]}/ is not an ImageNet-V2 class folder: expected folders named by "
                        f"the ImageNet-1k class index, 0 to {IMAGENET_CLASSES - 1}")
    names: list[str] = []
    labels: list[int] = []
    for name in sorted(classes, key=int):
        files = list_files(folder / name, is_image_name, max_entries=MAX_IMAGES)
        names.extend(f"{name}/{f}" for f in files)
        labels.extend([int(name)] * len(files))
        if len(names) > MAX_IMAGES:
            raise DataError(f"{folder} holds more than {MAX_IMAGES:,} images; ImageNet-V2 has 10,000")
    if not names:
        raise DataError(f"{folder}: its class folders hold no images (.jpeg); the download is incomplete")
    return FileRecords(folder, PackedNames.pack(names), np.asarray(labels, dtype=np.int64), imagenet1k_synsets())


def imagenet1k_descriptions() -> list[str]:
    """The 1,000 classes' WordNet lemmas in the 1k order ("tench, Tinca tinca"...): the label names of the Hugging
    Face Hub's imagenet-1k, which a model trained on `hf:` records as its class names."""
    from timm.data import ImageNetInfo

    return list(ImageNetInfo("imagenet-1k").label_descriptions())


def check_imagenet1k_model(num_classes: int, class_names: Sequence[str] | None, checkpoint: object) -> None:
    """One line refusing a model whose classes are not ImageNet-1k's in the 1k order (V2's labels are those
    indices): a head of another size, or class names other than the 1,000 synsets (or their lemmas, as the Hub's
    imagenet-1k names them) in that order. A model that records no class names (published weights) is taken
    at its 1,000-class head."""
    if num_classes != IMAGENET_CLASSES:
        raise DataError(f"ImageNet-V2's labels are ImageNet-1k class indices, but {checkpoint} predicts {num_classes} "
                        "classes; evaluate a model trained on ImageNet-1k")
    names = list(class_names or [])
    if names and names != imagenet1k_synsets() and names != imagenet1k_descriptions():
        differ = next(i for i, (a, b) in enumerate(zip(names, imagenet1k_synsets(), strict=True)) if a != b)
        raise DataError(f"ImageNet-V2's labels are ImageNet-1k class indices, but {checkpoint}'s class {differ} is "
                        f"{str(names[differ])[:60]!r}, not {imagenet1k_synsets()[differ]} (the 1k order: "
                        "sorted WordNet ids); its classes are not ImageNet-1k's")

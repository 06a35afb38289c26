"""The data-source layer (resmlp.data.sources): the grammar, one split decision, and ImageNet's folder layouts
(split synonyms, .JPEG names, the raw val folder with its ground truth, a class map, symlinked class folders,
CMYK and grayscale among RGB), listed without a stat per file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from resmlp.data import build_dataset, collate_skipping, heldout_split
from resmlp.data.records import SourceSpec
from resmlp.data.sources import open_source, parse_source, spec_from_config
from resmlp.data.sources.imagenet import PackedNames
from resmlp.data.sources.walk import list_files
from resmlp.data.splits import decide_splits
from resmlp.errors import ConfigError, DataError


def _image(path: Path, value: int = 100, mode: str = "RGB", fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.full((6, 5, 3), value, np.uint8)
    Image.fromarray(pixels).convert(mode).save(path, format=fmt or ("JPEG" if path.suffix.lower() in (".jpg", ".jpeg")
                                                                     else None))


def _folder(root: Path, splits: dict[str, int], classes=("n01", "n02")) -> Path:
    for split, per_class in splits.items():
        for label, cls in enumerate(classes):
            for i in range(per_class):
                _image(root / split / cls / f"{cls}_{i}.JPEG", 40 + 150 * label)
    return root


def test_the_grammar_names_every_source_and_refuses_the_rest(tmp_path):
    assert parse_source("folder:/data/x") == SourceSpec("folder", "/data/x")
    assert parse_source("wds:/s/{split}-{0..3}.tar") == SourceSpec("wds", "/s/{split}-{0..3}.tar")
    assert parse_source("fashion-mnist") == SourceSpec("fashion-mnist")
    assert parse_source(str(tmp_path)) == SourceSpec("folder", str(tmp_path))  # --data DIR, as before
    assert spec_from_config(None, "cifar10", "/c") == SourceSpec("cifar10", "/c")  # data.kind + data.dir
    assert spec_from_config("hf:/h", "fashion-mnist", None) == SourceSpec("hf", "/h")
    with pytest.raises(ConfigError, match="folder needs its location, e.g. folder:"):
        parse_source("folder")
    with pytest.raises(ConfigError, match="not one of .*nor an existing folder"):
        parse_source("imagenet")


def test_a_validation_folder_is_the_val_split_not_ignored(tmp_path):
    """timm's synonyms: validation/ used to be ignored and 5,000 training images carved instead."""
    _folder(tmp_path / "d", {"training": 3, "validation": 2})
    splits = decide_splits(open_source(f"folder:{tmp_path / 'd'}"), val_size=2, val_seed=0)
    assert len(splits.train) == 6 and len(splits.val) == 4 and splits.validation == "the dataset's val split"
    _folder(tmp_path / "d", {"val": 1})
    with pytest.raises(DataError, match="val/ and validation/: both name the val split"):
        open_source(f"folder:{tmp_path / 'd'}")


def test_the_raw_val_folder_is_labelled_by_its_ground_truth(tmp_path):
    root = _folder(tmp_path, {"train": 2})
    for i in range(4):
        _image(root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG", 40 if i % 2 == 0 else 190)
    (root / "LOC_val_solution.csv").write_text(
        "ImageId,PredictionString\n" + "".join(f"ILSVRC2012_val_{i:08d},{'n01' if i % 2 == 0 else 'n02'} 1 2 3 4\n"
                                               for i in range(4)))
    val = open_source(f"folder:{root}").records("val")
    assert val.labels.tolist() == [0, 1, 0, 1] and val.class_names == ["n01", "n02"]
    (root / "LOC_val_solution.csv").unlink()
    (root / "val.txt").write_text("".join(f"ILSVRC2012_val_{i:08d}.JPEG {i % 2}\n" for i in range(3)))
    with pytest.raises(DataError, match=r"no label for 1 image\(s\).*ILSVRC2012_val_00000003"):
        open_source(f"folder:{root}").records("val")
    (root / "val.txt").write_text("".join(f"ILSVRC2012_val_{i:08d}.JPEG {i % 2 + 5}\n" for i in range(4)))
    with pytest.raises(DataError, match="label '5' .*neither one of the 2 classes"):
        open_source(f"folder:{root}").records("val")
    (root / "val.txt").unlink()
    with pytest.raises(DataError, match="holds 4 images but no class folders and no ground-truth file"):
        open_source(f"folder:{root}").records("val")  # a flat folder is still refused, never scored as one class


def test_a_class_map_fixes_the_indices_and_a_disagreeing_one_is_refused(tmp_path):
    root = _folder(tmp_path / "d", {"train": 1, "val": 1})
    (tmp_path / "map.txt").write_text("n02\nn00\nn01\n")
    source = open_source(f"folder:{root}", class_map=str(tmp_path / "map.txt"))
    train = source.records("train")
    assert train.class_names == ["n02", "n00", "n01"] and train.labels.tolist() == [2, 0]
    (tmp_path / "map.txt").write_text("n02\nn03\n")
    with pytest.raises(DataError, match="class folder\\(s\\) n01 that the class map lacks"):
        open_source(f"folder:{root}", class_map=str(tmp_path / "map.txt")).records("train")


def test_symlinked_class_folders_are_followed_at_the_top_only(tmp_path):
    root = _folder(tmp_path / "d", {"train": 1})
    _image(tmp_path / "elsewhere" / "n03" / "a.JPEG")
    os.symlink(tmp_path / "elsewhere" / "n03", root / "train" / "n03")
    os.symlink("..", root / "train" / "n01" / "loop")  # below the top: not followed, no loop
    train = open_source(f"folder:{root}").records("train")
    assert train.class_names == ["n01", "n02", "n03"] and len(train) == 3


def test_listing_makes_no_stat_per_file(tmp_path, monkeypatch):
    """1.28 M os.stat calls were minutes on network storage: the listing reads folder entries only."""
    for i in range(50):
        _image(tmp_path / "c" / f"{i}.JPEG")
    calls = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append(a) or real_stat(*a, **k))
    names = list_files(tmp_path / "c", lambda n: n.endswith(".JPEG"))
    assert len(names) == 50 and calls == []


def test_mixed_modes_decode_and_unreadable_files_are_skipped_when_read(tmp_path):
    root = tmp_path / "d"
    _image(root / "train" / "a" / "rgb.JPEG")
    _image(root / "train" / "a" / "cmyk.jpg", mode="CMYK")
    _image(root / "train" / "a" / "grey.png", mode="L")
    _image(root / "train" / "b" / "x.JPEG")
    (root / "train" / "b" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    dataset = build_dataset(f"folder:{root}", "train", None, 3, transform=lambda im: np.asarray(im).copy())
    with pytest.warns(UserWarning, match="skipping unreadable image .*broken.jpg"):
        images, labels, skipped = collate_skipping([dataset[i] for i in range(len(dataset))])
    assert skipped == 1 and images.shape == (4, 6, 5, 3) and sorted(labels.tolist()) == [0, 0, 0, 1]


def test_one_place_decides_the_splits(tmp_path):
    root = _folder(tmp_path / "d", {"train": 5, "test": 1})
    source = open_source(f"folder:{root}")
    carved = decide_splits(source, val_size=4, val_seed=0)
    assert len(carved.train) == 6 and len(carved.val) == 4 and len(carved.test) == 2
    assert set(carved.val.names[i] for i in range(4)).isdisjoint(carved.train.names[i] for i in range(6))
    assert heldout_split(source.spec) == "test"
    on_test = decide_splits(source, val_size=0, val_seed=0)
    assert on_test.val is on_test.test and "model selection sees the test set" in on_test.validation


def test_packed_names_round_trip_any_file_name():
    names = ["n01/a.JPEG", "n02/é.jpg", "x/" + b"\xff".decode("utf-8", "surrogateescape") + ".png", ""]
    packed = PackedNames.pack(names)
    assert [packed[i] for i in range(len(packed))] == names
    assert packed.buffer.dtype == np.uint8 and packed.offsets.dtype == np.int64
    assert [packed.subset(np.array([2, 0]))[i] for i in range(2)] == [names[2], names[0]]


def test_the_index_cache_beside_the_run_skips_the_listing_until_a_folder_changes(tmp_path, monkeypatch):
    import resmlp.data.sources.imagenet as imagenet

    root = _folder(tmp_path / "d", {"train": 3})
    first = open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")
    assert list((tmp_path / "run" / "data_index").glob("train-*.npz"))
    real = imagenet.list_files
    monkeypatch.setattr(imagenet, "list_files", lambda *a, **k: pytest.fail("listed again"))
    cached = open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")
    assert [cached.names[i] for i in range(6)] == [first.names[i] for i in range(6)]
    assert cached.labels.tolist() == first.labels.tolist()
    monkeypatch.setattr(imagenet, "list_files", real)
    os.utime(root / "train" / "n02", ns=(0, 0))  # an old time first: the addition below changes it on any clock
    _image(root / "train" / "n02" / "new.JPEG")
    assert len(open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")) == 7

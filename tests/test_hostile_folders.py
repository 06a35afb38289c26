"""Hostile folders, tars and ImageNet ground truth (issue 48 items 9-12, issue 50 item 1): each input is refused
in one line naming the file, quickly and before anything large is allocated."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from resmlp.data.records import MAX_CLASSES, check_class_names
from resmlp.data.sources import open_source
from resmlp.data.sources.imagenet import PackedNames
from resmlp.data.sources.index_cache import safe_names
from resmlp.errors import DataError, OutputError


def test_check_class_names_bounds_count_and_rejects_duplicates_in_linear_time():
    assert check_class_names(("a", "b"), "map.txt") == ["a", "b"]
    with pytest.raises(DataError, match=r"map\.txt: .*more than the 100,000"):
        check_class_names(["c"] * (MAX_CLASSES + 1), "map.txt")
    with pytest.raises(DataError, match=r"map\.txt: class name 'x' appears more than once"):
        check_class_names(["x", "y", "x"], "map.txt")
    with pytest.raises(DataError, match=r"map\.txt: class 1 is ''"):
        check_class_names(["x", ""], "map.txt")
    distinct = [f"n{i:08d}" for i in range(MAX_CLASSES)]  # a quadratic duplicate check would take minutes here
    started = time.perf_counter()
    assert len(check_class_names(distinct, "map.txt")) == MAX_CLASSES
    assert time.perf_counter() - started < 5


def _image(path: Path, value: int = 100) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 5, 3), value, np.uint8)).save(path, format="JPEG")


def _raw_val(root: Path, truth_name: str, truth: str | bytes, classes=("n01", "n02")) -> Path:
    """train/<class>/ and the raw flat val/ with the ground-truth file `truth_name` at the top."""
    for cls in classes:
        _image(root / "train" / cls / f"{cls}_0.JPEG")
    for i in range(2):
        _image(root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG")
    (root / truth_name).write_bytes(truth if isinstance(truth, bytes) else truth.encode())
    return root


def _val(root: Path):
    return open_source(f"folder:{root}").records("val")


def test_a_class_map_is_bounded_and_named_and_its_duplicates_found(tmp_path):
    _raw_val(tmp_path / "d", "val.txt", "ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG 1\n")
    twice = tmp_path / "twice.txt"
    twice.write_text("n01\nn02\nn01\n")
    with pytest.raises(DataError, match=r"class map .*twice\.txt: class name 'n01' appears more than once"):
        open_source(f"folder:{tmp_path / 'd'}", class_map=twice).records("train")
    newlines = tmp_path / "newlines.txt"
    newlines.write_bytes(b"\n" * (MAX_CLASSES + 2_000))
    with pytest.raises(DataError, match=r"newlines\.txt has more than 100,000 lines"):
        open_source(f"folder:{tmp_path / 'd'}", class_map=newlines).records("train")
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffn01\nn02\n".encode())
    assert open_source(f"folder:{tmp_path / 'd'}", class_map=bom).records("train").class_names == ["n01", "n02"]


def test_too_many_class_folders_are_refused_while_listing(tmp_path, monkeypatch):
    import resmlp.data.sources.imagenet as imagenet

    monkeypatch.setattr(imagenet, "MAX_CLASSES", 3)
    for i in range(5):
        (tmp_path / "d" / "train" / f"c{i}").mkdir(parents=True)
    with pytest.raises(DataError, match=r"train has more than 3 class folders"):
        open_source(f"folder:{tmp_path / 'd'}").records("train")


@pytest.mark.parametrize("truth_name, truth, message", [
    ("val.txt", "ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG \u00b2\n",
     r"val\.txt, line 2: label '\u00b2' of ILSVRC2012_val_00000001\.JPEG is neither"),
    ("val.txt", "ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG 1\nILSVRC2012_val_00000000.JPEG 1\n",
     r"val\.txt, line 3: ILSVRC2012_val_00000000\.JPEG is labelled n02 here but n01 on an earlier line"),
    ("LOC_val_solution.csv", "ImageId,PredictionString\nILSVRC2012_val_00000000,n01 1 2 3 4\n"
     "ILSVRC2012_val_00000001,n02 1 2 3 4\nILSVRC2012_val_00000001,n01 1 2 3 4\n",
     r"LOC_val_solution\.csv, line 4: ILSVRC2012_val_00000001 is labelled n01 here but n02"),
    ("val.txt", "ILSVRC2012_val_00000000.JPEG 0\nlonely\n", r"val\.txt, line 2: 'lonely' is not `name label`"),
])
def test_bad_ground_truth_names_its_file_and_line(tmp_path, truth_name, truth, message):
    with pytest.raises(DataError, match=message):
        _val(_raw_val(tmp_path, truth_name, truth))


def test_ground_truth_with_a_bom_or_one_image_listed_twice_alike_is_read(tmp_path):
    truth = "\ufeffILSVRC2012_val_00000000.JPEG 1\nILSVRC2012_val_00000001.JPEG 0\nILSVRC2012_val_00000001.JPEG 0\n"
    assert _val(_raw_val(tmp_path, "val.txt", truth)).labels.tolist() == [1, 0]


def test_millions_of_blank_lines_are_refused_before_they_are_split(tmp_path):
    blank = b"ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG 1\n" + b"\n" * 10_000_001
    root = _raw_val(tmp_path, "val.txt", blank)
    started = time.perf_counter()  # splitting 10 M lines first takes seconds and a gigabyte
    with pytest.raises(DataError, match=r"val\.txt has 10,000,003 lines, more than the 10,000,000"):
        _val(root)
    assert time.perf_counter() - started < 2


def test_a_symlinked_index_cache_folder_is_refused(tmp_path):
    root = _raw_val(tmp_path / "d", "val.txt", "ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG 1\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run" / "data_index").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OutputError, match=r"data_index is a symlink to .*elsewhere"):
        open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")
    assert not list((tmp_path / "elsewhere").iterdir())


@pytest.mark.parametrize("tamper", ["parent", "absolute", "label"])
def test_a_tampered_index_cache_is_ignored_and_the_folder_listed_again(tmp_path, tamper):
    root = _raw_val(tmp_path / "d", "val.txt", "ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG 1\n")
    listed = open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")
    (cache,) = (tmp_path / "run" / "data_index").glob("train-*.npz")
    with np.load(cache) as saved:
        arrays = {name: saved[name] for name in saved.files}
    planted = {"parent": ["n01/../../../secret", "n02/n02_0.JPEG"], "absolute": ["/etc/passwd", "n02/n02_0.JPEG"],
               "label": ["n01/n01_0.JPEG", "n02/n02_0.JPEG"]}[tamper]
    packed = PackedNames.pack(planted)
    arrays.update(buffer=packed.buffer, offsets=packed.offsets)
    if tamper == "label":
        arrays["labels"] = np.array([0, 7], np.int64)
    np.savez(cache, **arrays)
    again = open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")
    assert [again.names[i] for i in range(2)] == [listed.names[i] for i in range(2)] == ["n01/n01_0.JPEG",
                                                                                          "n02/n02_0.JPEG"]
    assert again.labels.tolist() == [0, 1]


def test_safe_names_finds_a_parent_component_across_packed_neighbours():
    for names, safe in ((["x.", "../y"], False), (["a..b.JPEG", "c/d..JPEG"], True), (["a", ".."], False),
                        (["a/.", "b"], True), (["..."], True)):
        packed = PackedNames.pack(names)
        assert safe_names(packed.buffer, packed.offsets) is safe, names


def test_a_run_folder_that_cannot_hold_the_cache_lists_without_one(tmp_path, monkeypatch):
    import resmlp.data.sources.index_cache as index_cache

    def read_only(folder):
        raise PermissionError(13, "Permission denied", str(folder))

    monkeypatch.setattr(index_cache, "guarded_subfolder", read_only)
    root = _raw_val(tmp_path / "d", "val.txt", "ILSVRC2012_val_00000000.JPEG 0\nILSVRC2012_val_00000001.JPEG 1\n")
    assert len(open_source(f"folder:{root}", index_cache=tmp_path / "run").records("train")) == 2

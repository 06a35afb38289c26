"""Hostile folders, tars and ImageNet ground truth (issue 48 items 9-12, issue 50 item 1): each input is refused
in one line naming the file, quickly and before anything large is allocated."""

from __future__ import annotations

import time

import pytest

from resmlp.data.records import MAX_CLASSES, check_class_names
from resmlp.errors import DataError


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

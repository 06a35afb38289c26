"""Hugging Face datasets from local files (hf:): saved with save_to_disk or as parquet, map-style and streamed,
and the hostile ones (wrong columns, labels out of range) refused in one line."""

from __future__ import annotations

import io
import sys

import datasets  # the data extra: CI installs it, so these tests never skip
import numpy as np
import pytest
from PIL import Image

from resmlp.data.records import StreamPlan
from resmlp.data.sources import open_source
from resmlp.errors import ConfigError, DataError


def _rows(n: int) -> dict:
    images = [Image.fromarray(np.full((6, 5, 3), 40 * i, np.uint8)) for i in range(n)]
    return {"image": images, "label": [i % 3 for i in range(n)]}


def _features(names=("cat", "dog", "eel")):
    return datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(names))})


def test_saved_and_parquet_datasets_give_the_same_records_map_style_and_streamed(tmp_path):
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict(_rows(6), features=_features()),
                                   "validation": datasets.Dataset.from_dict(_rows(3), features=_features())})
    splits.save_to_disk(tmp_path / "saved")
    (tmp_path / "pq" / "data").mkdir(parents=True)
    splits["train"].to_parquet(tmp_path / "pq" / "data" / "train-00000-of-00001.parquet")
    splits["validation"].to_parquet(tmp_path / "pq" / "data" / "validation-00000-of-00001.parquet")
    for where in ("saved", "pq"):
        source = open_source(f"hf:{tmp_path / where}")
        assert source.splits == ("train", "val")
        train = source.records("train")
        assert train.class_names == ["cat", "dog", "eel"] and train.labels.tolist() == [0, 1, 2, 0, 1, 2]
        payload, label = train[4]
        assert label == 1 and np.asarray(Image.open(io.BytesIO(payload)))[0, 0, 0] == 160
        streamed = open_source(f"hf:{tmp_path / where}", streaming=True).records("train")
        got = [(key[3], label) for key, _, label in streamed.samples(StreamPlan(train=False))]
        assert [label for _, label in got] == [0, 1, 2, 0, 1, 2] and len(streamed) == 6


def test_hostile_datasets_are_one_line_errors(tmp_path):
    wrong = datasets.Dataset.from_dict({"picture": ["x"], "label": [0]})
    (tmp_path / "wrong").mkdir()
    wrong.to_parquet(tmp_path / "wrong" / "train-0.parquet")
    with pytest.raises(DataError, match="expected an image column .* it has picture, label"):
        open_source(f"hf:{tmp_path / 'wrong'}")
    out_of_range = datasets.Dataset.from_dict({**_rows(2), "label": [0, 7]},
                                              features=datasets.Features({"image": datasets.Image(),
                                                                          "label": datasets.Value("int64")}))
    out_of_range.save_to_disk(tmp_path / "range")
    (tmp_path / "classes.txt").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"label 7 is outside \[0, 2\)"):
        open_source(f"hf:{tmp_path / 'range'}", class_map=str(tmp_path / "classes.txt"))
    (tmp_path / "none").mkdir()
    with pytest.raises(FileNotFoundError, match="neither a dataset saved with datasets"):
        open_source(f"hf:{tmp_path / 'none'}")


def test_a_missing_extra_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ConfigError, match=r"needs the datasets package: pip install 'resmlp\[data\]'"):
        open_source(f"hf:{tmp_path}")

"""Issue 44's small ones, each one line: a bad RESMLP_MAX_IMAGE_PIXELS (T4), a NaN in a benchmark spec (T6),
`resmlp models ''` (T11), and '$' in class names reaching matplotlib (T14)."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

import resmlp
from resmlp.cli import main
from resmlp.errors import ConfigError


@pytest.fixture
def folder_and_model(tmp_path):
    """A two-class image folder with train/val/test, classes named with '$', and a model trained for them."""
    names = ["$^$", "a$b$c"]
    for split in ("train", "val", "test"):
        for c, name in enumerate(names):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(2):
                Image.new("RGB", (16, 16), (100 * c, 40 * i, 0)).save(tmp_path / "data" / split / name / f"{i}.png")
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=2)
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "mean": [0.5] * 3, "std": [0.25] * 3, "in_chans": 3},
            "class_names": names}
    return tmp_path / "data", resmlp.save(model, tmp_path / "m.safetensors", metadata=meta)


@pytest.mark.parametrize("value", ["abc", "0", "-3"])
def test_a_bad_pixel_bound_is_one_line_in_eval_on_a_folder(tmp_path, capsys, monkeypatch, folder_and_model, value):
    data, checkpoint = folder_and_model
    monkeypatch.setenv("RESMLP_MAX_IMAGE_PIXELS", value)
    assert main(["eval", str(checkpoint), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"RESMLP_MAX_IMAGE_PIXELS='{value}' is not a whole number" in err and "Traceback" not in err


def test_a_bad_pixel_bound_is_refused_where_a_folder_is_built_not_in_a_worker(tmp_path, monkeypatch,
                                                                              folder_and_model):
    from resmlp.data import SkippingImageFolder

    monkeypatch.setenv("RESMLP_MAX_IMAGE_PIXELS", "abc")
    with pytest.raises(ConfigError, match="RESMLP_MAX_IMAGE_PIXELS"):
        SkippingImageFolder(folder_and_model[0] / "train")


def test_a_nan_in_a_benchmark_spec_is_one_line(capsys):
    assert main(["benchmark", "--models", "timm:test_resnet[drop_rate=nan]"]) == 2
    err = capsys.readouterr().err
    assert "drop_rate='nan'" in err and "Traceback" not in err


def test_an_empty_models_pattern_matches_nothing(capsys):
    assert main(["models", ""]) == 2
    assert "matches ''" in capsys.readouterr().err


def test_dollar_signs_in_class_names_are_plotted_as_text(tmp_path):
    from resmlp.reporting import plot_confusion_matrix

    path = plot_confusion_matrix(tmp_path / "cm.png", np.eye(3, dtype=int), ["$^$", "$$", r"$\frac$"])
    assert path.stat().st_size > 0


def test_eval_writes_its_folder_for_classes_named_with_dollars(tmp_path, capsys, folder_and_model):
    data, checkpoint = folder_and_model
    assert main(["eval", str(checkpoint), "--data", str(data), "--output", str(tmp_path / "out")]) == 0
    assert {"summary.json", "confusion_matrix.png"} <= {p.name for p in (tmp_path / "out").iterdir()}

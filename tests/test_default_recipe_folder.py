"""A user's own RGB folder under the default recipe (issue 50 items 7 and 8): the run says in one line what it
assumed (Fashion-MNIST's 28-px grayscale input) with a suggestion that works as typed, and the run's last.pth and
last.safetensors, the same weights, are evaluated with the same preprocessing and score the same."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
from PIL import Image

from resmlp.cli import main

TINY = ["--epochs", "1", "--batch-size", "8", "--no-progress", "--threads", "1", "--set", "train.compile=false",
        "--set", "model.dim=16", "--set", "model.depth=1", "--set", "schedule.warmup_epochs=0"]


@pytest.fixture(scope="module")
def rgb_folder(tmp_path_factory):
    """Three classes of 20x20 RGB images, each class brightest in its own channel (train/ and val/)."""
    root = tmp_path_factory.mktemp("rgb")
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 4)):
        for label in range(3):
            folder = root / split / f"c{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 80, (20, 20, 3), dtype=np.uint8)
                pixels[..., label] += 150
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


def test_the_default_recipe_on_an_rgb_folder_says_what_it_assumed_and_the_fix_works_as_typed(rgb_folder, tmp_path,
                                                                                               capsys):
    assert main(["train", "--data", f"folder:{rgb_folder}", "--output", str(tmp_path / "gray"), *TINY]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: no --recipe")]
    assert len(notes) == 1 and "28x28 px, 1 channel" in notes[0], notes
    assert json.loads((tmp_path / "gray" / "config.json").read_text())["model"]["in_chans"] == 1
    suggested = shlex.split(notes[0].split("add ", 1)[1].split(",", 1)[0])
    assert suggested[0] == "--input-size"
    assert main(["train", "--data", f"folder:{rgb_folder}", "--output", str(tmp_path / "rgb"), *TINY,
                 *suggested]) == 0
    assert "note: no --recipe" not in capsys.readouterr().err  # the input was chosen: nothing assumed
    model = json.loads((tmp_path / "rgb" / "config.json").read_text())["model"]
    assert (model["in_chans"], model["img_size"]) == (3, 64)


def test_no_note_where_nothing_was_assumed(rgb_folder):
    from resmlp.train.config import default_recipe_notice

    folder = f"folder:{rgb_folder}"
    assert default_recipe_notice("fashion-mnist-quick", {}) is None  # the recipe's own data
    assert default_recipe_notice("fashion-mnist-quick", {"data.source": folder, "model.in_chans": 3}) is None
    assert default_recipe_notice("fashion-mnist-quick", {"data.source": folder}).startswith("note:")


def test_last_pth_and_last_safetensors_of_a_folder_run_score_the_same(rgb_folder, tmp_path, capsys):
    """issue 50 item 8: the state's run config names the recipe's data.kind (fashion-mnist) beside the folder
    source; its preprocessing took Fashion-MNIST's statistics where the run (and its .safetensors) took the
    folder's."""
    run = tmp_path / "run"
    assert main(["train", "--data", f"folder:{rgb_folder}", "--output", str(run), *TINY]) == 0
    scores = {}
    for name in ("last.pth", "last.safetensors"):
        assert main(["eval", str(run / name), "--no-progress", "--threads", "1", "--amp", "fp32",
                     "--output", str(tmp_path / name)]) == 0
        scores[name] = json.loads((tmp_path / name / "summary.json").read_text())
    capsys.readouterr()
    pth, safetensors = scores["last.pth"], scores["last.safetensors"]
    assert {k: v for k, v in pth["preprocess"].items() if k != "source"} == \
        {k: v for k, v in safetensors["preprocess"].items() if k != "source"}
    assert pth["val_top1"] == safetensors["val_top1"] and pth["loss"] == pytest.approx(safetensors["loss"], abs=1e-6)

"""Every "next command" a run prints runs as printed (on an image folder, where the dataset is a path the
checkpoint does not hold); `resmlp eval` names what it measured: the split's keys, the precision."""

from __future__ import annotations

import json
import re
import shlex

import numpy as np
import pytest
from PIL import Image

from resmlp.cli import main

FAST = {"train.progress": False, "train.threads": 1, "train.compile": False, "data.num_workers": 0,
        "schedule.warmup_epochs": 0, "train.amp": "none"}


def make_jpeg_folder(root, splits=("train", "val", "test"), per_class: int = 6) -> None:
    """Two learnable classes of 16x16 RGB JPEGs under root/<split>/<class>/."""
    rng = np.random.default_rng(0)
    for split in splits:
        for label, name in enumerate(("dark", "light")):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 128, (16, 16, 3)) + 127 * label
                Image.fromarray(pixels.astype(np.uint8)).save(root / split / name / f"{i}.jpg", quality=95)


def _sets(overrides: dict) -> list[str]:
    return [f"--set={key}={json.dumps(value)}" for key, value in overrides.items()]


def _hint(out: str, label: str) -> list[str]:
    """The command printed after `label`, as a shell would split it, without the program name."""
    line = next(line for line in out.splitlines() if line.strip().startswith(label))
    words = shlex.split(line.split(label, 1)[1])
    assert words[0] == "resmlp"
    return words[1:]


def test_eval_hint_of_a_folder_run_reads_the_folder_and_names_the_split(tmp_path, capsys):
    data, run = tmp_path / "images", tmp_path / "a run"  # a space: the hint must quote the folder
    make_jpeg_folder(data)
    tiny = {**FAST, "data.kind": "folder", "model.in_chans": 3, "model.img_size": 16, "model.patch_size": 4,
            "model.dim": 16, "model.depth": 2, "train.batch_size": 4, "data.crop_pct": 1.0,
            "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0]}
    assert main(["train", "--output", str(run), "--data-dir", str(data), "--epochs", "1", *_sets(tiny)]) == 0
    trained = json.loads((run / "summary.json").read_text())
    hint = _hint(capsys.readouterr().out, "evaluate it:")
    assert hint == ["eval", str(run)]
    # as printed: the folder comes from the run's config.json; the split is the one training reported on
    assert main(hint + ["--output", str(tmp_path / "eval")]) == 0
    evaluated = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert evaluated["split"] == "test" and evaluated["test_top1"] == pytest.approx(trained["test_top1"], abs=1e-6)
    assert main(hint + ["--split", "val", "--amp", "fp32", "--output", str(tmp_path / "val")]) == 0
    on_val = json.loads((tmp_path / "val" / "summary.json").read_text())
    assert "val_top1" in on_val and "test_top1" not in on_val and on_val["precision"] == "fp32"
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["val_top1"] == on_val["val_top1"]


def test_dino_hints_run_as_printed(tmp_path, capsys):
    data, run = tmp_path / "my images", tmp_path / "dino"  # a space: the hints must quote paths
    make_jpeg_folder(data, per_class=8)
    tiny = {**FAST, "data.kind": "folder", "model.in_chans": 3, "model.img_size": 16, "model.patch_size": 4,
            "model.dim": 16, "model.depth": 2, "train.batch_size": 8, "data.crop_pct": 1.0,
            "dino.out_dim": 32, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 2,
            "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0}
    assert main(["pretrain", "dino", "--output", str(run), "--data-dir", str(data), "--epochs", "1",
                 *_sets(tiny)]) == 0
    out = capsys.readouterr().out
    probe = _hint(out, "linear probe:")
    assert main(probe + ["--output", str(tmp_path / "probe")]) == 0
    assert json.loads((tmp_path / "probe" / "summary.json").read_text())["dataset"] == "folder"
    finetune = _hint(out, "fine-tune:")
    # as printed, made short for a test: one epoch in small batches
    assert main(finetune + ["--epochs", "1", "--batch-size", "4", *_sets(FAST)]) == 0
    assert (tmp_path / "dino-finetuned" / "best.safetensors").is_file()


def test_a_flag_against_the_recipe_says_which_key_and_how_to_override_it(tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "run"), "--epochs", "1",
                 "--set", "schedule.warmup_epochs=5"]) == 2
    err = capsys.readouterr().err
    assert "schedule.warmup_epochs is 5" in err and "--warmup-epochs N" in err


def test_precision_flags_take_fp32_and_refuse_other_words(capsys):
    from resmlp.cli import build_parser
    from resmlp.commands.common import training_overrides

    parser = build_parser()
    args = parser.parse_args(["train", "--output", "x", "--amp", "fp32", "--warmup-epochs", "0.5"])
    assert training_overrides(args) == {"train.amp": "none", "schedule.warmup_epochs": 0.5}
    assert parser.parse_args(["eval", "x", "--amp", "none"]).amp == "none"  # the recipes' word, still accepted
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "x", "--amp", "fp64"])
    assert "choose one of auto, bf16, fp16, fp32" in capsys.readouterr().err
    assert "FLAG_" not in parser._subparsers._group_actions[0].choices["train"].format_help()


def test_a_missing_teacher_names_the_key_and_the_command_that_makes_it_which_runs_as_printed(
        tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the recipe names its teacher relative to the working folder: runs/teacher
    tiny = [*_sets({**FAST, "data.kind": "synthetic", "data.synthetic_size": [32, 16], "train.batch_size": 16,
                    "data.val_size": 0}), "--epochs", "1"]
    assert main(["train", "--recipe", "fashion-mnist-full", "--output", "full", *tiny]) == 2
    err = capsys.readouterr().err
    assert "distill.teacher: checkpoint runs/teacher/best.safetensors does not exist" in err
    hint = shlex.split(err.split("make it first: ", 1)[1].split(", or ", 1)[0])
    assert hint[:2] == ["resmlp", "train"] and "fashion-mnist-teacher" in hint
    assert main(hint[1:] + tiny) == 0  # as printed, made short for a test
    assert main(["train", "--recipe", "fashion-mnist-full", "--output", "full", *tiny]) == 0


def test_the_image_size_limit_hint_names_the_variable_and_works_as_printed(tmp_path, monkeypatch):
    from resmlp.data.images import open_image
    from resmlp.errors import DataError

    Image.fromarray(np.zeros((30, 20), dtype=np.uint8)).save(tmp_path / "big.png")
    monkeypatch.setenv("RESMLP_MAX_IMAGE_PIXELS", "100")
    with pytest.raises(DataError) as info:
        open_image(tmp_path / "big.png", in_chans=1)
    assignment = str(info.value).rsplit(": ", 1)[1].split()[0]  # before: "raise max_image_pixels", a name no user sets
    assert assignment == "RESMLP_MAX_IMAGE_PIXELS=600"
    monkeypatch.setenv(*assignment.split("="))
    assert open_image(tmp_path / "big.png", in_chans=1).size == (20, 30)


def test_a_validation_split_too_large_names_its_key(tmp_path, capsys):
    make_jpeg_folder(tmp_path / "images", splits=("train",), per_class=3)
    tiny = {**FAST, "data.kind": "folder", "model.in_chans": 3, "model.img_size": 16, "model.patch_size": 4,
            "model.dim": 16, "model.depth": 2, "train.batch_size": 2}
    assert main(["train", "--output", str(tmp_path / "run"), "--data-dir", str(tmp_path / "images"), "--epochs", "1",
                 *_sets(tiny)]) == 2
    err = capsys.readouterr().err
    assert "data.val_size=5000" in err and "--set data.val_size=N" in err  # before: no key named
    assert main(["train", "--output", str(tmp_path / "run"), "--data-dir", str(tmp_path / "images"), "--epochs", "1",
                 *_sets({**tiny, "data.val_size": 2})]) == 0


def test_fp16_on_the_cpu_says_what_to_use_and_blames_no_gradient_scaler():
    import torch

    from resmlp.runtime import resolve_amp

    with pytest.raises(ValueError) as info:  # `resmlp eval --amp fp16` on the CPU: evaluation has no scaler
        resolve_amp("fp16", torch.device("cpu"))
    assert "scaler" not in str(info.value) and "use bf16 or fp32" in str(info.value)


def test_an_image_folder_given_to_the_default_kind_says_to_name_it_and_the_hint_runs(tmp_path, capsys):
    data = tmp_path / "images"
    make_jpeg_folder(data)
    tiny = {**FAST, "model.in_chans": 3, "model.img_size": 16, "model.patch_size": 4, "model.dim": 16,
            "model.depth": 2, "train.batch_size": 4, "data.crop_pct": 1.0}
    # --data-dir on a folder laid out as train/<class>/ trains on it: the flag infers data.kind=folder
    flag = ["train", "--output", str(tmp_path / "flag"), "--data-dir", str(data), "--epochs", "1", *_sets(tiny)]
    assert main(flag) == 0
    # data.dir set by --set keeps the recipe's kind: refused, with a hint that runs
    args = ["train", "--output", str(tmp_path / "run"), "--set", f"data.dir={data}", "--epochs", "1", *_sets(tiny)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "an image folder, not Fashion-MNIST's IDX files" in err  # before: "Fashion-MNIST file ... not found"
    hint = shlex.split(err.split("add ", 1)[1].split(" (resmlp train)")[0])
    assert hint == ["--set", "data.kind=folder"]
    assert main(args + hint) == 0


def test_the_closing_lines_name_every_file_as_the_user_named_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = {**FAST, "data.kind": "synthetic", "data.synthetic_size": [16, 8], "train.batch_size": 8,
            "model.dim": 16, "model.depth": 1, "data.val_size": 0}
    assert main(["train", "--output", "runs/x", "--epochs", "1", *_sets(tiny)]) == 0
    lines = capsys.readouterr().out.splitlines()
    paths = [line.split(":", 1)[1].split()[0] for line in lines if line.startswith("  ") and ":" in line
             and "evaluate" not in line]
    assert len(paths) == 4 and all(p.startswith("runs/x/") for p in paths), paths  # before: some absolute
    assert "(TensorBoard: runs/x/tensorboard)" in "\n".join(lines)
    assert all((tmp_path / p).exists() for p in paths)


def test_a_bare_timm_name_says_how_to_write_it_and_the_spelling_runs(tmp_path, capsys):
    tiny = [*_sets({**FAST, "data.kind": "synthetic", "data.synthetic_size": [16, 8], "train.batch_size": 8,
                    "data.val_size": 0}), "--epochs", "1"]
    assert main(["train", "--model", "resnet10t", "--output", str(tmp_path / "a"), *tiny]) == 2
    spelled = capsys.readouterr().err.split("write ", 1)[1].split()[0]
    assert spelled == "timm:resnet10t"
    assert main(["train", "--model", spelled, "--output", str(tmp_path / "a"), *tiny]) == 0
    assert main(["benchmark", "--models", "resnet10t"]) == 2
    spelled = capsys.readouterr().err.split("write ", 1)[1].split()[0]
    assert main(["benchmark", "--models", spelled, "--repeats", "1", "--warmup", "1", "--min-time", "0",
                 "--batch-size", "1", "--large-batch", "0", "--img-size", "32", "--no-progress"]) == 0


def test_the_final_test_scoring_shows_progress_unless_it_is_off(tmp_path, capsys):
    tiny = {**FAST, "data.kind": "synthetic", "data.synthetic_size": [16, 600], "train.batch_size": 8,
            "model.dim": 16, "model.depth": 1, "data.val_size": 0}
    assert main(["train", "--output", str(tmp_path / "a"), "--epochs", "1",
                 *_sets({**tiny, "train.progress": True})]) == 0
    err = capsys.readouterr().err
    assert re.search(r"test split: .*\b\d/3\b", err)  # 600 images in batches of 256: 3; before: nothing shown
    assert main(["train", "--output", str(tmp_path / "b"), "--epochs", "1", *_sets(tiny)]) == 0
    assert "test split" not in capsys.readouterr().err


def test_translate_train_says_what_it_prepares_and_resumes_from_the_runs_own_config(tmp_path, capsys):
    from num2words import num2words

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split, start, count in (("train", 0, 48), ("valid", 500, 4), ("test", 900, 4)):
        for lang in ("en", "de"):
            numbers = range(start, start + count)
            (corpus / f"{split}.{lang}").write_text("".join(num2words(n, lang=lang) + "\n" for n in numbers))
    run = str(tmp_path / "run")
    small = ["--preset", "tiny", "--vocab-size", "60", "--beam", "1", "--threads", "1"]
    assert main(["translate", "train", "--data", str(corpus), "--src-suffix", "en", "--tgt-suffix", "de",
                 "--output", run, "--max-steps", "1", *small]) == 0
    assert "preparing the data and the tokenizer" in capsys.readouterr().err  # before: nothing until the bar
    # before: "one of the arguments --task --data is required"; the run's own data, model and schedule
    assert main(["translate", "train", "--output", run, "--resume", "--max-steps", "2", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 2

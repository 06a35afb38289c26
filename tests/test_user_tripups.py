"""What a new user trips on (issue 43's annoyances), each pinned where it was fixed: one message per range error,
the real error first for a typo'd model, top-5 only where it says something, compile.why always filled."""

from __future__ import annotations

import json

import torch

from resmlp.cli import main
from resmlp.evaluation import classify

TINY = {"data.kind": "synthetic", "data.synthetic_size": [32, 16], "data.num_workers": 0, "model.img_size": 16,
        "model.patch_size": 8, "model.dim": 16, "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
        "train.batch_size": 8, "train.threads": 1, "train.progress": False}


def sets(overrides: dict) -> list[str]:
    return [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]


def test_a_range_error_is_said_once(tmp_path, capsys):
    for flag in (["--lr", "-1"], ["--set", "train.batch_size=0"]):
        assert main(["train", "--output", str(tmp_path / "run"), *sets(TINY), *flag]) == 2
        err = capsys.readouterr().err
        key = "optim.lr" if flag[0] == "--lr" else "train.batch_size"
        assert err.count(key) == 1, err
        assert "outside the allowed range" in err


def test_a_typod_timm_model_gets_its_error_and_no_note_first(tmp_path, capsys):
    assert main(["train", "--model", "timm:resnet_10t", "--output", str(tmp_path / "run"), *sets(TINY)]) == 2
    err = capsys.readouterr().err
    assert "note" not in err and "dropped" not in err
    assert err.startswith("resmlp train: error:") and "timm has no model 'resnet_10t'" in err


def test_top5_only_where_there_are_more_than_5_classes(tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "run"), *sets(TINY)]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "top-5" not in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_top5"] is None and summary["test_top5"] is None
    assert main(["eval", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "top-5" not in out
    # six classes: top-5 is a score, and counted right
    logits = torch.eye(6)[[0, 1, 2, 3, 4, 5]]
    targets = torch.tensor([0, 1, 2, 3, 4, 5])
    scored = classify(torch.nn.Identity(), [(logits, targets, 0)], 6, torch.device("cpu"), "none")
    assert scored["top1"] == 100.0 and scored["top5"] == 100.0
    worst = classify(torch.nn.Identity(), [(-logits, targets, 0)], 6, torch.device("cpu"), "none")
    assert worst["top1"] == 0.0 and worst["top5"] == 0.0  # the true class last of six: not in the top 5
    assert classify(torch.nn.Identity(), [(logits[:3, :3], targets[:3], 0)], 3, torch.device("cpu"),
                    "none")["top5"] is None


def test_compile_why_says_why_a_run_did_not_compile(tmp_path):
    from resmlp.train import train

    for steps, images in ((1, 8), (2, 16), (4, 32)):  # auto ends before, at and after its warm-up
        summary = train("fashion-mnist-quick", tmp_path / f"run{steps}", {
            **TINY, "data.synthetic_size": [images, 8], "train.compile": "auto"})
        assert summary["compile"]["compiled"] is False and summary["compile"]["why"].startswith("train.compile=auto")


def test_data_workers_are_capped_by_the_usable_cores_without_torch_warnings(tmp_path, capsys, monkeypatch):
    import warnings

    from test_distill_teachers import _image_folder

    from resmlp import runtime

    monkeypatch.setattr(runtime, "usable_cores", lambda: 1)
    monkeypatch.setattr(runtime, "_capped_workers", [])
    assert runtime.data_workers(0) == 0 and runtime.data_workers(1) == 1
    data = _image_folder(tmp_path / "data", classes=2, per_class=2, size=16)
    overrides = {**{k: v for k, v in TINY.items() if not k.startswith("data.")}, "data.kind": "folder",
                 "data.dir": str(data), "data.num_workers": 8, "model.in_chans": 3, "train.batch_size": 2}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["train", "--output", str(tmp_path / "run"), *sets(overrides)]) == 0
    assert not [w for w in caught if "worker" in str(w.message)]
    err = capsys.readouterr().err
    assert err.count("data.num_workers=8 capped to 1") == 1


def test_data_dir_on_an_imagenet_layout_folder_trains_on_it(tmp_path):
    from test_distill_teachers import _image_folder

    data = _image_folder(tmp_path / "imagenet", classes=2, per_class=4, size=16)
    overrides = {**{k: v for k, v in TINY.items() if not k.startswith("data.")}, "data.num_workers": 0,
                 "model.in_chans": 3, "train.batch_size": 4}
    assert main(["train", "--data-dir", str(data), "--output", str(tmp_path / "run"), *sets(overrides)]) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["kind"] == "folder" and config["data"]["dir"] == str(data)


def test_ctrl_c_after_the_first_best_checkpoint_leaves_a_run_to_resume(tmp_path, monkeypatch):
    import pytest

    from resmlp.train import train
    from resmlp.train import trainer as trainer_module

    drawn = trainer_module.side_outputs

    def interrupted(*args, **kwargs):  # Ctrl-C while epoch 1's curves are drawn (matplotlib's first import)
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "side_outputs", interrupted)
    overrides = {**TINY, "schedule.epochs": 2}
    with pytest.raises(KeyboardInterrupt):
        train("fashion-mnist-quick", tmp_path / "run", overrides)
    assert (tmp_path / "run" / "best.safetensors").is_file() and (tmp_path / "run" / "last.pth").is_file()
    monkeypatch.setattr(trainer_module, "side_outputs", drawn)
    summary = train("fashion-mnist-quick", tmp_path / "run", overrides, resume=True)
    assert summary["epochs"] == 2
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows[1:]] == ["1", "2"]  # epoch 1's row, redrawn by the resume


def test_the_final_test_decode_can_be_capped_or_skipped(tmp_path, capsys):
    import dataclasses

    from test_seq2seq_train import _tiny_config

    from resmlp.seq2seq.train import train_translation

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = ["one", "two", "three", "four", "five", "six"]
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.en").write_text("".join(w + "\n" for w in words))
        (corpus / f"{split}.fr").write_text("".join(w[::-1] + "\n" for w in words))
    capped = train_translation(dataclasses.replace(_tiny_config(corpus, tmp_path / "capped"), test_decode_limit=2))
    assert capped["sentences"] == 2 and len((tmp_path / "capped" / "test.hyp").read_text().splitlines()) == 2
    skipped = train_translation(dataclasses.replace(_tiny_config(corpus, tmp_path / "skipped"), test_decode_limit=0))
    assert "bleu" not in skipped and "resmlp translate eval" in skipped["test"]
    assert not (tmp_path / "skipped" / "test.hyp").exists()
    # the flag, as typed; a resume may change it
    args = ["translate", "train", "--data", str(corpus), "--src-suffix", "en", "--tgt-suffix", "fr", "--preset",
            "tiny", "--max-steps", "2", "--vocab-size", "40", "--no-progress", "--test-decode-limit", "0",
            "--output", str(tmp_path / "cli")]
    assert main(args) == 0
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["test"].startswith("not decoded")
    assert main(["translate", "train", "--resume", "--output", str(tmp_path / "cli"), "--max-steps", "3",
                 "--test-decode-limit", "1", "--no-progress"]) == 0
    assert json.loads((tmp_path / "cli" / "summary.json").read_text())["sentences"] == 1


def test_translate_decode_of_an_image_run_says_what_it_is(tmp_path, capsys):
    import numpy as np
    from PIL import Image

    assert main(["train", "--output", str(tmp_path / "run"), *sets(TINY)]) == 0
    capsys.readouterr()
    for action in ("decode", "eval"):
        assert main(["translate", action, str(tmp_path / "run")]) == 2
        err = capsys.readouterr().err
        assert "is an image classifier's run" in err and "Traceback" not in err
    hint = err.split("classify images with: ")[1].split()
    Image.fromarray(np.zeros((16, 16), np.uint8)).save(tmp_path / "image.png")
    assert hint[:3] == ["resmlp", "predict", str(tmp_path / "run")] and hint[3] == "IMAGE"
    assert main([*hint[1:3], str(tmp_path / "image.png")]) == 0  # the hint, with an image for IMAGE


def test_optimize_says_it_folded_nothing_in_a_model_of_another_family():
    import pytest
    import timm

    from resmlp.inference import optimize

    model = timm.create_model("resnet10t", num_classes=3)
    with pytest.warns(UserWarning, match="optimize: ResNet is not a ResMLP/Mixer, so nothing was folded"):
        fast = optimize(model)
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(fast(x), model.eval()(x))

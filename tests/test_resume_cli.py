"""`resmlp train --output RUN --resume` continues a run from its folder alone: the recipe and every override
come from RUN/config.json; a flag given again must agree, or be a change a resume allows."""

from __future__ import annotations

import json

from resmlp.cli import main

TINY = {"data.kind": "synthetic", "data.synthetic_size": [32, 16], "data.num_workers": 0, "data.crop_pct": 1.0,
        "model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 2, "train.batch_size": 8,
        "train.progress": False, "train.threads": 1, "train.compile": False, "schedule.warmup_epochs": 0,
        "train.amp": "none", "optim.lr": 2e-3}


def test_resume_takes_the_recipe_and_overrides_from_the_run_folder(tmp_path, capsys):
    run = str(tmp_path / "run")
    sets = [f"--set={key}={json.dumps(value)}" for key, value in TINY.items()]
    assert main(["train", "--output", run, "--epochs", "1", *sets]) == 0
    # nothing but the folder, and a longer schedule (a change a resume allows)
    assert main(["train", "--output", run, "--resume", "--epochs", "2"]) == 0
    resumed = json.loads((tmp_path / "run" / "config.json").read_text())
    assert resumed["schedule"]["epochs"] == 2 and resumed["model"]["dim"] == 16
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["epochs"] == 2
    capsys.readouterr()
    # a flag given again that disagrees with the run is named, old and new value
    assert main(["train", "--output", run, "--resume", "--epochs", "3", "--batch-size", "4"]) == 2
    assert "train.batch_size: was 8, now 4" in capsys.readouterr().err


def test_ctrl_c_says_how_to_resume(tmp_path, capsys, monkeypatch):
    import resmlp.train

    run = tmp_path / "run"
    run.mkdir()
    (run / "last.pth").write_bytes(b"a state file")  # what an interrupted run leaves

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(resmlp.train, "train", interrupted)
    assert main(["train", "--output", str(run)]) == 130
    assert capsys.readouterr().err.strip().endswith(f"continue it with: resmlp train --output {run} --resume")


def test_ctrl_c_before_the_first_state_file_says_there_is_nothing_to_resume_and_how_to_save_sooner(
        tmp_path, capsys, monkeypatch):
    import resmlp.train

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(resmlp.train, "train", interrupted)
    assert main(["train", "--output", str(tmp_path / "run")]) == 130
    err = capsys.readouterr().err.strip()  # before: "interrupted" and nothing else
    assert "nothing to resume yet" in err and "--set train.checkpoint_every_steps=N" in err
    from resmlp.train.config import load_config

    assert load_config("fashion-mnist-quick", ["train.checkpoint_every_steps=50"]).train.checkpoint_every_steps == 50

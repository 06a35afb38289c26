"""Models from anywhere train with recipes written for ResMLP: `--model timm:NAME`, `torchvision:NAME` or a
checkpoint file on the quickstart recipe. The recipe's ResMLP keys that do not apply are dropped with a one-line
note; keys the user gives that the model cannot take are refused naming them, before any data is read."""

from __future__ import annotations

import json

import pytest
from hostspeed import limit

import resmlp
from resmlp.cli import main

# tiny runs on in-memory data: 32 training images of 28x28 grayscale (the quickstart recipe's shape), 2 steps
TINY = ["--epochs", "1", "--batch-size", "16", "--no-progress", "--threads", "1", "--set", "data.kind=synthetic",
        "--set", "data.synthetic_size=[32,16]", "--set", "data.synthetic_classes=3", "--set", "train.compile=false",
        "--set", "schedule.warmup_epochs=0", "--set", "train.amp=none"]
RESMLP_ONLY = "patch_size, dim, depth, layerscale_init"  # the quickstart recipe's keys a convnet does not take


@pytest.mark.parametrize("model", ["timm:resnet10t", "torchvision:resnet18"])
def test_a_foreign_model_trains_on_a_resmlp_recipe_and_its_checkpoint_evaluates(model, tmp_path, recwarn):
    run = tmp_path / "run"
    assert main(["train", "--model", model, "--output", str(run), *TINY]) == 0
    notes = [str(w.message) for w in recwarn if "dropped" in str(w.message)]
    assert len(notes) == 1 and RESMLP_ONLY in notes[0] and len(notes[0].splitlines()) == 1
    config = json.loads((run / "config.json").read_text())
    assert config["model"] == {"name": model, "img_size": 28, "in_chans": 1}
    # the saved checkpoint rebuilds the same architecture (torchvision's too) and evaluates
    assert main(["eval", str(run), "--output", str(tmp_path / "eval")]) == 0
    summary = json.loads((tmp_path / "eval" / "summary.json").read_text())
    trained = json.loads((run / "summary.json").read_text())
    assert summary["test_top1"] == pytest.approx(trained["test_top1"], abs=1e-6)


@pytest.mark.parametrize("key,value,words", [("bogus", "1", "unexpected keyword argument 'bogus'"),
                                             ("channels", "[1]", "layer2")])
def test_a_key_the_model_cannot_take_is_refused_naming_it(key, value, words, tmp_path, capsys):
    code = main(["train", "--model", "timm:resnet10t", "--output", str(tmp_path / "run"), *TINY,
                 "--set", f"model.{key}={value}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"model.{key}=" in err and words in err
    assert not (tmp_path / "run" / "last.pth").exists()


def test_a_key_given_for_a_timm_model_reaches_it(tmp_path):
    from resmlp.train.config import load_config

    cfg = load_config("fashion-mnist-quick", {"model.name": "timm:resnet10t", "model.drop_rate": 0.25,
                                              "model.stem_width": 16})
    assert cfg.model == {"name": "timm:resnet10t", "img_size": 28, "in_chans": 1, "drop_rate": 0.25,
                         "stem_width": 16}


def test_the_recipes_own_timm_keys_are_kept(recwarn):
    from resmlp.train.config import load_config

    cfg = load_config("fashion-mnist-teacher")  # a recipe written for its timm model: nothing dropped
    assert cfg.model == {"name": "timm:resnet10t", "in_chans": 1, "img_size": 28}
    assert not [w for w in recwarn if "dropped" in str(w.message)]


def test_finetune_drops_the_recipes_model_keys_with_a_note_and_refuses_the_users(tmp_path, capsys, recwarn):
    source = tmp_path / "tiny.safetensors"
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, num_classes=3, dim=16,
                                    depth=1), source)
    assert main(["finetune", str(source), "--output", str(tmp_path / "ft"), *TINY]) == 0
    notes = [str(w.message) for w in recwarn if "dropped" in str(w.message)]
    assert len(notes) == 1 and "img_size, patch_size, in_chans, dim, depth, layerscale_init" in notes[0]
    assert main(["finetune", str(source), "--output", str(tmp_path / "ft2"), *TINY, "--set", "model.dim=8"]) == 2
    assert "not dim" in capsys.readouterr().err


def test_the_command_line_prints_a_note_as_one_line(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "resmlp", "train", "--model", "timm:resnet10t", "--output",
                             str(tmp_path / "run"), *TINY, "--set", "model.bogus=1"], capture_output=True, text=True,
                            timeout=limit(120))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("resmlp train: note: model timm:resnet10t:") and RESMLP_ONLY in lines[0]
    assert lines[1].startswith("resmlp train: error:") and "Traceback" not in result.stderr


def test_finetuning_normalises_as_the_checkpoint_was_trained(tmp_path):
    from resmlp.train.config import load_config

    source = tmp_path / "quick.safetensors"
    model = resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, num_classes=3, dim=16, depth=1)
    resmlp.save(model, source, metadata={"preprocess": {"mean": [0.286], "std": [0.353]}})
    for kind in ("folder", "synthetic"):  # before: the data kind's statistics (folders: ImageNet's)
        cfg = load_config("fashion-mnist-quick", {"model.name": str(source), "data.kind": kind,
                                                  "data.dir": str(tmp_path)})
        assert (cfg.data.mean, cfg.data.std) == ([0.286], [0.353])
    # the recipe's or the user's statistics win
    cfg = load_config("fashion-mnist-quick", {"model.name": str(source), "data.mean": [0.5], "data.std": [0.5]})
    assert (cfg.data.mean, cfg.data.std) == ([0.5], [0.5])
    # a file without metadata (timm's, DeiT's) was trained on ImageNet: its statistics
    rgb = tmp_path / "rgb.safetensors"
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, num_classes=3, dim=16, depth=1), rgb)
    cfg = load_config("cifar-finetune", {"model.name": str(rgb), "data.dir": str(tmp_path)})
    assert cfg.data.mean == pytest.approx([0.485, 0.456, 0.406])


def test_finetune_takes_a_run_folder_as_eval_does(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, num_classes=3, dim=16,
                                    depth=1), run / "best.safetensors")
    assert main(["finetune", str(run), "--output", str(tmp_path / "ft"), *TINY]) == 0  # before: "does not exist"
    config = json.loads((tmp_path / "ft" / "config.json").read_text())
    assert config["model"]["name"] == str((run / "best.safetensors").resolve())


def test_a_timm_student_distils_from_a_checkpoint_teacher_on_a_resmlp_recipe(tmp_path):
    teacher = tmp_path / "teacher.safetensors"
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, num_classes=3, dim=16,
                                    depth=1), teacher)
    run = tmp_path / "student"
    assert main(["train", "--recipe", "fashion-mnist-distill", "--model", "timm:resnet10t", "--distill",
                 str(teacher), "--teacher-classes-match", "--output", str(run), *TINY]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["task"] == "distillation" and summary["teacher"]["spec"] == str(teacher)
    assert json.loads((run / "config.json").read_text())["model"]["name"] == "timm:resnet10t"


def test_a_timm_model_that_takes_the_image_size_is_built_for_the_datas(tmp_path):
    # test_vit has 16-px patches: at the quickstart's 28 px it cannot be built, at 32 it must be built for 32
    assert main(["train", "--model", "timm:test_vit", "--output", str(tmp_path / "a"), *TINY]) == 2
    run = tmp_path / "b"
    assert main(["train", "--model", "timm:test_vit", "--output", str(run), *TINY, "--set", "model.img_size=32"]) == 0
    model = resmlp.load(run / "best.safetensors")
    assert tuple(model.patch_embed.img_size) == (32, 32)  # before: built for 224 and fed 32-px images


def test_a_torchvision_checkpoint_is_named_as_one_and_refused_in_one_line_where_it_cannot_go(tmp_path, capsys):
    from resmlp.build import build_model

    path = tmp_path / "tv.safetensors"
    resmlp.save(build_model("torchvision:resnet18", num_classes=3, in_chans=1), path,
                metadata={"preprocess": {"img_size": 32, "in_chans": 1, "mean": [0.5], "std": [0.25]}})
    # export and analyze take any model train trains (tests/test_export.py, test_analysis.py), named as what it is
    assert main(["export", str(path), "--output", str(tmp_path / "m.onnx")]) == 0
    assert "the torchvision model as trained" in capsys.readouterr().out and (tmp_path / "m.onnx").is_file()
    assert main(["eval-knn", str(path), "--data", "synthetic"]) == 2  # before: an AttributeError traceback
    err = capsys.readouterr().err
    assert "evaluate it with resmlp eval" in err and "Traceback" not in err

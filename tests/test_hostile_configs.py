"""Image-side configs (recipes, --set, flags, run folders' config.json): every value that reaches a constructor
is validated before anything is built or trained, and refused in one line naming its key."""

from __future__ import annotations

import pytest

from resmlp.cli import main
from resmlp.errors import ConfigError
from resmlp.train.config import load_config

QUICK = "fashion-mnist-quick"


@pytest.mark.parametrize("override, words", [
    ("data.color_jitter=1e300", r"data.color_jitter=1e\+300"),
    ("data.interpolation=foo", "data.interpolation: 'foo' is not one of"),
    ("train.device=cudafoo", "train.device: 'cudafoo'"),
    ("train.device=cuda:abc", "train.device: 'cuda:abc'"),
    ("train.device=cuda:-1", "train.device: 'cuda:-1'"),
    ("model.depth=2.5", "depth=2.5 is not an integer"),
    ("model.dim=true", "dim=True is not an integer"),
    ("model.mlp_ratio=nan", "model.mlp_ratio=nan"),
    ("data.synthetic_size=[64]", r"data.synthetic_size: \[train, val\]"),
    ("data.auto_augment=augmix-m-1", "data.auto_augment: 'augmix-m-1' is not a timm policy"),
    ("train.seed=1180591620717411303424", r"train.seed=1180591620717411303424 .* outside the allowed range"),
    ("data.std=[-1]", "data.std: every value must be > 0"),
    ("data.std=[0]", "data.std: every value must be > 0"),
    ("data.mean=[0.5, 0.5]", "data.mean and data.std"),
    ("data.mixup=1e300", "data.mixup=1e\\+300 .* outside"),
    ("distill.teacher=timm:nope", "distill.teacher: timm has no model 'nope'"),
])
def test_values_that_reach_a_constructor_are_refused_naming_the_key(override, words):
    overrides = [override] + (["data.mean=[0.5]"] if override.startswith("data.std") else [])
    overrides += ["data.std=[0.5]"] if override.startswith("data.mean") else []
    with pytest.raises(ConfigError, match=words):
        load_config(QUICK, overrides)


def test_a_yaml_number_without_a_dot_is_a_number_in_the_model_section_too():
    """PyYAML reads 1e-9 as a string; it was compared with numbers deep in the model ('<' not supported)."""
    cfg = load_config(QUICK, {"model.layerscale_init": "1e-9"})
    assert cfg.model_config().layerscale_init == 1e-9


@pytest.mark.parametrize("recipe", ["model:\n  name: resmlp_s12\n1.5: 3\n", "~: 3\n", "data:\n  1.5: 3\n"])
def test_recipe_keys_that_are_not_names_are_refused(tmp_path, recipe):
    path = tmp_path / "r.yaml"
    path.write_text(recipe)
    with pytest.raises(ConfigError, match="are not names"):
        load_config(path)


def test_a_timm_model_that_cant_take_its_arguments_is_a_config_error_naming_them():
    from resmlp.build import build_model

    with pytest.raises(ConfigError, match=r"timm:resnet18 can't be built with model.no_such_arg=3"):
        build_model("timm:resnet18", num_classes=3, no_such_arg=3)
    with pytest.raises(ConfigError, match=r"model: timm:resnet18 can't be built with model.no_such_arg=3"):
        load_config({"model": {"name": "timm:resnet18", "no_such_arg": 3}})  # at validation, on the meta device


def test_the_memory_estimate_counts_the_confusion_matrix_and_the_dino_head(monkeypatch):
    from resmlp.complexity import CONFUSION_MAX_CLASSES

    monkeypatch.setattr("resmlp.runtime.physical_memory_bytes", lambda: 1 << 27)
    tiny = {"data.kind": "synthetic", "model.img_size": 16, "model.patch_size": 4, "model.dim": 16,
            "model.depth": 1}
    load_config(QUICK, tiny)  # fits
    with pytest.raises(ConfigError, match=f"{CONFUSION_MAX_CLASSES} classes.*confusion matrix"):
        load_config(QUICK, {**tiny, "data.synthetic_classes": CONFUSION_MAX_CLASSES})  # 235 MB with its copies
    # above it the evaluation sums two per-class vectors (resmlp.evaluation.classify): 30,000 classes fit
    load_config(QUICK, {**tiny, "data.synthetic_classes": 30000})
    with pytest.raises(ConfigError, match="with DINO"):
        load_config("dino-fashion-mnist", {**tiny, "dino.out_dim": 1048576})


def test_dino_local_crops_are_not_larger_than_the_global_ones():
    with pytest.raises(ConfigError, match=r"dino.local_size=4096 is larger than the global crops \(28 px\)"):
        load_config("dino-fashion-mnist", {"dino.local_size": 4096, "dino.num_local": 2})


@pytest.mark.parametrize("argv, words", [
    (["eval", "x.safetensors", "--batch-size", "0"], "invalid batch size"),
    (["eval-knn", "x.safetensors", "--batch-size", "-3"], "invalid batch size"),
    (["eval", "x.safetensors", "--output", ""], "--output is empty"),
    (["train", "--output", " "], "--output is empty"),
    (["predict", "x.safetensors", "a.png", "--output", ""], "--output is empty"),
    (["export", "x.safetensors", "--output", ""], "--output is empty"),
])
def test_flags_out_of_range_are_usage_errors(capsys, argv, words):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and words in capsys.readouterr().err


def test_an_unknown_device_is_one_line_for_eval(tmp_path, capsys):
    import resmlp

    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=3)
    ckpt = resmlp.save(model, tmp_path / "m.safetensors")
    assert main(["eval", str(ckpt), "--data", "synthetic", "--device", "cudafoo"]) == 2  # before any data is read
    assert "device 'cudafoo' is not auto, cpu, cuda or cuda:N" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["[1, 2]", "[" * 100_000 + "]" * 100_000, '{"data": [1]}',
                                     '{"data": {"kind": 3}}', "{" * 40 + "}" * 40])
def test_a_run_folders_config_json_is_validated_on_eval_and_resume(tmp_path, capsys, content):
    import resmlp

    run = tmp_path / "run"
    run.mkdir()
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=3)
    resmlp.save(model, run / "best.safetensors")
    (run / "config.json").write_text(content)
    assert main(["eval", str(run)]) == 2
    assert "run config" in capsys.readouterr().err
    (run / "last.pth").write_bytes(b"")
    assert main(["train", "--output", str(run), "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resmlp train: error: ") and "Traceback" not in err


def test_eval_prints_its_score_first_and_writes_files_only_into_its_output_folder(tmp_path, capsys):
    """Without --output nothing is written (it wrote a PNG beside the checkpoint: a read-only folder failed after
    computing, the score never shown); with an unwritable --output the score is still printed."""
    import os

    import resmlp

    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=4)
    ckpt = resmlp.save(model, tmp_path / "ro" / "m.safetensors",
                       metadata={"preprocess": {"img_size": 16, "mean": [0.5] * 3, "std": [0.25] * 3}})
    os.chmod(tmp_path / "ro", 0o555)
    try:
        assert main(["eval", str(ckpt), "--data", "synthetic", "--no-progress"]) == 0
        assert sorted(p.name for p in (tmp_path / "ro").iterdir()) == ["m.safetensors"]
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "confusion_matrix.png").mkdir()  # a folder where the PNG goes: the write fails
        assert main(["eval", str(ckpt), "--data", "synthetic", "--no-progress", "--output", str(tmp_path / "out")]) == 2
        out = capsys.readouterr()
        assert out.out.count("top-1 ") == 2 and "confusion_matrix.png" in out.err
    finally:
        os.chmod(tmp_path / "ro", 0o755)

"""`resmlp train` takes timm's train.py and DeiT's main.py spellings (issue 56 item 4): each flag is an alias of one
recipe key (resmlp.commands.common.TRAINING_FLAGS), grouped in --help, checked as --set is; DeiT's README command
(`--model resmlp_12 --batch-size 64 --data-path DIR --output_dir DIR`) and timm's (`train.py DIR --model
resmlp_12_224 ...`) run with only the program name changed, and resolve to the `deit` recipe plus what they set.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from resmlp.cli import build_parser, main
from resmlp.commands.common import recipe_for, training_overrides
from resmlp.train.config import load_config

# every spelling the issue lists -> (argv, the recipe key, the value it sets)
SPELLINGS = [
    (["--model", "resmlp_12"], "model.name", "resmlp_12"),
    (["--lr", "1e-3"], "optim.lr", 1e-3),
    (["--opt", "adamw"], "optim.name", "adamw"),
    (["--weight-decay", "0.3"], "optim.weight_decay", 0.3),
    (["--sched", "step"], "schedule.name", "step"),
    (["--epochs", "7"], "schedule.epochs", 7),
    (["--warmup-epochs", "2"], "schedule.warmup_epochs", 2.0),
    (["--warmup-lr", "1e-7"], "schedule.warmup_lr", 1e-7),
    (["--min-lr", "1e-6"], "schedule.min_lr", 1e-6),
    (["--mixup", "0.2"], "data.mixup", 0.2),
    (["--cutmix", "0.5"], "data.cutmix", 0.5),
    (["--mixup-prob", "0.7"], "data.mixup_prob", 0.7),
    (["--smoothing", "0.2"], "loss.label_smoothing", 0.2),
    (["--aa", "rand-m7-mstd0.5"], "data.auto_augment", "rand-m7-mstd0.5"),
    (["--reprob", "0.1"], "data.reprob", 0.1),
    (["--remode", "const"], "data.remode", "const"),
    (["--recount", "2"], "data.recount", 2),
    (["--drop-path", "0.2"], "model.drop_path_rate", 0.2),
    (["--clip-grad", "1.5"], "train.clip_grad", 1.5),
    (["--model-ema"], "train.ema", True),
    (["--no-model-ema"], "train.ema", False),
    (["--model-ema-decay", "0.999"], "train.ema_decay", 0.999),
    (["--aug-repeats", "2"], "data.repeated_aug", 2),
    (["--repeated-aug"], "data.repeated_aug", 3),
    (["--no-repeated-aug"], "data.repeated_aug", 0),
    (["--amp", "bf16"], "train.amp", "bf16"),
    (["--amp"], "train.amp", "auto"),  # timm's bare --amp
    (["--amp-dtype", "float16"], "train.amp", "fp16"),
    (["-b", "32"], "train.batch_size", 32),
    (["--batch-size", "32"], "train.batch_size", 32),
    (["--data-path", "/d"], "data.dir", "/d"),
    (["--data_path", "/d"], "data.dir", "/d"),
    (["--data-dir", "/d"], "data.dir", "/d"),
    (["--num_workers", "3"], "data.num_workers", 3),
    (["-j", "3"], "data.num_workers", 3),
    (["--seed", "5"], "train.seed", 5),
    (["--drop", "0.1"], "model.drop_rate", 0.1),
    (["--img-size", "160"], "model.img_size", 160),
]


def _args(*argv: str):
    return build_parser().parse_args(["train", "--output", "x", *argv])


@pytest.mark.parametrize("argv,key,value", SPELLINGS, ids=[" ".join(a) for a, _, _ in SPELLINGS])
def test_each_spelling_sets_its_recipe_key(argv, key, value):
    assert training_overrides(_args(*argv)) == {key: value}


def test_input_size_as_timm_and_as_deit_and_the_output_dir_spellings():
    assert training_overrides(_args("--input-size", "3", "96", "96")) == {"model.in_chans": 3, "model.img_size": 96}
    assert training_overrides(_args("--input-size", "96")) == {"model.img_size": 96}  # DeiT: one int
    with pytest.raises(ValueError, match="give C H W"):
        training_overrides(_args("--input-size", "3", "96"))
    for flag in ("--output_dir", "--output-dir", "--output", "--out"):
        assert build_parser().parse_args(["train", flag, "runs/a"]).output == "runs/a"


def test_help_groups_the_spellings(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    group = " ".join(text[text.index("timm / DeiT spellings"):text.index("training options (")].split())
    for argv, _key, _ in SPELLINGS:
        assert argv[0] in group, argv[0]
    assert "--input-size" in group and "(= data.mixup_prob)" in group


@pytest.mark.parametrize("flag,value,key", [("--mixup-prob", "2", "data.mixup_prob"),
                                            ("--recount", "0", "data.recount"),
                                            ("--smoothing", "1.5", "loss.label_smoothing"),
                                            ("--sched", "plateau", "schedule.name"),
                                            ("--remode", "zeros", "data.remode")])
def test_a_bad_value_gives_the_same_one_line_error_as_set(flag, value, key, tmp_path, capsys):
    base = ["train", "--recipe", "fashion-mnist-quick", "--dry-run"]
    assert main([*base, "--output", str(tmp_path / "a"), flag, value]) == 2
    by_flag = capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "a"), "--set", f"{key}={value}"]) == 2
    assert capsys.readouterr().err == by_flag
    assert key in by_flag and "Traceback" not in by_flag


def test_erasing_modes_other_than_deits_need_the_per_image_transform(tmp_path):
    with pytest.raises(ValueError, match=r"set data.pipeline=timm \(or auto\) and data.batch_augment=false"):
        load_config("fashion-mnist-quick", {"data.remode": "const"})
    cfg = load_config("fashion-mnist-quick", {"data.remode": "const", "data.recount": 2, "data.pipeline": "timm",
                                              "data.batch_augment": False})
    from resmlp.preprocess import Preprocess

    transform = Preprocess(img_size=8, in_chans=1, mean=(0.5,), std=(0.5,)).train_transform(
        reprob=1.0, remode=cfg.data.remode, recount=cfg.data.recount)
    erasing = transform.transforms[-1]
    assert (erasing.mode, erasing.max_count) == ("const", 2)


def test_deit_and_timm_model_names_resolve_through_the_one_grammar():
    from resmlp.build import parse_model_name

    for name in ("resmlp_12", "resmlp_12_224"):
        assert str(parse_model_name(name)) == "resmlp_s12"
    assert str(parse_model_name("resmlpB_24")) == "resmlp_b24"
    assert str(parse_model_name("resmlp_big_24_224")) == "resmlp_b24"
    assert str(parse_model_name("timm:resmlp_12_224")) == "timm:resmlp_12_224"  # timm's own module stays timm's


def _tiny_imagenet(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for cls in ("n01440764", "n01443537"):
            (root / split / cls).mkdir(parents=True)
            for i in range(4):
                pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / cls / f"{i}.JPEG")
    return root


def test_deits_readme_command_resolves_to_the_deit_recipe(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("resmlp.runtime.physical_memory_bytes", lambda: 2**40)
    data = _tiny_imagenet(tmp_path / "imagenet")
    # DeiT's README: python -m torch.distributed.launch --nproc_per_node=4 --use_env main.py --model
    # deit_base_patch16_224 --batch-size 64 --data-path /path/to/imagenet --output_dir /path/to/save
    argv = ["--model", "resmlp_12", "--batch-size", "64", "--data-path", str(data), "--output_dir",
            str(tmp_path / "save")]
    args = build_parser().parse_args(["train", *argv])
    resolved = load_config(recipe_for(args), training_overrides(args), False).to_dict()
    expected = load_config("deit", {"train.batch_size": 64, "data.dir": str(data)}, False).to_dict()
    assert resolved == expected  # the recipe's values, the model as resmlp_s12, what the command set
    assert resolved["model"]["name"] == "resmlp_s12" and resolved["schedule"]["step_on"] == "epoch"
    assert main(["train", *argv, "--dry-run"]) == 0
    out = capsys.readouterr()
    assert "recipe deit" in out.err and "name: resmlp_s12" in out.out


def test_timms_command_trains_on_tiny_data(tmp_path, capsys):
    data = _tiny_imagenet(tmp_path / "imagenet")
    out = tmp_path / "output"
    # timm's train.py: DATA_DIR positional, timm's spellings; tiny sizes so that one epoch runs in seconds
    argv = [str(data), "--model", "resmlp_12_224", "-b", "4", "--sched", "cosine", "--epochs", "1", "--opt", "lamb",
            "--lr", "5e-3", "--weight-decay", "0.2", "--warmup-epochs", "0", "--warmup-lr", "1e-6", "--min-lr",
            "1e-5", "--aa", "rand-m9-mstd0.5-inc1", "--mixup", "0.8", "--cutmix", "1.0", "--mixup-prob", "1.0",
            "--smoothing", "0.1", "--reprob", "0.25", "--remode", "pixel", "--recount", "1", "--drop-path", "0.05",
            "--aug-repeats", "3", "--model-ema", "--model-ema-decay", "0.99", "--img-size", "32", "-j", "0",
            "--output", str(out)]
    assert main(["train", *argv]) == 0
    capsys.readouterr()
    written = json.loads((out / "config.json").read_text())
    expected = load_config("deit", {
        "data.dir": str(data), "model.img_size": 32, "train.batch_size": 4, "schedule.epochs": 1,
        "schedule.warmup_epochs": 0, "train.ema": True, "train.ema_decay": 0.99, "data.num_workers": 0}, False)
    assert written == json.loads(json.dumps(expected.to_dict()))
    assert (out / "best.safetensors").is_file() and (out / "summary.json").is_file()

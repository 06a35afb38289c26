"""Every end of every run path: each task (supervised, distillation, DINO, fine-tuning) on each kind of data
(in memory; an ImageNet-layout folder with train/ and val/ only; a folder with train/, val/ and test/; a folder
with train/ only) ends with its summary printed and summary.json written, through the CLI, on the CPU.

A dataset without a test split (ImageNet has no public test labels) must end like the others: the test keys
None and the printed summary saying there was no test split, never a traceback at the very end of a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import resmlp
from resmlp.cli import main

CLASSES = ("ant", "bee")
# tiny runs: 2 classes of 16x16 RGB, 16 training images, batch 8 (2 steps), 1 epoch, no augmentation cost
COMMON = {
    "data.num_workers": 0, "data.crop_pct": 1.0, "data.hflip": 0.0, "data.scale": [1.0, 1.0],
    "data.ratio": [1.0, 1.0], "model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1,
    "model.in_chans": 3, "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 8,
    "train.progress": False, "train.threads": 1, "train.compile": False, "train.amp": "none",
    "data.mean": [0.5, 0.5, 0.5], "data.std": [0.25, 0.25, 0.25],
}
DINO = {"dino.out_dim": 16, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 1,
        "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0, "dino.knn_k": 3}
# the folders: which splits each holds (sizes per class); "train-only" carves its validation from train
FOLDERS = {"imagenet-layout": {"train": 8, "val": 4}, "with-test": {"train": 8, "val": 4, "test": 4},
           "train-only": {"train": 10}}
DATA_KINDS = ("synthetic", *FOLDERS)
HAS_TEST = {"synthetic": True, "imagenet-layout": False, "with-test": True, "train-only": False}
TASKS = ("supervised", "distill", "dino", "finetune")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """The image folders (JPEG, as ImageNet ships) and a tiny checkpoint used as teacher and fine-tuning source."""
    root = tmp_path_factory.mktemp("run_paths")
    rng = np.random.default_rng(0)
    for name, splits in FOLDERS.items():
        for split, per_class in splits.items():
            for label, cls in enumerate(CLASSES):
                folder = root / name / split / cls
                folder.mkdir(parents=True)
                for i in range(per_class):  # a class-dependent mean: learnable, so the scores are not all equal
                    pixels = rng.normal(80 + 100 * label, 30, (20, 24, 3)).clip(0, 255).astype(np.uint8)
                    Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, in_chans=3, num_classes=len(CLASSES),
                                dim=16, depth=1)
    resmlp.save(model, root / "tiny.safetensors")
    return root


def data_overrides(kind: str, root: Path) -> dict:
    if kind == "synthetic":
        return {"data.kind": "synthetic", "data.synthetic_size": [16, 8], "data.synthetic_classes": len(CLASSES)}
    extra = {"data.val_size": 4} if kind == "train-only" else {}
    return {"data.kind": "folder", "data.dir": str(root / kind), **extra}


def command(task: str, root: Path, out: Path) -> list[str]:
    checkpoint = str(root / "tiny.safetensors")
    return {"supervised": ["train", "--recipe", "fashion-mnist-quick"],
            "distill": ["train", "--recipe", "fashion-mnist-quick", "--distill", checkpoint,
                        "--teacher-classes-match"],  # the tiny teacher records no class names
            "dino": ["pretrain", "dino"],
            "finetune": ["finetune", checkpoint, "--recipe", "fashion-mnist-quick"]}[task] + ["--output", str(out)]


@pytest.mark.parametrize("kind", DATA_KINDS)
@pytest.mark.parametrize("task", TASKS)
def test_every_task_ends_with_its_summary_on_every_kind_of_data(workspace, tmp_path, capsys, task, kind):
    overrides = {**COMMON, **data_overrides(kind, workspace), **(DINO if task == "dino" else {})}
    if task == "finetune":  # the architecture comes from the checkpoint
        overrides = {k: v for k, v in overrides.items() if not k.startswith("model.")}
    out = tmp_path / "run"
    sets = [f"--set={key}={json.dumps(value)}" for key, value in overrides.items()]
    code = main(command(task, workspace, out) + sets)
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert "Traceback" not in printed.err

    summary = json.loads((out / "summary.json").read_text())
    assert summary["epochs"] == 1 and Path(summary["checkpoint"]).is_file()
    assert summary["task"] == {"supervised": "supervised", "distill": "distillation", "dino": "dino",
                               "finetune": "finetune"}[task]
    if task == "dino":
        score, test_keys = "knn_top1", ("test_knn_top1", "final_test_knn_top1")
        closing = "k-NN top-1"
    else:
        score, test_keys = "val_top1", ("test_top1", "final_test_top1")
        closing = "best checkpoint:"
        assert summary["test_top5"] is None and summary["val_top5"] is None  # 5 classes or fewer: no top-5
    assert 0 <= summary[score] <= 100
    for key in test_keys:  # present either way: None says "no test split", a number is the score
        assert key in summary
        assert (summary[key] is not None) == HAS_TEST[kind], f"{key}={summary[key]!r} on {kind}"
    assert closing in printed.out and f"{out}/summary.json" in printed.out
    if not HAS_TEST[kind]:
        assert "no test split" in printed.out
    if task == "distill":
        assert summary["teacher"]["spec"] == str(workspace / "tiny.safetensors")
    if kind == "train-only":
        assert "carved from train" in summary["validation"]


def test_a_folder_without_val_and_no_split_to_carve_is_one_line(workspace, tmp_path, capsys):
    sets = [f"--set={k}={json.dumps(v)}" for k, v in {**COMMON, **data_overrides("train-only", workspace),
                                                       "data.val_size": 0}.items()]
    assert main(["train", "--output", str(tmp_path / "run"), *sets]) == 2
    err = capsys.readouterr().err
    assert "has no val/ folder" in err and "data.val_size" in err and "Traceback" not in err


def test_the_authors_recipe_on_an_imagenet_layout_folder_ends_with_its_summary(tmp_path, capsys):
    """The issue's case: `resmlp train --recipe deit` on train/ + val/ (no test/) trained, then crashed printing."""
    rng = np.random.default_rng(1)
    for split, per_class in (("train", 128), ("val", 4)):  # 256: timm's repeated-augmentation sampler's unit
        for label, cls in enumerate(CLASSES):
            (tmp_path / "data" / split / cls).mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.normal(80 + 100 * label, 30, (12, 12, 3)).clip(0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / cls / f"{i}.jpg")
    tiny = {"model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1, "train.batch_size": 64,
            "data.num_workers": 0, "train.progress": False, "train.threads": 1, "schedule.warmup_epochs": 0}
    out = tmp_path / "run"
    code = main(["train", "--recipe", "deit", "--data-dir", str(tmp_path / "data"), "--output", str(out), "--epochs",
                 "1", *(f"--set={key}={json.dumps(value)}" for key, value in tiny.items())])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-2000:]
    assert "no test split" in printed.out and "best checkpoint:" in printed.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["test_top1"] is None and summary["final_test_top1"] is None and summary["recipe"] == "deit"

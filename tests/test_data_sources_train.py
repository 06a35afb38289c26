"""`resmlp train --recipe deit` (tiny) from every source: an ImageNet folder with the raw val layout, shards
written by `resmlp data shards`, a local Hugging Face dataset map-style and streamed; on two gloo processes,
and killed mid-epoch then resumed to the uninterrupted run's weights. Then eval, k-NN and fine-tuning read
the same sources."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hostspeed import limit
from PIL import Image
from safetensors.torch import load_file

from resmlp.cli import main

TINY = {
    "data.num_workers": 0, "data.crop_pct": 1.0, "data.hflip": 0.5, "data.scale": [0.6, 1.0],
    "data.ratio": [1.0, 1.0], "model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1,
    "model.in_chans": 3, "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 8,
    "train.progress": False, "train.threads": 1, "train.compile": False, "train.amp": "none",
    "data.mean": [0.5, 0.5, 0.5], "data.std": [0.25, 0.25, 0.25], "train.device": "cpu",
    "data.pipeline": "device",  # the recipe's auto would measure; runs compared here take one path
}
CLASSES = ("n01", "n02")


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """The same 32 training and 8 validation images in each storage form; the value is --data."""
    import datasets  # the data extra: CI installs it, so this never skips
    root = tmp_path_factory.mktemp("sources")
    rng = np.random.default_rng(0)
    images = {split: [(rng.normal(80 + 100 * (i % 2), 30, (20, 24, 3)).clip(0, 255).astype(np.uint8), i % 2)
                      for i in range(n)] for split, n in (("train", 32), ("val", 8))}
    for i, (pixels, label) in enumerate(images["train"]):
        (root / "folder" / "train" / CLASSES[label]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / "folder" / "train" / CLASSES[label] / f"{i}.JPEG", format="JPEG")
    (root / "folder" / "val").mkdir()
    for i, (pixels, _) in enumerate(images["val"]):
        Image.fromarray(pixels).save(root / "folder" / "val" / f"ILSVRC2012_val_{i:08d}.JPEG", format="JPEG")
    (root / "folder" / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(
        f"ILSVRC2012_val_{i:08d},{CLASSES[label]} 0 0 1 1\n" for i, (_, label) in enumerate(images["val"])))
    assert main(["data", "shards", f"folder:{root / 'folder'}", str(root / "shards"), "--shard-records", "4"]) == 0
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=list(CLASSES))})
    datasets.DatasetDict({split: datasets.Dataset.from_dict(
        {"image": [Image.fromarray(p) for p, _ in rows], "label": [lb for _, lb in rows]}, features=features)
        for split, rows in (("train", images["train"]), ("validation", images["val"]))}).save_to_disk(root / "hf")
    return {"raw-val folder": f"folder:{root / 'folder'}", "shards": f"wds:{root / 'shards'}",
            "hf": f"hf:{root / 'hf'}", "hf streamed": f"hf:{root / 'hf'}"}


def _overrides(name: str, sources: dict[str, str], **extra) -> dict:
    return {**TINY, "data.source": sources[name], "data.kind": "folder", "data.streaming": name == "hf streamed",
            **extra}


def _sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


@pytest.mark.parametrize("name", ["raw-val folder", "shards", "hf streamed"])
def test_the_deit_recipe_trains_on_two_gloo_processes(sources, tmp_path, name):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    ddp = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train", "--recipe", "deit",
                          "--output", str(tmp_path / "ddp"), *_sets(_overrides(name, sources))],
                         capture_output=True, text=True, timeout=limit(300))
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2
    # the recipe's device pipeline, streams included: the workers only read; JPEGs (the folder's, the shards')
    # are decoded by decode_jpeg, the PNGs `datasets` stores images as by PIL in the workers
    pipeline = summary["data_pipeline"]
    assert pipeline["name"] == "device" and pipeline["decoded_on_device"] + pipeline["pil_fallback"] > 0
    assert (pipeline["decoded_on_device"] > 0) == (name != "hf streamed")
    rows = list(csv.DictReader((tmp_path / "ddp" / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 2 and all(r["skipped_train_images"] == r["skipped_val_images"] == "0" for r in rows)


KILLED_CHILD = """
import json, os, signal, sys
from resmlp.train import train
from resmlp.train.config import load_config
from resmlp.train.tasks import SupervisedTask
class KillAtStepSix(SupervisedTask):
    def build_loss(self, trainer, num_classes):
        inner, calls = super().build_loss(trainer, num_classes), {"n": 0}
        def loss_fn(model, images, targets):
            calls["n"] += 1
            if calls["n"] == 6:
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(model, images, targets)
        return loss_fn
cfg = load_config("deit", json.loads(sys.argv[2]))
train(cfg, sys.argv[1], task=KillAtStepSix(cfg))
"""


@pytest.mark.parametrize("name", ["shards", "hf streamed"])  # map-style sources resume by ResumableSampler
def test_kill_mid_epoch_then_resume_gives_the_uninterrupted_weights(sources, tmp_path, name):
    """Killed at step 6 (epoch 2 of 4-step epochs), after the checkpoint of step 5: the resumed run skips
    exactly the records it trained on, with the same augmentation."""
    overrides = _overrides(name, sources, **{"train.deterministic": True, "train.checkpoint_every_steps": 1})
    killed = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(tmp_path / "killed"), json.dumps(overrides)],
                            capture_output=True, text=True, timeout=limit(300))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    other_layout = {**overrides, "data.num_workers": 1}  # the position counts batches of 0 workers' layout
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "killed"), "--resume",
                 *_sets(other_layout)]) == 2
    for run, resume in (("killed", ["--resume"]), ("straight", [])):
        assert main(["train", "--recipe", "deit", "--output", str(tmp_path / run), *resume, *_sets(overrides)]) == 0
    a, b = load_file(tmp_path / "killed" / "last.safetensors"), load_file(tmp_path / "straight" / "last.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["raw-val folder", "shards", "hf", "hf streamed"])
def test_eval_knn_and_finetune_read_every_source(sources, tmp_path, name, capsys):
    overrides = _overrides(name, sources, **{"schedule.epochs": 1, "data.repeated_aug": 0})
    assert main(["train", "--output", str(tmp_path / "run"), "--recipe", "deit", *_sets(overrides)]) == 0
    assert main(["eval", str(tmp_path / "run"), "--output", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["images"] == 8
    capsys.readouterr()
    assert main(["eval-knn", str(tmp_path / "run"), "--data", sources[name], "--k", "3"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["test_images"] == 8
    finetune = {k: v for k, v in overrides.items() if not k.startswith("model.")}
    assert main(["finetune", str(tmp_path / "run" / "best.safetensors"), "--recipe", "deit", "--output",
                 str(tmp_path / "ft"), *_sets(finetune)]) == 0


@pytest.mark.parametrize("name", ["shards", "hf streamed"])
def test_dino_pretrains_from_a_stream_with_its_knn_monitor(sources, tmp_path, name, capsys):
    dino = {"dino.out_dim": 16, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 1,
            "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0, "dino.knn_k": 3, "schedule.epochs": 1,
            "data.num_workers": 2}
    assert main(["pretrain", "dino", "--recipe", "dino-imagenet", "--output", str(tmp_path / "dino"),
                 *_sets(_overrides(name, sources, **dino))]) == 0
    rows = list(csv.DictReader((tmp_path / "dino" / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 1 and 0 <= float(rows[0]["knn_top1"]) <= 100 and rows[0]["skipped_train_images"] == "0"

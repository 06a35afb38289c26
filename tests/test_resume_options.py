"""`resmlp train --resume` (and finetune's) with an option that differs from the run's config (issue 44, item 4):
refused, naming the key with its old and new value; one test per option. The changes a resume allows
(--epochs to extend, --lr, --device, --workers, --threads, --data-dir, --no-progress) are in
tests/test_resume_cli.py and train.state.RESUMABLE_CHANGES."""

from __future__ import annotations

import json
import shutil

import pytest

import resmlp
from resmlp.cli import main

TINY = {"data.kind": "synthetic", "data.synthetic_size": [32, 16], "data.num_workers": 0, "data.crop_pct": 1.0,
        "train.batch_size": 8, "train.progress": False, "train.threads": 1, "train.compile": False,
        "schedule.warmup_epochs": 0, "train.amp": "none", "optim.lr": 2e-3}
MODEL = {"model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 2}


def _sets(values: dict) -> list[str]:
    return [f"--set={key}={json.dumps(value)}" for key, value in values.items()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("resume") / "run"
    assert main(["train", "--output", str(run), "--epochs", "1", *_sets({**TINY, **MODEL})]) == 0
    return run


@pytest.mark.parametrize("flags, change", [
    (["--model", "resmlp_s24"], "model.name: was 'resmlp_s12', now 'resmlp_s24'"),
    (["--batch-size", "16"], "train.batch_size: was 8, now 16"),
    (["--warmup-epochs", "0.5"], "schedule.warmup_epochs: was 0.0, now 0.5"),
    (["--opt", "sgd"], "optim.name: was 'adamw', now 'sgd'"),
    (["--weight-decay", "0.1"], "optim.weight_decay: was 0.05, now 0.1"),
    (["--drop-path", "0.2"], "model.drop_path_rate: was None, now 0.2"),
    (["--model-ema"], "train.ema: was False, now True"),
    (["--amp", "bf16"], "train.amp: was 'none', now 'bf16'"),
    (["--input-size", "3", "16", "16"], "model.in_chans: was 1, now 3"),
    (["--recipe", "fashion-mnist-quick"], "data.kind: was 'synthetic', now 'fashion-mnist'"),
    (["--set", "train.seed=5"], "train.seed: was 0, now 5"),
    (["--distill", "timm:test_resnet", "--allow-random-teacher"], "distill.teacher: was None, now 'timm:test_resnet'"),
    (["--distill-type", "soft"], "distill.type: was 'hard', now 'soft'"),
    (["--distill-alpha", "0.3"], "distill.alpha: was 0.5, now 0.3"),
    (["--distill-tau", "2"], "distill.tau: was 1.0, now 2.0"),
    (["--distill-cache"], "distill.cache: was False, now True"),
    (["--teacher-weights", "t.pth"], "distill.weights: was None, now 't.pth'"),
])
def test_train_resume_refuses_an_option_that_differs(tmp_path, capsys, trained, flags, change):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = (run / "last.pth").read_bytes()
    capsys.readouterr()
    assert main(["train", "--output", str(run), "--resume", *flags]) == 2
    err = capsys.readouterr().err
    assert change in err and "Traceback" not in err
    assert (run / "last.pth").read_bytes() == before  # nothing trained


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("finetune")
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, dim=16, depth=2, num_classes=3, in_chans=1)
    for name in ("start", "other"):
        resmlp.save(model, root / f"{name}.safetensors")
    run = root / "run"
    assert main(["finetune", str(root / "start.safetensors"), "--output", str(run), "--epochs", "1",
                 "--freeze", "1", *_sets(TINY)]) == 0
    return root


def test_finetune_resume_alone_keeps_the_runs_own_options(tmp_path, finetuned):
    """Was refused: the --freeze not given again became None ('finetune.freeze: was 1, now None')."""
    run = tmp_path / "run"
    shutil.copytree(finetuned / "run", run)
    assert main(["finetune", str(finetuned / "start.safetensors"), "--output", str(run), "--resume",
                 "--epochs", "2"]) == 0
    assert json.loads((run / "config.json").read_text())["finetune"]["freeze"] == 1


@pytest.mark.parametrize("flags, change", [
    (["--freeze", "all-but-head"], "finetune.freeze: was 1, now 'all-but-head'"),
    (["--img-size", "32"], "finetune.img_size: was None, now 32"),
    (["--layer-decay", "0.5"], "optim.layer_decay: was None, now 0.5"),
    (["--batch-size", "16"], "train.batch_size: was 8, now 16"),
    (["other"], "model.name: was"),
])
def test_finetune_resume_refuses_an_option_that_differs(tmp_path, capsys, finetuned, flags, change):
    run = tmp_path / "run"
    shutil.copytree(finetuned / "run", run)
    checkpoint = finetuned / ("other.safetensors" if flags == ["other"] else "start.safetensors")
    flags = [] if flags == ["other"] else flags
    capsys.readouterr()
    assert main(["finetune", str(checkpoint), "--output", str(run), "--resume", *flags]) == 2
    err = capsys.readouterr().err
    assert change in err and "Traceback" not in err

"""Kill -9 mid-epoch and resume for the other paradigms on the trainer: fine-tuning and DINO end with exactly
the weights of an uninterrupted run, as plain training does (tests/test_train_resume.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import torch
from hostspeed import limit
from safetensors.torch import load_file

import resmlp
from resmlp.train import finetune, pretrain_dino

COMMON = {
    "data.kind": "synthetic", "data.num_workers": 0, "data.crop_pct": 1.0, "data.synthetic_size": [64, 16],
    "data.hflip": 0.5, "schedule.epochs": 2, "schedule.warmup_epochs": 0.5, "train.batch_size": 16,
    "train.progress": False, "train.threads": 1, "train.deterministic": True, "train.checkpoint_every_steps": 2,
    "train.amp": "none",
}
DINO = {**COMMON, "model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 2,
        "optim.lr": 1e-3, "dino.out_dim": 32, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 2,
        "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0}
# the child runs the front door with every task's loss wrapped: SIGKILL during step 7 (epoch 2, step 3 of 4),
# after the checkpoint of step 6 was written, like a crash or an OOM kill mid-epoch
KILLED_CHILD = """
import json, os, signal, sys
from resmlp.train import run
make_task = run.task_for
def killing_task(cfg):
    task, calls = make_task(cfg), {"n": 0}
    build = task.build_loss
    def build_loss(trainer, num_classes):
        inner = build(trainer, num_classes)
        def loss_fn(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 7:
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(*args, **kwargs)
        return loss_fn
    task.build_loss = build_loss
    return task
run.task_for = killing_task
paradigm, out, overrides, checkpoint = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
if paradigm == "finetune":
    run.finetune(checkpoint, "fashion-mnist-quick", out, overrides)
else:
    run.pretrain_dino("dino-fashion-mnist", out, overrides)
"""


@pytest.mark.parametrize("paradigm", ["finetune", "dino"])
def test_sigkill_mid_epoch_then_resume_gives_identical_weights(tmp_path, paradigm):
    checkpoint = tmp_path / "source.safetensors"
    torch.manual_seed(0)
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16,
                                    depth=2), checkpoint)
    overrides = COMMON if paradigm == "finetune" else DINO
    killed = subprocess.run([sys.executable, "-c", KILLED_CHILD, paradigm, str(tmp_path / "killed"),
                             json.dumps(overrides), str(checkpoint)], capture_output=True, text=True,
                            timeout=limit(300))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    state = torch.load(tmp_path / "killed" / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (1, 2, 6)

    # resumed and uninterrupted, in this process (the CLI's --resume is the same call: tests/test_train_resume.py)
    for out, resume in (("killed", True), ("straight", False)):
        if paradigm == "finetune":
            finetune(checkpoint, "fashion-mnist-quick", tmp_path / out, overrides, resume=resume)
        else:
            pretrain_dino("dino-fashion-mnist", tmp_path / out, overrides, resume=resume)

    for name in ("last.safetensors", "best.safetensors"):
        a, b = load_file(tmp_path / "killed" / name), load_file(tmp_path / "straight" / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}:{key} differs after resume"


# `resmlp translate train` has its own loop: the same kill, during step 10 (its checkpoint of step 8 written)
KILLED_TRANSLATION = """
import json, os, signal, sys
from resmlp.seq2seq import train
step, calls = train._optimizer_step, {"n": 0}
def killing_step(*args, **kwargs):
    calls["n"] += 1
    if calls["n"] == 10:
        os.kill(os.getpid(), signal.SIGKILL)
    return step(*args, **kwargs)
train._optimizer_step = killing_step
train.train_translation(train.TranslationConfig(**json.loads(sys.argv[1])))
"""


def test_translate_train_killed_then_resumed_gives_identical_weights(tmp_path):
    from num2words import num2words

    from resmlp.seq2seq.train import CHECKPOINT, TranslationConfig, train_translation

    for split, numbers in {"train": range(0, 200), "valid": range(200, 210), "test": range(210, 220)}.items():
        (tmp_path / f"{split}.en").write_text("".join(num2words(n) + "\n" for n in numbers), encoding="utf-8")
        (tmp_path / f"{split}.fr").write_text("".join(num2words(n, lang="fr") + "\n" for n in numbers),
                                              encoding="utf-8")
    config = dict(data=str(tmp_path), src_suffix="en", tgt_suffix="fr", preset="tiny", vocab_size=120,
                  max_tokens=256, optimizer="adam", lr=3e-3, warmup_steps=2, max_steps=16, eval_every=4,
                  log_every=1, beam=1, threads=1, progress=False, device="cpu",
                  model_overrides={"max_len": 24, "dropout": 0.1})
    killed_out, straight_out = tmp_path / "killed", tmp_path / "straight"
    child = [sys.executable, "-c", KILLED_TRANSLATION, json.dumps({**config, "output": str(killed_out)})]
    killed = subprocess.run(child, capture_output=True, text=True, timeout=limit(300))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    state = torch.load(killed_out / CHECKPOINT, weights_only=True)
    assert state["step"] == 8 and state["batch_in_epoch"] > 0  # resumed mid-epoch, not at its start

    train_translation(TranslationConfig(**config, output=str(killed_out)), resume=True)
    train_translation(TranslationConfig(**config, output=str(straight_out)))
    a = torch.load(killed_out / CHECKPOINT, weights_only=True)
    b = torch.load(straight_out / CHECKPOINT, weights_only=True)
    assert a["step"] == b["step"] == 16
    for key in b["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), f"{key} differs after resume"
    logged = [line.split(",")[0] for line in (killed_out / "log.csv").read_text().splitlines()[1:]]
    assert logged == [str(s) for s in range(1, 17)]  # the steps logged after step 8 by the killed run: once

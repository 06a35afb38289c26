"""The GPU paths run on every CPU host: the real commands with `device=cuda` under fake CUDA tensors
(tests/fakecuda.py), failing on a device mismatch, a CPU tensor written from a CUDA one, a host wait inside a
training step, or a result left off the device. What this proves and what it cannot: docs/gpu.md.

A training step may wait for the host only at the intended places: the read per log interval
(`Trainer._read`), a mid-epoch checkpoint (`Trainer._save_state`), `train.compile: auto` timing its eager steps
(`CompileChoice.after_step`), and fp16's GradScaler (torch's own read of found_inf). A one-time copy (the
in-memory dataset and the normalisation statistics going to the GPU at the first step) is allowed; anything
that happens again at a later step or epoch is a per-step wait and fails the test.
"""

from __future__ import annotations

import json
import math
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from fakecuda import HostWriteFromDevice, Ledger, fake_cuda, is_fake_cuda
from test_data import write_idx
from test_train_device_loop import guarded_step
from timm.optim import create_optimizer_v2

import resmlp
from resmlp.cli import main
from resmlp.train.step import RunningTotals, UpdateGuard, optimizer_options

# tiny runs: 32 training images, batch 8 -> 4 steps an epoch, 2 epochs (a per-epoch copy shows twice)
COMMON = {
    "data.kind": "synthetic", "data.synthetic_size": [32, 8], "data.synthetic_classes": 4, "data.num_workers": 0,
    "data.crop_pct": 1.0, "data.scale": [0.6, 1.0], "data.hflip": 0.5, "model.img_size": 16,
    "model.patch_size": 8, "model.dim": 16, "model.depth": 2, "schedule.epochs": 2, "schedule.warmup_epochs": 0,
    "train.batch_size": 8, "train.progress": False, "train.threads": 1, "train.compile": False,
    "train.amp": "bf16", "train.device": "cuda", "train.log_every_steps": 2,
}
DINO = {"dino.out_dim": 16, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 1,
        "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0, "dino.knn_k": 3}
IN_STEP = ("Trainer._train_epoch",)
INTENDED = ("Trainer._read", "Trainer._save_state", "CompileChoice.after_step", "GradScaler.step",
            "GradScaler.update", "GradScaler._maybe_opt_step")


def repeated_waits(ledger: Ledger, allowed: tuple[str, ...] = ()) -> dict[str, int]:
    """Host waits inside training steps that happen more than once (per step or per epoch), by site."""
    events = ledger.inside(*IN_STEP, allowed=INTENDED + allowed)
    counts = Counter(f"{e.kind} at {e.site()} ({e.what})" for e in events)
    return {site: n for site, n in counts.items() if n > 1}


def run_cli(argv: list[str], overrides: dict, capsys) -> Ledger:
    sets = [f"--set={key}={json.dumps(value)}" for key, value in overrides.items()]
    with fake_cuda() as ledger:
        code = main(argv + sets)
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    return ledger


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("fake_cuda") / "tiny.safetensors"
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, in_chans=1, num_classes=4, dim=16, depth=2)
    resmlp.save(model, path)
    return path


# ------------------------------------------------------------------------------------------ the trainer
@pytest.mark.parametrize("optimizer", ["adamw", "lamb", "sgd"])
def test_every_optimizer_trains_on_the_gpu_without_a_host_wait_per_step(tmp_path, capsys, optimizer):
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "run")],
                     {**COMMON, "optim.name": optimizer, "train.ema": True}, capsys)
    assert repeated_waits(ledger) == {}
    reads = [e for e in ledger.inside(*IN_STEP) if e.kind == "read"]
    assert [e.site().split(":")[1] for e in reads] == ["RunningTotals.read"] * 4  # 2 per epoch: every 2nd step


@pytest.mark.parametrize("setting", [
    {"train.amp": "fp16"},
    {"train.grad_accum": 2},
    {"train.channels_last": True},
    {"train.checkpoint_every_steps": 3},
    {"train.checkpoint_hist": 1},  # the N best checkpoints: written at the epoch's end, never within a step
    {"train.compile": "auto"},  # up to its decision: too short a run to compile
    {"data.batch_augment": False},  # the DataLoader path: pinned batches, the side-stream prefetch
    {"train.clip_grad": 1.0},  # one global norm (torch's clip_grad_norm_)
    {"train.clip_mode": "per_param", "train.clip_grad": 1.0},  # DINO's per-parameter clipping, foreach on device
    {"train.amp": "fp16", "train.clip_grad": 1.0},  # unscaled by the GradScaler, then clipped (issue 49)
], ids=lambda s: next(iter(s)))
def test_every_step_option_keeps_the_step_free_of_host_waits(tmp_path, capsys, setting):
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "run")],
                     {**COMMON, "optim.name": "adamw", **setting}, capsys)
    assert repeated_waits(ledger) == {}
    if "train.compile" in setting:
        assert [e.kind for e in ledger.inside("CompileChoice.after_step")] == ["synchronize"] * 2


def test_rgb_images_train_a_grey_model_and_grey_images_an_rgb_one(tmp_path, capsys):
    """CIFAR's RGB arrays into a 1-channel model (luminance on the GPU) and Fashion-MNIST's grey arrays into
    a 3-channel one, both kept on the device and augmented there."""
    rng = np.random.default_rng(0)
    cifar = tmp_path / "cifar" / "cifar-10-batches-py"
    cifar.mkdir(parents=True)
    with open(cifar / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(cifar / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8), b"labels": list(range(8))}, f)
    fmnist = tmp_path / "fmnist"
    fmnist.mkdir()
    for split, n in (("train", 40), ("t10k", 8)):
        write_idx(fmnist / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 16, 16), dtype=np.uint8), True)
        write_idx(fmnist / f"{split}-labels-idx1-ubyte.gz", (np.arange(n) % 4).astype(np.uint8), True)
    base = {k: v for k, v in COMMON.items() if not k.startswith("data.synthetic")}
    runs = {"grey-from-rgb": {**base, "data.kind": "cifar10", "data.dir": str(tmp_path / "cifar"),
                              "model.in_chans": 1, "model.img_size": 32, "data.val_size": 8,
                              "data.mean": [0.5], "data.std": [0.25]},
            "rgb-from-grey": {**base, "data.kind": "fashion-mnist", "data.dir": str(fmnist), "model.in_chans": 3,
                              "data.val_size": 8, "data.mean": [0.5] * 3, "data.std": [0.25] * 3}}
    for name, overrides in runs.items():
        ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / name)],
                         overrides, capsys)
        assert repeated_waits(ledger) == {}, name


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_distillation_steps_do_not_wait_for_the_host(tmp_path, capsys, tiny_checkpoint, kind):
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--distill", str(tiny_checkpoint),
                      "--output", str(tmp_path / "run")],
                     {**COMMON, "distill.type": kind, "distill.classes_match": True}, capsys)
    assert repeated_waits(ledger) == {}


def test_the_distillation_cache_is_the_documented_host_wait(tmp_path, capsys, tiny_checkpoint):
    fixed = {**COMMON, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0], "distill.classes_match": True}
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--distill", str(tiny_checkpoint),
                      "--distill-cache", "--output", str(tmp_path / "run")], fixed, capsys)
    assert repeated_waits(ledger, allowed=("DistillationLoss.teacher_logits",)) == {}
    assert repeated_waits(ledger)  # the cache's own copies, every step (help and docs say so)


def test_a_teacher_of_another_resolution_is_fed_on_the_device_without_host_waits(tmp_path, capsys):
    teacher = resmlp.create_model("resmlp_s12", img_size=24, patch_size=8, in_chans=1, num_classes=4, dim=16,
                                  depth=2)
    path = tmp_path / "teacher24.safetensors"
    resmlp.save(teacher, path, metadata={"class_names": [f"class_{i}" for i in range(4)], "preprocess": dict(
        img_size=24, in_chans=1, mean=[0.3], std=[0.2], crop_pct=1.0, interpolation="bilinear")})
    ledger = run_cli(["train", "--recipe", "fashion-mnist-quick", "--distill", str(path), "--output",
                      str(tmp_path / "run")], COMMON, capsys)
    assert repeated_waits(ledger) == {}


def test_dino_steps_do_not_wait_for_the_host(tmp_path, capsys):
    ledger = run_cli(["pretrain", "dino", "--output", str(tmp_path / "run")],
                     {**COMMON, **DINO, "model.in_chans": 1}, capsys)
    assert repeated_waits(ledger) == {}


def test_finetuning_with_frozen_blocks_and_layer_decay_does_not_wait(tmp_path, capsys, tiny_checkpoint):
    overrides = {k: v for k, v in COMMON.items() if not k.startswith("model.")}
    ledger = run_cli(["finetune", str(tiny_checkpoint), "--recipe", "fashion-mnist-quick",
                      "--output", str(tmp_path / "run")],
                     {**overrides, "finetune.freeze": 1, "optim.layer_decay": 0.75}, capsys)
    assert repeated_waits(ledger) == {}


# ------------------------------------------------------------------------------------------ the guard
@pytest.mark.parametrize("opt", ["adamw", "lamb", "momentum"])
def test_a_non_finite_step_on_the_gpu_is_undone_without_a_host_read(opt):
    """Parameters, moments and step counters as before the NaN step; LAMB's host-side counters at the read."""
    device = torch.device("cuda")
    with fake_cuda() as ledger:
        model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 2)).to(device)
        optimizer = create_optimizer_v2(model, opt=opt, lr=0.1, weight_decay=0.05, momentum=0.9,
                                        **optimizer_options(opt, torch.device("cuda", 0)))
        guard, totals = UpdateGuard(model, optimizer, device), RunningTotals(torch.device("cuda", 0))
        for step, scale in enumerate([1.0, math.nan]):
            totals.add(*guarded_step(model, optimizer, guard, torch.randn(4, 6, device=device), scale), step)
        assert [e for e in ledger.events if e.kind != "unpinned-host-to-device"] == []  # no read, no copy back
        assert all(is_fake_cuda(p) for p in model.parameters())
        state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        assert all(is_fake_cuda(v) for v in state)  # AdamW's step counters too (capturable)
        host = guard.host_counters()
        assert len(host) == (2 if opt == "lamb" else 0)  # LAMB's per-group counters stay on the host
        counts = [float(c) for c in host]
        guard.undo_host_counters(1)
        assert [float(c) for c in host] == [c - 1 for c in counts]


def test_the_old_guard_wrote_a_host_counter_from_the_device():
    """What crashed every AdamW run on a GPU: the verdict (on the GPU) restoring AdamW's CPU step counter."""
    with fake_cuda():
        ok = torch.ones((), dtype=torch.bool, device="cuda")
        step = torch.zeros(())
        with pytest.raises(HostWriteFromDevice):
            torch.where(ok, step, step.clone(), out=step)


# ------------------------------------------------------------------------------------------ step components
def test_the_dino_centre_update_copies_nothing_from_the_host():
    from resmlp.train.dino import DINOLoss

    with fake_cuda() as ledger:
        loss_fn = DINOLoss(out_dim=8, num_crops=3).to("cuda")
        ledger.clear()
        for _ in range(2):
            loss_fn(torch.randn(12, 8, device="cuda"), torch.randn(8, 8, device="cuda"), epoch=0)
    assert ledger.events == []


def test_rgb_to_grey_batch_augmentation_copies_its_constants_once():
    from resmlp.data.device.batch_augment import BatchAugment

    augment = BatchAugment(16, 1, mean=[0.5], std=[0.25], reprob=0.25)
    with fake_cuda() as ledger:
        images = torch.zeros(4, 16, 16, 3, dtype=torch.uint8).pin_memory().to("cuda", non_blocking=True)
        for _ in range(3):
            out = augment(images, [1, 2, 3, 4])
    assert is_fake_cuda(out) and out.shape == (4, 1, 16, 16)
    assert [e for e in ledger.events if e.kind != "read"] == []  # constants and crop boxes: pinned copies
    assert [e.site() for e in ledger.events] == []


# ------------------------------------------------------------------------------------------ evaluation, inference
def test_eval_on_the_gpu_reads_the_device_once(tmp_path, tiny_checkpoint):
    from resmlp.evaluation import evaluate

    with fake_cuda() as ledger:  # resmlp eval, with its loader in this process (workers are out of reach)
        summary = evaluate(tiny_checkpoint, data="synthetic", device="cuda", batch_size=16, num_workers=0,
                           output=tmp_path / "eval")
    assert summary["device"].startswith("cuda")
    reads = [e for e in ledger.events if e.kind == "read"]
    assert [e.site().split(":")[1] for e in reads] == ["classify"]


def test_optimize_and_predict_run_on_the_gpu_with_one_read_per_batch(tiny_checkpoint):
    from resmlp.inference import optimize, predict

    model = resmlp.load(tiny_checkpoint)
    with fake_cuda() as ledger:
        for precision in ("fp32", "bf16"):
            fast = optimize(model, precision).to("cuda")
            images = torch.zeros(4, 1, 16, 16).pin_memory().to("cuda", non_blocking=True)
            ledger.clear()
            probs, classes = predict(fast, images, top_k=2)
            assert is_fake_cuda(probs) and is_fake_cuda(classes) and probs.shape == (4, 2)
            assert [e.kind for e in ledger.events] == ["read"]  # the NaN check, one per batch


def test_the_knn_vote_stays_on_the_gpu():
    from resmlp.train.probe import extract_features, knn_accuracy

    features = torch.nn.Flatten().to("cuda")
    batches = [(torch.zeros(6, 2, 2), torch.arange(6) % 3) for _ in range(3)]
    with fake_cuda() as ledger:
        train_x, train_y = extract_features(features, batches, "cuda")
        assert is_fake_cuda(train_x) and is_fake_cuda(train_y) and train_x.shape == (18, 4)
        knn_accuracy(train_x, train_y, train_x, train_y, k=3, chunk=4)
    assert [e.kind for e in ledger.events if e.kind != "read"] == []  # batches copied up pinned, nothing back
    assert len([e for e in ledger.events if e.kind == "read"]) == 2  # the class count and the final vote


# ------------------------------------------------------------------------------------------ translation
@pytest.fixture(scope="module")
def number_corpus(tmp_path_factory) -> Path:
    from num2words import num2words

    root = tmp_path_factory.mktemp("corpus")
    for split, numbers in {"train": range(0, 120), "valid": range(200, 206), "test": range(210, 214)}.items():
        for lang in ("en", "fr"):
            (root / f"{split}.{lang}").write_text("".join(num2words(n, lang=lang) + "\n" for n in numbers),
                                                  encoding="utf-8")
    return root


@pytest.mark.parametrize("arch", ["resmlp", "transformer"])
def test_the_translation_trainer_reads_once_per_log_interval(tmp_path, number_corpus, arch):
    from resmlp.seq2seq.train import TranslationConfig, train_translation

    cfg = TranslationConfig(output=str(tmp_path / "run"), data=str(number_corpus), src_suffix="en", tgt_suffix="fr",
                            preset="tiny", model_overrides={"max_len": 24}, vocab_size=120, max_tokens=256,
                            optimizer="adam", lr=3e-3, warmup_steps=2, max_steps=8, eval_every=4, log_every=4,
                            beam=2, progress=False, device="cuda", precision="bf16", arch=arch)
    with fake_cuda() as ledger:
        summary = train_translation(cfg)
    assert summary["steps"] == 8
    in_loop = ledger.inside("_train", allowed=("validation_loss", "save_checkpoint", "evaluate_translation"))
    # per log interval (steps 4 and 8), and the run's first step, logged at once
    assert [e.kind for e in in_loop if e.kind != "unpinned-host-to-device"] == ["read", "read", "read"]
    assert {e.site() for e in in_loop if e.kind == "unpinned-host-to-device"} == {
        "resmlp.seq2seq.train:_train"}  # the model's weights going up once; batches go pinned (no event)
    per_validation = Counter(e.kind for e in ledger.inside("validation_loss"))
    assert per_validation == {"read": 2}  # 2 validations, one read each


def test_accumulated_updates_and_averaging_read_nothing_more_on_the_gpu(tmp_path, number_corpus):
    """--update-freq 3: three batches per update, still one read per log interval; --average-last 2: the kept
    checkpoints are written with checkpoint.pt, the mean built after the loop (host memory, then one copy up)."""
    from resmlp.seq2seq.train import TranslationConfig, train_translation

    cfg = TranslationConfig(output=str(tmp_path / "run"), data=str(number_corpus), src_suffix="en", tgt_suffix="fr",
                            preset="tiny", model_overrides={"max_len": 24}, vocab_size=120, max_tokens=256,
                            optimizer="adam", lr=3e-3, warmup_steps=2, max_steps=8, eval_every=4, log_every=4,
                            beam=2, progress=False, device="cuda", precision="bf16", update_freq=3, average_last=2)
    with fake_cuda() as ledger:
        summary = train_translation(cfg)
    assert summary["steps"] == 8 and summary["averaged_steps"] == [4, 8]
    in_loop = ledger.inside("_train", allowed=("validation_loss", "save_checkpoint", "evaluate_translation",
                                               "_scored_model"))
    # per log interval (steps 4 and 8), and the run's first step, logged at once
    assert [e.kind for e in in_loop if e.kind != "unpinned-host-to-device"] == ["read", "read", "read"]
    assert {e.site() for e in in_loop if e.kind == "unpinned-host-to-device"} == {"resmlp.seq2seq.train:_train"}


@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_reads_once_per_step_and_copies_nothing(beam):
    from resmlp.seq2seq.decoding import beam_search, greedy
    from resmlp.seq2seq.model import build_translation_model, translation_model_config

    torch.manual_seed(0)
    model = build_translation_model(translation_model_config("tiny", 30, arch="resmlp", max_len=6)).eval()
    with fake_cuda() as ledger:
        model = model.to("cuda")
        src = torch.randint(3, 30, (2, 5)).pin_memory().to("cuda", non_blocking=True)
        ledger.clear()
        out = greedy(model, src) if beam == 1 else beam_search(model, src, beam=beam)
    assert len(out) == 2
    kinds = Counter(e.kind for e in ledger.events)
    assert kinds == {"read": 6 + 1}  # the stop test of each of max_len steps, then the result


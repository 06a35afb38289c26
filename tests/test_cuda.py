"""The GPU paths: mixed precision, exact resume, compile and channels-last, torchrun with nccl, bf16 inference,
and every trainer (distillation, DINO, fine-tuning, seq2seq) for a few steps.

Every GPU test is marked `cuda`: skipped without a GPU, selected on a GPU machine with
`PYTHONPATH=src python -m pytest -m cuda` (docs/gpu.md). Where a test body means something on the CPU as
well and is quick, it also runs there, unmarked (the mixed-precision step in bf16).

The bounds below were reasoned from the formats' precision, not yet measured on a GPU: fp16 keeps 11
significant bits and bf16 8 against fp32's 24, and a rounding difference is far below a real mistake (a
skipped or doubled step moves the weights ~1/steps = 25 % apart in these 4-step runs, see conftest.DRIFT_BOUND).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same_training, build_fast
from hostspeed import limit
from safetensors.torch import load_file
from test_train_engine import initial_weights
from test_train_resume import KILLED_CHILD
from test_train_resume import OVERRIDES as RESUME_OVERRIDES

import resmlp
from resmlp.cli import main
from resmlp.data.sources.synthetic import synthetic
from resmlp.inference import load_for_inference, optimize
from resmlp.models.resmlp import ResMLPConfig
from resmlp.runtime import autocast, grad_scaler
from resmlp.train import train

CUDA = pytest.mark.cuda
TIMEOUT = 600
GPU = {
    "data.kind": "synthetic", "data.synthetic_size": [64, 32], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5, "model.img_size": 16, "model.patch_size": 4, "model.dim": 32,
    "model.depth": 2, "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 16,
    "train.progress": False, "train.amp": "none", "optim.name": "sgd", "optim.lr": 0.1, "train.compile": False,
    "train.device": "cuda", "train.threads": 1,
}
# relative error of one step's gradient against fp32's (the same batch, weights of trained scale)
STEP_BOUND = {"bf16": 0.05, "fp16": 0.01}
# fp32 on a GPU: cuBLAS/cuDNN and inductor pick their own kernels and reduction orders (TF32 off here), so
# eager and compiled, or NCHW and channels-last, round differently; still 250x below a skipped step
GPU_FP32_DRIFT = 1e-3


def sets(overrides: dict) -> list[str]:
    return [f"--set={key}={json.dumps(value)}" for key, value in overrides.items()]


def torchrun() -> str:
    return shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"


@pytest.fixture
def no_tf32():
    """fp32 means fp32: TF32 products (cuDNN's default for convolutions) would make every bound TF32's.
    (Subprocesses get NVIDIA_TF32_OVERRIDE=0.)"""
    matmul, conv = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = conv


# ------------------------------------------------------------------------------------------ mixed precision
def step_gradient(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor, amp: str) -> torch.Tensor:
    """The gradient the trainer's step applies in `amp`: autocast, and for fp16 the gradient scaler, whose
    overflowing first scales are skipped (and the scale lowered) as in training, until a finite one."""
    device = images.device
    params = [p for p in model.parameters() if p.requires_grad]
    scaler = grad_scaler(amp, device)
    no_move = torch.optim.SGD(params, lr=0.0)  # the scaler steps an optimizer; lr 0 leaves the weights
    for _ in range(30):
        no_move.zero_grad(set_to_none=True)
        with autocast(device, amp):
            loss = F.cross_entropy(model(images), targets)
        (scaler.scale(loss) if scaler else loss).backward()
        if scaler is None:
            break
        scaler.unscale_(no_move)
        finite = all(torch.isfinite(p.grad).all() for p in params)
        scaler.step(no_move)
        scaler.update()
        if finite:
            break
    else:
        raise AssertionError("the fp16 gradient scaler never found a finite scale")
    return torch.cat([p.grad.flatten().double() for p in params])


@pytest.mark.parametrize(("device", "amp"), [pytest.param("cpu", "bf16", marks=pytest.mark.hosttype),
                                             pytest.param("cuda", "bf16", marks=CUDA),
                                             pytest.param("cuda", "fp16", marks=CUDA)])
def test_a_mixed_precision_step_agrees_with_fp32(device, amp):
    model = build_fast(ResMLPConfig(img_size=16, patch_size=4, in_chans=3, dim=32, depth=2, num_classes=10))
    model = model.to(device).train()
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(32, 3, 16, 16, generator=gen).to(device)
    targets = torch.randint(0, 10, (32,), generator=gen).to(device)
    reference = step_gradient(model, images, targets, "none")
    mixed = step_gradient(model, images, targets, amp)
    error = ((mixed - reference).norm() / reference.norm()).item()
    assert 0 < error < STEP_BOUND[amp], f"{amp} step gradient is {error:.3g} of fp32's away"


@CUDA
@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_training_on_the_gpu_stays_near_fp32(tmp_path, no_tf32, amp):
    reference = train("fashion-mnist-quick", tmp_path / "fp32", overrides=GPU)
    mixed = train("fashion-mnist-quick", tmp_path / amp, overrides={**GPU, "train.amp": amp})
    assert (reference["amp"], mixed["amp"]) == ("fp32", amp)
    a, b = load_file(tmp_path / amp / "last.safetensors"), load_file(tmp_path / "fp32" / "last.safetensors")
    assert all(torch.isfinite(t).all() for t in a.values())
    init = initial_weights(GPU)
    if amp == "bf16":
        assert_same_training(init, a, b, "bf16", "bf16 autocast on the GPU")
    # fp16: the scaler may skip its first, overflowing steps (a skipped step is its design, not an error), so
    # only the step-level test above bounds fp16's rounding; here the run must end with finite, moved weights
    assert any(not torch.equal(a[k], init[k]) for k in a if a[k].is_floating_point())


# ------------------------------------------------------------------------------------------ exact resume
@CUDA
def test_sigkill_resume_on_the_gpu_is_bit_identical_in_fp32(tmp_path, monkeypatch):
    """tests/test_train_resume.py on the GPU: killed mid-epoch, resumed, the weights of an uninterrupted run."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (train.deterministic)
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    overrides = {**RESUME_OVERRIDES, "train.amp": "none", "train.device": "cuda", "train.deterministic": True}
    killed = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(tmp_path / "killed"), json.dumps(overrides)],
                            capture_output=True, text=True, timeout=limit(TIMEOUT))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    state = torch.load(tmp_path / "killed" / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (1, 2, 8)
    resumed = subprocess.run([sys.executable, "-m", "resmlp", "train", "--output", str(tmp_path / "killed"),
                              "--resume", *sets(overrides)], capture_output=True, text=True, timeout=limit(TIMEOUT))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    straight = subprocess.run([sys.executable, "-m", "resmlp", "train", "--output", str(tmp_path / "straight"),
                               *sets(overrides)], capture_output=True, text=True, timeout=limit(TIMEOUT))
    assert straight.returncode == 0, straight.stderr[-2000:]
    for name in ("last.safetensors", "best.safetensors"):
        a, b = load_file(tmp_path / "killed" / name), load_file(tmp_path / "straight" / name)
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}:{key} differs after resume on the GPU"


# ------------------------------------------------------------------------------------------ compile, layout
@CUDA
@pytest.mark.parametrize("setting", ["train.compile", "train.channels_last"])
def test_compile_and_channels_last_train_the_eager_weights(tmp_path, no_tf32, setting):
    eager = train("fashion-mnist-quick", tmp_path / "eager", overrides=GPU)
    other = train("fashion-mnist-quick", tmp_path / "other", overrides={**GPU, setting: True})
    assert eager["epochs"] == other["epochs"] == 1
    a, b = load_file(tmp_path / "other" / "last.safetensors"), load_file(tmp_path / "eager" / "last.safetensors")
    assert_same_training(initial_weights(GPU), a, b, "none", f"{setting} on the GPU", bound=GPU_FP32_DRIFT)


# ------------------------------------------------------------------------------------------ torchrun, nccl
def written_files(run: Path) -> list[str]:
    """The files of a run folder, TensorBoard's (named by time, host and pid) counted rather than named."""
    names = sorted(str(p.relative_to(run)) for p in run.rglob("*")
                   if p.is_file() and "tensorboard" not in p.relative_to(run).parts)
    return names + [f"tensorboard: {sum(1 for p in (run / 'tensorboard').rglob('*') if p.is_file())} files"]


@CUDA
def test_torchrun_one_nccl_process_writes_what_one_process_writes(tmp_path, no_tf32):
    ddp = subprocess.run([torchrun(), "--standalone", "--nproc_per_node=1", "-m", "resmlp", "train", "--output",
                          str(tmp_path / "ddp"), *sets(GPU)], capture_output=True, text=True, timeout=limit(TIMEOUT),
                         env={**os.environ, "NVIDIA_TF32_OVERRIDE": "0"})
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    train("fashion-mnist-quick", tmp_path / "one", overrides=GPU)
    assert written_files(tmp_path / "ddp") == written_files(tmp_path / "one")
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("ddp", "one")]
    assert summaries[0].keys() == summaries[1].keys()
    assert summaries[0]["world_size"] == summaries[1]["world_size"] == 1
    a, b = load_file(tmp_path / "ddp" / "last.safetensors"), load_file(tmp_path / "one" / "last.safetensors")
    assert_same_training(initial_weights(GPU), a, b, "none", "torchrun x1 with nccl", bound=GPU_FP32_DRIFT)


# ------------------------------------------------------------------------------------------ inference
@CUDA
def test_gpu_bf16_inference_agrees_with_fp32_on_a_trained_checkpoint(tmp_path, no_tf32):
    overrides = {**GPU, "schedule.epochs": 4, "data.synthetic_size": [512, 64], "optim.name": "adamw",
                 "optim.lr": 3e-3, "model.in_chans": 3}
    summary = train("fashion-mnist-quick", tmp_path / "run", overrides=overrides)
    assert summary["val_top1"] > 50  # trained, so its top-1 means something (4 classes: chance is 25 %)
    loaded = load_for_inference(summary["checkpoint"])
    # 2000 fresh images of the run's classes (its synthetic templates: the run's seed, 0)
    data = synthetic("test", 2000, 4, 16, in_chans=3, seed=0, transform=loaded.preprocess.eval_transform())
    images = torch.stack([data[i][0] for i in range(len(data))]).cuda()
    model = loaded.model.cuda()
    with torch.no_grad():
        fp32 = optimize(model, "fp32")(images).argmax(1)
        bf16 = optimize(model, "bf16")(images).argmax(1)
    agreement = (fp32 == bf16).double().mean().item()
    assert agreement >= 0.99, f"bf16 top-1 agrees with fp32 on {agreement:.2%} of {len(images)} images"


# ------------------------------------------------------------------------------------------ every trainer
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny 4-class checkpoint (synthetic data's default): the teacher of distillation, the start of fine-tuning."""
    path = tmp_path_factory.mktemp("ckpt") / "tiny.safetensors"
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=32,
                                    depth=2), path)
    return path


@CUDA
@pytest.mark.parametrize("task", ["distill", "dino", "finetune"])
def test_every_image_trainer_runs_on_the_gpu(tmp_path, capsys, checkpoint, task):
    out = tmp_path / "run"
    overrides = {**GPU, "train.amp": "bf16", "data.synthetic_size": [32, 16]}
    if task == "dino":
        overrides |= {"dino.out_dim": 64, "dino.hidden_dim": 32, "dino.bottleneck_dim": 16, "dino.num_local": 2,
                      "dino.local_size": 8, "dino.warmup_teacher_temp_epochs": 0, "optim.name": "adamw",
                      "optim.lr": 1e-3}
    if task == "finetune":
        overrides = {k: v for k, v in overrides.items() if not k.startswith("model.")}
    command = {"distill": ["train", "--distill", str(checkpoint), "--teacher-classes-match"],
               "dino": ["pretrain", "dino"],
               "finetune": ["finetune", str(checkpoint)]}[task]
    assert main([*command, "--output", str(out), *sets(overrides)]) == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["amp"] == "bf16" and summary["epochs"] == 1
    score = summary["knn_top1"] if task == "dino" else summary["val_top1"]
    assert 0 <= score <= 100
    weights = load_file(out / "last.safetensors")
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


@CUDA
def test_the_seq2seq_trainer_runs_on_the_gpu_in_bf16(tmp_path):
    from num2words import num2words

    from resmlp.seq2seq.train import TranslationConfig, train_translation

    for split, numbers in {"train": range(0, 200), "valid": range(200, 210), "test": range(210, 220)}.items():
        for lang in ("en", "fr"):
            (tmp_path / f"{split}.{lang}").write_text("".join(num2words(n, lang=lang) + "\n" for n in numbers),
                                                      encoding="utf-8")
    cfg = TranslationConfig(output=str(tmp_path / "run"), data=str(tmp_path), src_suffix="en", tgt_suffix="fr",
                            preset="tiny", model_overrides={"max_len": 24}, vocab_size=150, max_tokens=512,
                            optimizer="adam", lr=3e-3, warmup_steps=2, max_steps=4, eval_every=2, beam=1,
                            progress=False, device="cuda", precision="bf16")
    summary = train_translation(cfg)
    assert summary["steps"] == 4 and summary["device"].startswith("cuda")

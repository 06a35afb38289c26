"""The fused training step computes what the plain ResMLP block computes: outputs and every gradient."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_trained_like_
from hostspeed import limit

from resmlp.models import fused_block
from resmlp.models.fused_block import FusedBlockFunction, fusable, set_fused_training
from resmlp.models.resmlp import ResMLP

TINY = dict(img_size=16, patch_size=4, in_chans=3, dim=8, depth=2, num_classes=5)
ROOT = Path(__file__).resolve().parents[1]


def make_pair(dtype: torch.dtype = torch.float64, **overrides) -> tuple[ResMLP, ResMLP]:
    """The same trained-looking model twice: fused training path (default) and plain."""
    torch.manual_seed(0)
    fused = make_trained_like_(ResMLP(**{**TINY, **overrides})).to(dtype).train()
    plain = set_fused_training(copy.deepcopy(fused), False)
    return fused, plain


def run(model: ResMLP, images: torch.Tensor, bf16: bool = False, seed: int = 1):
    """Output, input gradient and parameter gradients of a loss that weighs every logit differently."""
    torch.manual_seed(seed)  # the same stochastic-depth draws for both models
    images = images.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        out = model(images)
    weights = torch.linspace(-1.0, 1.0, out.numel(), dtype=torch.float64).view_as(out)
    model.zero_grad(set_to_none=True)
    (out.double() * weights).sum().backward()
    return out.detach(), images.grad, {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def assert_same_training_step(fused: ResMLP, plain: ResMLP, dtype: torch.dtype, tol: float) -> None:
    images = torch.randn(3, TINY["in_chans"], TINY["img_size"], TINY["img_size"], dtype=dtype)
    out_f, dx_f, grads_f = run(fused, images)
    out_p, dx_p, grads_p = run(plain, images)
    assert rel_err(out_f, out_p) < tol
    assert rel_err(dx_f, dx_p) < tol
    assert grads_f.keys() == grads_p.keys()
    for name in grads_p:
        assert grads_f[name] is not None, name
        assert rel_err(grads_f[name], grads_p[name]) < tol, name


def uses_fused_step(model: ResMLP) -> bool:
    tokens = torch.randn(2, model.config.num_patches, model.config.dim, dtype=model.head.weight.dtype,
                         requires_grad=True)
    out = model.blocks[0](tokens)
    return out.grad_fn is not None and "FusedBlockFunction" in type(out.grad_fn).__name__


@pytest.mark.parametrize("overrides", [
    {},
    {"layerscale": False},
    {"pooling": "class_mlp", "pos_embed": True},
    {"drop_path_rate": 0.4},
], ids=["paper", "no-layerscale", "class-mlp+pos-embed", "drop-path"])
@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_fused_step_equals_plain_outputs_and_gradients(overrides, dtype, tol):
    fused, plain = make_pair(dtype, **overrides)
    assert uses_fused_step(fused) and not uses_fused_step(plain)
    assert_same_training_step(fused, plain, dtype, tol)


def test_drop_path_is_applied_by_the_fused_step():
    fused, _ = make_pair(drop_path_rate=0.5)
    images = torch.randn(8, 3, 16, 16, dtype=torch.float64)
    outs = [run(fused, images, seed=s)[0] for s in (1, 2)]
    assert rel_err(outs[0], outs[1]) > 1e-3  # other draws drop other samples' branches
    eval_out = fused.eval()(images)
    assert rel_err(outs[0], eval_out) > 1e-3


@pytest.mark.hosttype
@pytest.mark.parametrize("drop_path_rate", [0.0, 0.3])
def test_fused_step_under_bf16_autocast_is_as_close_to_float64_as_the_plain_one(drop_path_rate):
    fused, plain = make_pair(torch.float32, drop_path_rate=drop_path_rate)
    reference = copy.deepcopy(plain).double()
    images = torch.randn(4, 3, 16, 16)
    out_f, dx_f, grads_f = run(fused, images, bf16=True)
    out_p, dx_p, grads_p = run(plain, images, bf16=True)
    out_r, dx_r, grads_r = run(reference, images.double())
    pairs = [(out_f, out_p, out_r), (dx_f, dx_p, dx_r)] + [(grads_f[n], grads_p[n], grads_r[n]) for n in grads_r]
    for got, plain_got, exact in pairs:
        # bf16 has an 8-bit mantissa: both within a few percent of float64, the fused no worse than 2x plain
        assert rel_err(got, exact) < max(2 * rel_err(plain_got, exact), 2e-2)
        assert rel_err(got, exact) < 0.1


def test_frozen_parameters_get_no_gradient_and_the_rest_match():
    fused, plain = make_pair()
    for model in (fused, plain):
        model.blocks[0].cross_patch.requires_grad_(False)
        model.blocks[1].channel_mlp.fc1.requires_grad_(False)
    assert_same_training_step(fused, plain, torch.float64, 1e-10)
    assert fused.blocks[0].cross_patch.weight.grad is None


@pytest.mark.parametrize("overrides", [
    {"norm": "layernorm"},
    {"cross_patch": "mlp"},
    {"act": "relu"},
    {"drop_rate": 0.2},
    {"cross_patch": "mlp", "norm": "layernorm", "layerscale": False, "cross_patch_hidden": 8},  # Mixer
], ids=["layernorm", "mlp-cross-patch", "relu", "dropout", "mixer"])
def test_unsupported_designs_keep_the_plain_path(overrides):
    fused, plain = make_pair(**overrides)
    assert not fusable(fused.blocks[0]) and not uses_fused_step(fused)
    if overrides.get("drop_rate", 0) == 0:  # dropout draws differ per call order; the rest must match
        assert_same_training_step(fused, plain, torch.float64, 1e-10)


def test_eval_and_no_grad_use_the_plain_path():
    fused, _ = make_pair()
    assert uses_fused_step(fused)
    with torch.no_grad():
        tokens = torch.randn(2, 16, 8, dtype=torch.float64)
        assert fused.blocks[0](tokens).grad_fn is None
    assert not uses_fused_step(fused.eval())


def test_fused_function_is_the_block_output_grad_fn():
    fused, _ = make_pair()
    tokens = torch.randn(2, 16, 8, dtype=torch.float64, requires_grad=True)
    assert type(fused.blocks[0](tokens).grad_fn).__name__ == FusedBlockFunction.__name__ + "Backward"


def test_benchmark_smoke_writes_host_and_ratios(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "train_throughput.py"), "--rounds", "1", "--steps", "1",
           "--warmup", "0", "--img-size", "32", "--batch", "2", "--variants", "ours", "timm", "--json", str(out)]
    # kernels restricted to AVX2 (an AVX2 host's rehearsal): no native bf16, so the default measures fp32 only
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2",
           "ONEDNN_MAX_CPU_ISA": "AVX2"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(120))
    data = json.loads(out.read_text())
    assert {"cpu", "cpu_capability", "native_bf16", "threads", "torch", "timm"} <= data["host"].keys()
    assert data["host"]["native_bf16"] is False and len(data["results"]) == 1
    result = data["results"][0]
    assert result["precision"] == "fp32" and result["gemm_limit_img_s"] > 0
    assert set(result["variants"]) == {"ours", "timm"} and data["settings"]["malloc"] == "resmlp"
    assert result["ratios"]["ours / timm"]["median"] > 0


@pytest.mark.parametrize("drop_path_rate", [0.0, 0.3])
def test_folded_graph_for_torch_compile_equals_plain(monkeypatch, drop_path_rate):
    # under torch.compile the block runs the folded arithmetic as plain ops (inductor fuses them)
    monkeypatch.setattr(fused_block.torch.compiler, "is_compiling", lambda: True)
    fused, plain = make_pair(drop_path_rate=drop_path_rate)
    assert not uses_fused_step(fused)
    assert_same_training_step(fused, plain, torch.float64, 1e-10)


@pytest.mark.parametrize("fused_step", [True, False])
def test_trainer_follows_the_fused_step_setting(tmp_path, fused_step):
    from resmlp.runtime import DistInfo
    from resmlp.train.config import load_config
    from resmlp.train.task_registry import task_for
    from resmlp.train.trainer import Trainer

    cfg = load_config("fashion-mnist-quick", {
        "data.kind": "synthetic", "data.synthetic_size": [32, 16], "model.img_size": 16, "model.dim": 16,
        "model.depth": 1, "train.batch_size": 8, "train.compile": False, "train.progress": False,
        "train.fused_step": fused_step})
    trainer = Trainer(cfg, tmp_path / "run", DistInfo(1, 0, 0, torch.device("cpu")), False, task_for(cfg))
    assert uses_fused_step(trainer.model.train()) == fused_step

"""train.clip_grad holds in every precision: the gradients the optimizer steps with have a norm of at most
clip_grad, with a GradScaler (fp16) too, where they are clipped after unscaling (timm's NativeScaler, DINO's
fp16_scaler.unscale_ then clip). fp16 trains on CUDA only, so its GradScaler is run here as torch's CPU scaler."""

from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from resmlp.train import train, trainer

TINY = {
    "data.kind": "synthetic", "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0],
    "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16, "model.patch_size": 4, "model.dim": 16,
    "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 16,
    "train.progress": False, "optim.lr": 3e-3, "data.synthetic_size": [64, 16], "train.threads": 1,
    "train.compile": False,
}
CLIP = 1e-3  # far below any gradient norm of a fresh model, so every step is clipped


def _norm(params) -> float:
    grads = [p.grad.detach().float() for p in params if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.hosttype), "fp16-grad-scaler"])
@pytest.mark.parametrize("mode", ["norm", "per_param"])
def test_the_optimizer_steps_with_clipped_gradients_in_every_precision(tmp_path, monkeypatch, precision, mode):
    if precision == "fp16-grad-scaler":  # the fp16 path: scaled loss, unscale_, clip, scaler.step
        monkeypatch.setattr(trainer, "grad_scaler", lambda amp, device: torch.amp.GradScaler("cpu", init_scale=2.0**12))
    seen: list[tuple[float, float]] = []

    def record(optimizer, args, kwargs):
        params = [p for g in optimizer.param_groups for p in g["params"]]
        per_param = max(float(torch.linalg.vector_norm(p.grad.float())) for p in params if p.grad is not None)
        seen.append((_norm(params), per_param))

    handle = register_optimizer_step_pre_hook(record)
    try:
        train("fashion-mnist-quick", tmp_path / "run", overrides={
            **TINY, "train.amp": "bf16" if precision == "bf16" else "none", "train.clip_grad": CLIP,
            "train.clip_mode": mode})
    finally:
        handle.remove()
    assert len(seen) == 4  # 64 images / 16: every step reached the optimizer
    bound = [total if mode == "norm" else per_param for total, per_param in seen]
    assert max(bound) <= CLIP * 1.01, bound

"""Shared test helpers: small models and weights that look trained (not the near-identity init)."""

from __future__ import annotations

import pytest
import torch

from resmlp.models.resmlp import ResMLP, ResMLPConfig


def make_trained_like_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with random values of trained-model scale, in place.

    Affine/LayerNorm scales around 1 with random shifts, LayerScale around 0.1, matrices with
    1/sqrt(fan_in) scale, so every sublayer contributes and a folding mistake shows in the logits.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim > 1:  # uniform with the variance of N(0, 1/fan_in): much faster for 400M weights
                bound = (3 / p[0].numel()) ** 0.5
                p.uniform_(-bound, bound, generator=gen)
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
            if leaf == "gamma":
                p.copy_(0.1 * (1 + 0.5 * noise))
            elif leaf == "alpha" or (leaf == "weight" and p.ndim == 1):
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.1 * noise)
    for buf_name, buf in model.named_buffers():
        if buf_name.endswith("running_var"):
            buf.uniform_(0.5, 1.5, generator=gen)
        elif buf_name.endswith("running_mean"):
            buf.normal_(0, 0.1, generator=gen)
    return model


def build_fast(config: ResMLPConfig, seed: int = 0) -> ResMLP:
    """A model with trained-like weights, built without the (slow for 400M parameters) default init."""
    with torch.device("meta"):
        model = ResMLP(config)
    model = model.to_empty(device="cpu")
    for buf in model.buffers():  # BatchNorm statistics; make_trained_like_ sets them
        buf.zero_()
    return make_trained_like_(model, seed).eval()


TINY = dict(img_size=32, patch_size=8, dim=32, depth=2, num_classes=7)


@pytest.fixture
def tiny_config() -> ResMLPConfig:
    return ResMLPConfig(**TINY)

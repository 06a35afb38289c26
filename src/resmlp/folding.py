"""Affine folding for inference (`resmlp.fuse`).

`fuse(model)` returns an equivalent eval-mode copy in which
- each block's channel-MLP pre-Affine is folded into fc1 and its LayerScale into fc2;
- each block's cross-patch pre-Affine, the matrix bias and LayerScale become one per-channel scale and
  one (N, C) bias:  x + gamma*(A (alpha*x + beta) + b) = x + (gamma*alpha) * (A x) + gamma*(beta*rowsum(A) + b);
- the final Affine is folded into the head (average pooling commutes with it).
Blocks of other kinds (LayerNorm, convolutions, Mixer) are kept as they are: they have nothing to fold.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from resmlp.layers import Affine, CrossPatchLinear, LayerScale
from resmlp.models.resmlp import ResMLP, ResMLPBlock


class FusedCrossPatch(nn.Module):
    """x + scale * (A @ x) + bias, with A (N, N), scale (C,), bias (N, C)."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.scale = nn.Parameter(scale, requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(x + self.bias, self.scale, torch.matmul(self.weight, x))


class FusedBlock(nn.Module):
    """A ResMLP block with Affine pre-norms and a linear cross-patch, every Affine folded away."""

    def __init__(self, block: ResMLPBlock) -> None:
        super().__init__()
        with torch.no_grad():
            cp, norm = block.cross_patch, block.cross_patch_norm
            gamma1 = _gamma(block.cross_patch_scale, norm.alpha)
            bias = gamma1 * (norm.beta * cp.weight.sum(1, keepdim=True) + cp.bias.unsqueeze(-1))
            self.cross_patch = FusedCrossPatch(cp.weight.clone(), gamma1 * norm.alpha, bias)

            mlp, norm2 = block.channel_mlp, block.channel_norm
            gamma2 = _gamma(block.channel_scale, norm2.alpha)
            self.fc1 = _linear(mlp.fc1.weight * norm2.alpha, mlp.fc1.bias + mlp.fc1.weight @ norm2.beta)
            self.act = mlp.act
            self.fc2 = _linear(mlp.fc2.weight * gamma2.unsqueeze(-1), mlp.fc2.bias * gamma2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cross_patch(x)
        return x + self.fc2(self.act(self.fc1(x)))


def _gamma(scale: nn.Module, like: torch.Tensor) -> torch.Tensor:
    return scale.gamma if isinstance(scale, LayerScale) else torch.ones_like(like)


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], dtype=weight.dtype, device=weight.device)
    layer.weight.data.copy_(weight)
    layer.bias.data.copy_(bias)
    layer.requires_grad_(False)
    return layer


def _foldable(block: nn.Module) -> bool:
    # dropout and stochastic depth need no care: the fused copy is for eval mode only
    return (
        isinstance(block, ResMLPBlock)
        and isinstance(block.cross_patch, CrossPatchLinear)
        and isinstance(block.cross_patch_norm, Affine)
        and isinstance(block.channel_norm, Affine)
    )


def fuse(model: ResMLP) -> ResMLP:
    """An equivalent inference copy of `model` with the Affines folded into the linear layers.

    The copy's forward() equals the original's; when the final Affine is folded into the head,
    its forward_features() returns the tokens before that Affine.
    """
    fused = copy.deepcopy(model).eval()
    fused.blocks = nn.Sequential(*(FusedBlock(b) if _foldable(b) else b for b in fused.blocks))
    if isinstance(fused.norm, Affine) and fused.class_mlp is None and isinstance(fused.head, nn.Linear):
        with torch.no_grad():
            head, norm = fused.head, fused.norm
            fused.head = _linear(head.weight * norm.alpha, head.bias + head.weight @ norm.beta)
        fused.norm = nn.Identity()
    return fused.requires_grad_(False)

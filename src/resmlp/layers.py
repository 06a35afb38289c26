"""Building blocks of ResMLP and MLP-Mixer.

Every sublayer works on tokens laid out as (batch, patches, channels) = (B, N, C).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import nn

from resmlp.models.config import ACTIVATION_NAMES, CROSS_PATCH, NORMS  # noqa: F401 (re-exported)

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "gelu": nn.GELU,
    "relu": nn.ReLU,
    "silu": nn.SiLU,
    "hardswish": nn.Hardswish,
}


class Affine(nn.Module):
    """Aff(x) = Diag(alpha) x + beta over channels (paper Eq. 1); no statistics, foldable into linears."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(self.beta, self.alpha, x)


class LayerScale(nn.Module):
    """Post-normalisation Diag(gamma) x.

    The paper writes it as an Affine, but the published code (DeiT, timm) and weights have no bias
    here, so a bias would break interoperability.
    """

    def __init__(self, dim: int, init: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over channels for (B, N, C) tokens (Appendix A pre-normalisation ablation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class L2Norm(nn.Module):
    """Each token scaled to unit RMS (l2-normalised times sqrt(C)), then a learnable Affine."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.scale = math.sqrt(dim)
        self.affine = Affine(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.affine(F.normalize(x, dim=-1) * self.scale)


def make_norm(kind: str, dim: int) -> nn.Module:
    """Pre-normalisation layer by name: affine (paper default), layernorm, batchnorm, l2 or none."""
    if kind == "affine":
        return Affine(dim)
    if kind == "layernorm":
        return nn.LayerNorm(dim, eps=1e-6)  # eps of the published Mixer and LayerNorm-ResMLP weights
    if kind == "batchnorm":
        return TokenBatchNorm(dim)
    if kind == "l2":
        return L2Norm(dim)
    if kind == "none":
        return nn.Identity()
    raise ValueError(f"unknown norm {kind!r}; choose one of {', '.join(NORMS)}")


class CrossPatchLinear(nn.Module):
    """The paper's cross-patch sublayer: one N x N matrix A (plus bias) shared by all channels.

    Computes A @ X directly on the (B, N, C) layout, so no transposes are needed.
    """

    def __init__(self, num_patches: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_patches, num_patches))
        self.bias = nn.Parameter(torch.zeros(num_patches))
        nn.init.trunc_normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.weight, x) + self.bias.unsqueeze(-1)


class CrossPatchMlp(Mlp):
    """Token-mixing MLP N -> hidden -> N applied to every channel (Table 3 'linear -> MLP', Mixer)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # timm's Mlp.forward spelled out (TorchScript can't compile super() calls), without its `norm`: built
        # with no norm_layer it is an Identity, and calling it would give an FX node 'cross_patch.norm' that
        # torchvision's feature extractor, which compares node names as regular expressions, confuses with the
        # block's 'cross_patch_norm' (a ValueError while tracing)
        x = self.drop1(self.act(self.fc1(x.transpose(1, 2))))
        return self.drop2(self.fc2(x)).transpose(1, 2)


class CrossPatchConv(nn.Module):
    """3x3 convolutions on the patch grid (Table 3 'patch communication' block).

    kind: conv3x3 (full), dwconv3x3 (depth-wise) or dwsep3x3 (depth-wise then point-wise).
    """

    def __init__(self, dim: int, grid: int, kind: str) -> None:
        super().__init__()
        self.grid = grid
        groups = 1 if kind == "conv3x3" else dim
        self.conv = nn.Conv2d(dim, dim, 3, padding=1, groups=groups)
        self.pointwise = nn.Conv2d(dim, dim, 1) if kind == "dwsep3x3" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        y = self.conv(x.transpose(1, 2).reshape(b, c, self.grid, self.grid))
        if self.pointwise is not None:
            y = self.pointwise(y)
        return y.flatten(2).transpose(1, 2)


def make_cross_patch(
    kind: str, dim: int, grid: int, hidden: int | None, act: type[nn.Module], drop: float
) -> nn.Module | None:
    """Cross-patch sublayer by name; None for 'none' (the 'bag of patches' ablation)."""
    num_patches = grid * grid
    if kind == "linear":
        return CrossPatchLinear(num_patches)
    if kind == "none":
        return None
    if kind == "mlp":
        return CrossPatchMlp(num_patches, hidden or 4 * num_patches, act_layer=act, drop=drop)
    if kind in ("conv3x3", "dwconv3x3", "dwsep3x3"):
        return CrossPatchConv(dim, grid, kind)
    raise ValueError(f"unknown cross_patch {kind!r}; choose one of {', '.join(CROSS_PATCH)}")


class ClassMlpLayer(nn.Module):
    """One class-MLP layer: only the class embedding is updated, the patches stay frozen.

    The class embedding first aggregates [class; patches] with a linear layer over tokens (one weight
    per token, shared by all channels, like the cross-patch matrix), then goes through a channel MLP.
    """

    def __init__(
        self, dim: int, num_patches: int, hidden: int, act: type[nn.Module], layerscale_init: float
    ) -> None:
        super().__init__()
        self.aggregate_norm = Affine(dim)
        self.aggregate = nn.Linear(num_patches + 1, 1)
        self.aggregate_scale = LayerScale(dim, layerscale_init)
        self.channel_norm = Affine(dim)
        self.channel_mlp = Mlp(dim, hidden, act_layer=act)
        self.channel_scale = LayerScale(dim, layerscale_init)

    def forward(self, cls: torch.Tensor, patches: torch.Tensor) -> torch.Tensor:
        tokens = self.aggregate_norm(torch.cat([cls, patches], dim=1))
        cls = cls + self.aggregate_scale(self.aggregate(tokens.transpose(1, 2)).transpose(1, 2))
        return cls + self.channel_scale(self.channel_mlp(self.channel_norm(cls)))


class ClassMlpPooling(nn.Module):
    """Class-MLP (paper section 2): replaces average pooling by a class embedding and a few layers."""

    def __init__(
        self,
        dim: int,
        num_patches: int,
        hidden: int,
        act: type[nn.Module],
        layerscale_init: float,
        depth: int = 2,
    ) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        self.layers = nn.ModuleList(
            ClassMlpLayer(dim, num_patches, hidden, act, layerscale_init) for _ in range(depth)
        )

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        for layer in self.layers:
            cls = layer(cls, patches)
        return cls[:, 0]

"""ResMLP (Touvron et al., 2021): a residual network of cross-patch linear layers and channel MLPs.

One trunk covers the paper's models, every ablation of its Table 3 and Appendix A, and MLP-Mixer
(an MLP cross-patch sublayer, LayerNorm and no LayerScale; see `resmlp.models.mixer`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from timm.layers import DropPath, Mlp, PatchEmbed
from torch import nn

from resmlp.layers import (
    ACTIVATIONS,
    CROSS_PATCH,
    NORMS,
    ClassMlpPooling,
    LayerScale,
    make_cross_patch,
    make_norm,
)
from resmlp.models.fused_block import fusable, fused_block_forward

POOLINGS = ("avg", "class_mlp")


def default_layerscale_init(depth: int) -> float:
    """LayerScale init by depth, as the authors use it: 0.1 up to 12 blocks, 1e-5 up to 24, else 1e-6."""
    if depth <= 12:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


@dataclass(frozen=True)
class ResMLPConfig:
    """Everything that defines a ResMLP (or Mixer) network; stored with every checkpoint."""

    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    dim: int = 384
    depth: int = 12
    mlp_ratio: float = 4.0
    cross_patch: str = "linear"
    cross_patch_hidden: int | None = None  # width of the 'mlp' cross-patch; None means 4N
    norm: str = "affine"
    act: str = "gelu"
    layerscale: bool = True
    layerscale_init: float | None = None  # None: default_layerscale_init(depth)
    pooling: str = "avg"
    pos_embed: bool = False
    drop_rate: float = 0.0
    drop_path_rate: float = 0.0

    def __post_init__(self) -> None:
        choices = {"cross_patch": CROSS_PATCH, "norm": NORMS, "act": tuple(ACTIVATIONS), "pooling": POOLINGS}
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field}={getattr(self, field)!r} is not one of {', '.join(allowed)}")
        for field in ("img_size", "patch_size", "in_chans", "dim", "depth"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"{field} must be a positive integer, got {getattr(self, field)!r}")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 0 (0 means no head), got {self.num_classes}")
        if self.img_size % self.patch_size:
            raise ValueError(
                f"img_size={self.img_size} is not a multiple of patch_size={self.patch_size}: "
                "the cross-patch layers need a whole grid of patches"
            )
        for field in ("drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, field) < 1.0:
                raise ValueError(f"{field} must be in [0, 1), got {getattr(self, field)}")

    @property
    def grid_size(self) -> int:
        return self.img_size // self.patch_size

    @property
    def num_patches(self) -> int:
        return self.grid_size**2

    @property
    def layerscale_value(self) -> float:
        return self.layerscale_init if self.layerscale_init is not None else default_layerscale_init(self.depth)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ResMLPConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown model option(s) {unknown}; valid options: {', '.join(sorted(known))}")
        return cls(**values)

    def replace(self, **overrides: Any) -> ResMLPConfig:
        return ResMLPConfig.from_dict({**self.to_dict(), **overrides})


class ResMLPBlock(nn.Module):
    """Z = X + Aff(A Aff(X)) ; Y = Z + Aff(C GELU(B Aff(Z)))  (paper Eqs. 2-3), with stochastic depth."""

    def __init__(self, cfg: ResMLPConfig, drop_path: float) -> None:
        super().__init__()
        act = ACTIVATIONS[cfg.act]
        self.cross_patch = make_cross_patch(
            cfg.cross_patch, cfg.dim, cfg.grid_size, cfg.cross_patch_hidden, act, cfg.drop_rate
        )
        if self.cross_patch is not None:
            self.cross_patch_norm = make_norm(cfg.norm, cfg.dim)
            self.cross_patch_scale = _layerscale(cfg)
        self.channel_norm = make_norm(cfg.norm, cfg.dim)
        self.channel_mlp = Mlp(cfg.dim, int(cfg.dim * cfg.mlp_ratio), act_layer=act, drop=cfg.drop_rate)
        self.channel_scale = _layerscale(cfg)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        # training steps of the paper's block design take the fused path (same result, fewer passes over
        # memory; resmlp.models.fused_block); False keeps the plain one
        self.fused_train = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_train and self.training and torch.is_grad_enabled() and fusable(self):
            return fused_block_forward(self, x)
        if self.cross_patch is not None:
            x = x + self.drop_path(self.cross_patch_scale(self.cross_patch(self.cross_patch_norm(x))))
        return x + self.drop_path(self.channel_scale(self.channel_mlp(self.channel_norm(x))))


def _layerscale(cfg: ResMLPConfig) -> nn.Module:
    return LayerScale(cfg.dim, cfg.layerscale_value) if cfg.layerscale else nn.Identity()


class ResMLP(nn.Module):
    """Patch stem, `depth` residual blocks, final norm, average or class-MLP pooling, linear head."""

    def __init__(self, config: ResMLPConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = config or ResMLPConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg
        self.num_features = cfg.dim
        self.stem = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, cfg.dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, cfg.dim)) if cfg.pos_embed else None
        # constant stochastic-depth rate over depth, as in the DeiT ResMLP code
        self.blocks = nn.Sequential(*(ResMLPBlock(cfg, cfg.drop_path_rate) for _ in range(cfg.depth)))
        self.norm = make_norm(cfg.norm, cfg.dim)
        self.class_mlp = (
            ClassMlpPooling(
                cfg.dim,
                cfg.num_patches,
                int(cfg.dim * cfg.mlp_ratio),
                ACTIVATIONS[cfg.act],
                cfg.layerscale_value,
            )
            if cfg.pooling == "class_mlp"
            else None
        )
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(cfg.dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.apply(_init_weights)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)

    # ---------------------------------------------------------------- input checks
    def check_input(self, x: torch.Tensor) -> None:
        """Raise ValueError, saying what was expected and how to adapt, for a batch the model can't take."""
        cfg = self.config
        want = f"(B, {cfg.in_chans}, {cfg.img_size}, {cfg.img_size})"
        if not isinstance(x, torch.Tensor) or x.ndim != 4:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"expected an image batch of shape {want}, got {got}; add a batch dimension "
                             "with x.unsqueeze(0) for a single image")
        if x.shape[1] != cfg.in_chans:
            raise ValueError(
                f"input has {x.shape[1]} channels but the model expects {cfg.in_chans} {want}; repeat grayscale "
                "images to 3 channels (x.expand(-1, 3, -1, -1)) or build the model with in_chans="
                f"{x.shape[1]}"
            )
        if tuple(x.shape[2:]) != (cfg.img_size, cfg.img_size):
            raise ValueError(
                f"input is {x.shape[2]}x{x.shape[3]} but the model expects {cfg.img_size}x{cfg.img_size} {want}: "
                f"the cross-patch matrix fixes N={cfg.num_patches} patches of {cfg.patch_size}px. Resize or crop "
                "the images, or fine-tune the model at the new resolution (resmlp finetune resizes the "
                "cross-patch matrices)"
            )
        if not x.is_floating_point():
            raise ValueError(f"expected a floating-point image tensor, got {x.dtype}; convert with x.float() "
                             "(and scale uint8 images to [0, 1] before normalising)")
        weight_dtype = self.stem.proj.weight.dtype
        if x.dtype != weight_dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"input dtype {x.dtype} differs from the model's {weight_dtype}; use "
                             f"x.to({weight_dtype}) or model.to({x.dtype}), or run under torch.autocast")

    # ---------------------------------------------------------------- forward
    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image batch (B, C, H, W) -> normalised patch tokens (B, N, dim)."""
        self.check_input(x)
        x = self.stem(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return self.norm(self.blocks(x))

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, dim) tokens -> (B, dim) image representation (average or class-MLP)."""
        return tokens.mean(dim=1) if self.class_mlp is None else self.class_mlp(tokens)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------------------------- timm-style helpers
    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    def reset_classifier(self, num_classes: int) -> None:
        """Replace the head by a freshly initialised one for `num_classes` classes (0 removes it)."""
        self.config = self.config.replace(num_classes=num_classes)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.head.apply(_init_weights)
        self.head.to(self.stem.proj.weight.device)

    def get_classifier(self) -> nn.Module:
        return self.head

    def get_intermediate_layers(self, x: torch.Tensor, n: int | Sequence[int] = 1) -> list[torch.Tensor]:
        """Normalised token outputs (B, N, dim) of the last `n` blocks, or of the block indices in `n`."""
        self.check_input(x)
        wanted = set(range(len(self.blocks) - n, len(self.blocks))) if isinstance(n, int) else set(n)
        bad = [i for i in wanted if not 0 <= i < len(self.blocks)]
        if bad:
            raise ValueError(f"block indices {bad} out of range for a model of depth {len(self.blocks)}")
        x = self.stem(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        outputs = []
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i in wanted:
                outputs.append(self.norm(x))
        return outputs

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, for timm's layer-wise lr decay (create_optimizer_v2(layer_decay=...))."""
        blocks = r"^blocks\.(\d+)" if coarse else [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]
        return {"stem": r"^stem|^pos_embed", "blocks": blocks}

    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay besides 1-D ones (timm's optimizer factory asks)."""
        names = {"pos_embed"} if self.pos_embed is not None else set()
        if self.class_mlp is not None:
            names.add("class_mlp.cls_token")
        return names


def _init_weights(module: nn.Module) -> None:
    # DeiT's ResMLP init: truncated normal(0.02) linear weights, zero biases; convs keep PyTorch's init.
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)

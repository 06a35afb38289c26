"""ResMLP (Touvron et al., 2021): a residual network of cross-patch linear layers and channel MLPs.

One trunk covers the paper's models, every ablation of its Table 3 and Appendix A, and MLP-Mixer
(an MLP cross-patch sublayer, LayerNorm and no LayerScale; see `resmlp.models.mixer`).
"""

# no `from __future__ import annotations` here: FX writes a traced forward's string annotations as unknown type
# names (`_torch_Tensor_`), which TorchScript then refuses (timm's test_model_forward_fx_torchscript)
from collections.abc import Sequence
from typing import Any

import torch
from timm.layers import DropPath, Mlp, PatchEmbed, lecun_normal_
from timm.models import checkpoint_seq
from timm.models._features import feature_take_indices  # timm exports it only from this module
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing
from torch.utils.checkpoint import checkpoint

from resmlp.layers import (
    ACTIVATIONS,
    ClassMlpPooling,
    LayerScale,
    make_cross_patch,
    make_norm,
)
from resmlp.models.config import (  # noqa: F401 (re-exported: the config's home before it moved)
    IMAGENET_MEAN,
    IMAGENET_STD,
    POOLINGS,
    SIZE_LIMITS,
    ResMLPConfig,
    default_layerscale_init,
)
from resmlp.models.fused_block import fusable, fused_block_forward
from resmlp.models.resize import fit_state_dict


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
        self.fusable_design = fusable(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # noqa below: TorchScript skips the body of a lone `if not torch.jit.is_scripting()` only; it cannot
        # compile the FX check
        if not torch.jit.is_scripting():  # noqa: SIM102
            # FX graphs (timm's and torchvision's feature extraction, quantisation) record the plain block:
            # the same result, in ops FX, TorchScript and graph rewriters understand
            if (self.fused_train and self.fusable_design and self.training and torch.is_grad_enabled()
                    and not is_fx_symbolic_tracing()):
                return self._fused_forward(x)
        if self.cross_patch is not None:
            x = x + self.drop_path(self.cross_patch_scale(self.cross_patch(self.cross_patch_norm(x))))
        return x + self.drop_path(self.channel_scale(self.channel_mlp(self.channel_norm(x))))

    @torch.jit.unused
    def _fused_forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_block_forward(self, x)


def _layerscale(cfg: ResMLPConfig) -> nn.Module:
    return LayerScale(cfg.dim, cfg.layerscale_value) if cfg.layerscale else nn.Identity()


class ResMLP(nn.Module):
    """Patch stem, `depth` residual blocks, final norm, average or class-MLP pooling, linear head.

    Implements the model interface timm's tools use (forward_intermediates, feature_info, grad
    checkpointing, pretrained_cfg...), so timm's feature extraction, optimizers and data config work on it.
    """

    # not part of the compiled graph: Python-side description of the model
    __jit_ignored_attributes__ = ["config", "pretrained_cfg", "feature_info"]
    __jit_unused_properties__ = ["num_classes", "default_cfg"]

    def __init__(self, config: ResMLPConfig | None = None, **overrides: Any) -> None:
        super().__init__()
        cfg = config or ResMLPConfig()
        if overrides:
            cfg = cfg.replace(**overrides)
        self.config = cfg
        self.num_features = self.head_hidden_size = self.embed_dim = cfg.dim
        self.grad_checkpointing = False
        self.stem = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, cfg.dim)
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.num_patches, cfg.dim)) if cfg.pos_embed else None
        # constant stochastic-depth rate over depth, as in the DeiT ResMLP code
        self.blocks = nn.Sequential(*(ResMLPBlock(cfg, cfg.drop_path_rate) for _ in range(cfg.depth)))
        self.norm = make_norm(cfg.norm, cfg.dim)
        self.class_mlp = _class_mlp(cfg)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(cfg.dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        if _is_mixer(cfg):
            _init_mixer_weights(self)
        else:
            self.apply(_init_weights)
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        self.feature_info = _feature_info(cfg)
        self.pretrained_cfg = describe_model(cfg)
        # files in timm's or DeiT's layout, or for another grid, load through load_state_dict too
        self.register_load_state_dict_pre_hook(_adapt_incoming_state)

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
                f"the images, or move the model to the new size with model.set_input_size(img_size="
                f"{x.shape[2]}) (resamples the cross-patch matrices; fine-tune afterwards for full accuracy)"
            )
        if not x.is_floating_point():
            raise ValueError(f"expected a floating-point image tensor, got {x.dtype}; convert with x.float() "
                             "(and scale uint8 images to [0, 1] before normalising)")
        weight_dtype = self.stem.proj.weight.dtype
        if x.dtype != weight_dtype and not torch.is_autocast_enabled(x.device.type):
            raise ValueError(f"input dtype {x.dtype} differs from the model's {weight_dtype}; use "
                             f"x.to({weight_dtype}) or model.to({x.dtype}), or run under torch.autocast")

    @torch.jit.unused
    def _check_eager_input(self, x: torch.Tensor) -> None:
        # graph capture (fx, dynamo) sees symbolic shapes: the checks are for eager calls only
        if not (is_fx_symbolic_tracing() or torch.compiler.is_compiling()):
            self.check_input(x)

    # ---------------------------------------------------------------- forward
    def _embed(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_scripting():
            self._check_eager_input(x)
        x = self.stem(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        return x

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Image batch (B, C, H, W) -> normalised patch tokens (B, N, dim)."""
        x = self._embed(x)
        if self.grad_checkpointing and not torch.jit.is_scripting():
            x = checkpoint_seq(self.blocks, x)
        else:
            x = self.blocks(x)
        return self.norm(x)

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, N, dim) tokens -> (B, dim) image representation (average or class-MLP)."""
        if self.class_mlp is None:
            return tokens.mean(dim=1)
        return self.class_mlp(tokens)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[torch.Tensor] | tuple[torch.Tensor, list[torch.Tensor]]:
        """Block outputs, timm's way: `indices` an int (the last n blocks), a list of block indices or None (all).

        Intermediates are the raw block outputs (the final norm applied only with norm=True), as (B, dim, H, W)
        maps for output_fmt='NCHW' or (B, N, dim) tokens for 'NLC'. Returns (forward_features output,
        intermediates), or the intermediates alone with intermediates_only=True.
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        batch, _, height, width = x.shape
        x = self._embed(x)
        last = max_index + 1 if stop_early and not torch.jit.is_scripting() else len(self.blocks)
        intermediates: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            if i >= last:
                break
            x = checkpoint(block, x) if self.grad_checkpointing and not torch.jit.is_scripting() else block(x)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        if output_fmt == "NCHW":
            grid_h, grid_w = height // self.stem.patch_size[0], width // self.stem.patch_size[1]
            intermediates = [y.reshape(batch, grid_h, grid_w, -1).permute(0, 3, 1, 2).contiguous()
                             for y in intermediates]
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    @torch.jit.ignore
    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last of `indices` (and the final norm / head on request)."""
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        # keep the config true to the module (same LayerScale init it was built with)
        self.config = self.config.replace(depth=max_index + 1, layerscale_init=self.config.layerscale_value)
        self.feature_info = _feature_info(self.config)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.class_mlp = None
            self.config = self.config.replace(pooling="avg")
            self.reset_classifier(0)
        return take_indices

    # ---------------------------------------------------------------- input size
    @torch.jit.ignore
    def set_input_size(self, img_size: int | tuple[int, int] | None = None,
                       patch_size: int | tuple[int, int] | None = None) -> None:
        """Move the model to another input size and/or patch size, in place, keeping its weights.

        The grid-tied weights are refitted by the rules of `resmlp.models.resize` (ResMLP: bicubic resample of
        the cross-patch matrices; Mixer: exact block-diagonal expansion for an integer grid ratio, with the
        token-MLP width growing K^2 times, else resampling; stem: timm's resample_patch_embed).
        """
        cfg = self.config
        new_cfg = cfg.replace(
            img_size=_square(img_size, "img_size") if img_size is not None else cfg.img_size,
            patch_size=_square(patch_size, "patch_size") if patch_size is not None else cfg.patch_size,
            cross_patch_hidden=scaled_token_mlp_width(cfg, _grid_of(cfg, img_size, patch_size)),
            layerscale_init=cfg.layerscale_value,
        )
        if new_cfg == cfg:
            return
        weight = self.stem.proj.weight
        with torch.device("meta"):
            new = ResMLP(new_cfg)
        target = {k: v.shape for k, v in new.state_dict().items()}
        state = fit_state_dict(self.state_dict(), target)
        new.load_state_dict(state, assign=True)
        new.to(device=weight.device, dtype=weight.dtype)
        for name, child in new.named_children():
            setattr(self, name, child)
        self.pos_embed = new.pos_embed
        self.config = new_cfg
        self.feature_info = _feature_info(new_cfg)
        self.pretrained_cfg = {**self.pretrained_cfg, **_input_cfg(new_cfg)}
        self.train(self.training)

    # ---------------------------------------------------------------- timm-style helpers
    @property
    def num_classes(self) -> int:
        return self.config.num_classes

    @property
    def default_cfg(self) -> dict[str, Any]:
        """timm's older name for pretrained_cfg."""
        return self.pretrained_cfg

    @default_cfg.setter
    def default_cfg(self, value: dict[str, Any]) -> None:
        self.pretrained_cfg = value

    @torch.jit.ignore
    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head by a freshly initialised one for `num_classes` classes (0 removes it).

        global_pool: timm's argument; only 'avg' (or None, keep) is meaningful here, '' keeps the pooling.
        """
        if global_pool not in (None, "", "avg"):
            raise ValueError(f"global_pool={global_pool!r}: this model pools with 'avg' or its class-MLP")
        self.config = self.config.replace(num_classes=num_classes)
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()
        self.head.apply(_init_weights)
        self.head.to(self.stem.proj.weight.device)
        self.head.train(self.training)
        self.pretrained_cfg = {**self.pretrained_cfg, "num_classes": num_classes}

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of storing them (less memory)."""
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_intermediate_layers(self, x: torch.Tensor, n: int | Sequence[int] = 1) -> list[torch.Tensor]:
        """Normalised token outputs (B, N, dim) of the last `n` blocks, or of the block indices in `n`."""
        wanted = list(range(len(self.blocks) - n, len(self.blocks))) if isinstance(n, int) else list(n)
        bad = [i for i in wanted if not 0 <= i < len(self.blocks)]
        if bad:
            raise ValueError(f"block indices {bad} out of range for a model of depth {len(self.blocks)}")
        return self.forward_intermediates(x, wanted, norm=True, output_fmt="NLC", intermediates_only=True)

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """Parameter groups by depth, for timm's layer-wise lr decay (create_optimizer_v2(layer_decay=...))."""
        blocks = r"^blocks\.(\d+)" if coarse else [(r"^blocks\.(\d+)", None), (r"^norm", (99999,))]
        return {"stem": r"^stem|^pos_embed", "blocks": blocks}

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        """Parameter names excluded from weight decay besides 1-D ones (timm's optimizer factory asks)."""
        names = {"pos_embed"} if self.pos_embed is not None else set()
        if self.class_mlp is not None:
            names.add("class_mlp.cls_token")
        return names


def _class_mlp(cfg: ResMLPConfig) -> ClassMlpPooling | None:
    if cfg.pooling != "class_mlp":
        return None
    return ClassMlpPooling(cfg.dim, cfg.num_patches, int(cfg.dim * cfg.mlp_ratio), ACTIVATIONS[cfg.act],
                           cfg.layerscale_value)


def _feature_info(cfg: ResMLPConfig) -> list[dict[str, Any]]:
    return [dict(module=f"blocks.{i}", num_chs=cfg.dim, reduction=cfg.patch_size) for i in range(cfg.depth)]


def _square(size: int | tuple[int, int], what: str) -> int:
    if isinstance(size, int):
        return size
    if len(size) != 2 or size[0] != size[1]:
        raise ValueError(f"{what}={tuple(size)}: the patch grid must be square (one size, or (s, s))")
    return int(size[0])


def _grid_of(cfg: ResMLPConfig, img_size: Any, patch_size: Any) -> int:
    img = _square(img_size, "img_size") if img_size is not None else cfg.img_size
    patch = _square(patch_size, "patch_size") if patch_size is not None else cfg.patch_size
    return img // patch


def scaled_token_mlp_width(cfg: ResMLPConfig, new_grid: int) -> int | None:
    """Token-MLP width of a Mixer `cfg` moved to a `new_grid` patch grid: K^2 times wider when the grid grows
    by an integer K (the exact block-diagonal expansion), unchanged otherwise."""
    if cfg.cross_patch != "mlp":
        return cfg.cross_patch_hidden
    hidden = cfg.cross_patch_hidden or 4 * cfg.num_patches
    old_grid = cfg.grid_size
    factor = new_grid // old_grid
    return hidden * factor**2 if factor > 1 and new_grid == factor * old_grid else hidden


def _input_cfg(cfg: ResMLPConfig) -> dict[str, Any]:
    return {"input_size": (cfg.in_chans, cfg.img_size, cfg.img_size), "num_classes": cfg.num_classes,
            "fixed_input_size": True}


def describe_model(cfg: ResMLPConfig) -> dict[str, Any]:
    """timm's pretrained_cfg for a model without published weights: its own input size and classes, ImageNet
    statistics (3 channels) or mean 0.5 / std 0.5 per channel (others), and the stem and head names."""
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if cfg.in_chans == 3 else ((0.5,) * cfg.in_chans,) * 2
    return {"url": "", "architecture": None, "tag": None, "custom_load": False, **_input_cfg(cfg),
            "pool_size": None, "crop_pct": 0.875, "interpolation": "bicubic", "mean": mean, "std": std,
            "first_conv": "stem.proj", "classifier": "head"}


def _adapt_incoming_state(module: ResMLP, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """load_state_dict pre-hook: a training checkpoint's model weights, in timm's or DeiT's key layout, or
    for another grid, are converted to this model's names and shapes first (in place)."""
    from resmlp.models.formats import adapt_state_dict

    own = [k for k in state_dict if k.startswith(prefix)]
    local = {k[len(prefix):]: state_dict[k] for k in own}
    adapted = adapt_state_dict(local, module)
    if adapted is local:
        return
    for k in own:
        del state_dict[k]
    state_dict.update({prefix + k: v for k, v in adapted.items()})


def _is_mixer(cfg: ResMLPConfig) -> bool:
    """MLP-Mixer's block design (resmlp.models.mixer): token-mixing MLP, LayerNorm, no LayerScale."""
    return cfg.cross_patch == "mlp" and cfg.norm == "layernorm" and not cfg.layerscale


def _init_mixer_weights(model: nn.Module) -> None:
    """MLP-Mixer's own init, as its authors' Flax code (google-research/vision_transformer models_mixer.py: Dense
    and Conv at Flax's default lecun_normal with zero biases, the head's kernel zeros) and timm's
    mlp_mixer._init_weights(..., flax=True); timm's non-Flax default (xavier_uniform) is its author's own."""
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and name == "head":
            nn.init.zeros_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            lecun_normal_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


def _init_weights(module: nn.Module) -> None:
    # DeiT's ResMLP init: truncated normal(0.02) linear weights, zero biases; convs keep PyTorch's init.
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)

"""ResMLPConfig: everything that defines a ResMLP (or Mixer) network, and its checks.

Kept free of torch and timm so that what needs only the configuration (the presets, `resmlp models`' parameter
and MAC counts) loads in a fraction of a second; resmlp.models.resmlp builds the network from it.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass
from typing import Any

# the names each choice accepts (resmlp.layers maps them to modules)
ACTIVATION_NAMES = ("gelu", "relu", "silu", "hardswish")
NORMS = ("affine", "layernorm", "batchnorm", "l2", "none")
CROSS_PATCH = ("linear", "none", "mlp", "conv3x3", "dwconv3x3", "dwsep3x3")

POOLINGS = ("avg", "class_mlp")
# the largest value of each size a real run could use, with room to spare: the paper's largest models have
# 36 blocks, width 768 and 224-px inputs (384 px fine-tuned); past these a typo (an extra zero) would allocate
# until memory runs out instead of failing here. Every config passes here: recipes, --set, checkpoints.
SIZE_LIMITS = {"img_size": 4096, "patch_size": 4096, "in_chans": 64, "dim": 16384, "depth": 1000,
               "num_classes": 1_000_000, "cross_patch_hidden": 65536}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


_KIND_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
# the types each ResMLPConfig field accepts (float: any finite int or float; int: not a bool, not 8.0)
_FIELD_KINDS: dict[str, tuple[Any, ...]] = {
    "img_size": (int,), "patch_size": (int,), "in_chans": (int,), "num_classes": (int,), "dim": (int,),
    "depth": (int,), "mlp_ratio": (float,), "cross_patch": (str,), "cross_patch_hidden": (int, None),
    "norm": (str,), "act": (str,), "layerscale": (bool,), "layerscale_init": (float, None), "pooling": (str,),
    "pos_embed": (bool,), "drop_rate": (float,), "drop_path_rate": (float,),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def default_layerscale_init(depth: int) -> float:
    """LayerScale init by depth, CaiT's rule, which the paper follows (Section 3.1: "as a function of the depth by
    following CaiT"; CaiT, Section 2.1: 0.1 for depth up to 18, 1e-5 for depth 24, 1e-6 deeper): 0.1 up to 18
    blocks, 1e-5 up to 24, else 1e-6. The authors' S12 / S24 / S36 (0.1 / 1e-5 / 1e-6) follow it; their B24/8
    (DeiT's resmlpB_24, width 768, 24 blocks) starts at 1e-6 instead, which the B24 presets set themselves."""
    if depth <= 18:
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
        self._check_types()
        choices = {"cross_patch": CROSS_PATCH, "norm": NORMS, "act": ACTIVATION_NAMES, "pooling": POOLINGS}
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field}={getattr(self, field)!r} is not one of {', '.join(allowed)}")
        for field in ("img_size", "patch_size", "in_chans", "dim", "depth"):
            if int(getattr(self, field)) < 1:
                raise ValueError(f"{field} must be a positive integer, got {getattr(self, field)!r}")
        for field, limit in SIZE_LIMITS.items():
            value = getattr(self, field)
            if value is not None and value > limit:
                raise ValueError(f"{field}={value} is above {limit}, the largest this project builds (allowed: "
                                 f"1 to {limit}); was a digit added by mistake?")
        if not 0 < self.mlp_ratio <= 64:
            raise ValueError(f"mlp_ratio={self.mlp_ratio} is outside (0, 64]")
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

    def _check_types(self) -> None:
        """Each field of its type, strictly: a config read from a file or typed by hand says dim=8.0, depth=true or
        mlp_ratio=NaN by mistake, and the model would fail (or compute NaN) far from the cause."""
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            kinds = _FIELD_KINDS[field.name]
            if value is None and None in kinds:
                continue
            if float in kinds:
                if _is_number(value) and math.isfinite(value):
                    continue
            elif isinstance(value, kinds[0]) and (kinds[0] is bool or not isinstance(value, bool)):
                continue
            expected = " or ".join("null" if k is None else _KIND_NAMES[k] for k in kinds)
            raise ValueError(f"{field.name}={value!r} is not {expected}")

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
            close = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
            hints = [f"{name!r} (did you mean {match[0]!r}?)" for name, match in close.items() if match]
            if len(hints) == len(unknown):  # every one a typo: the suggestions say enough
                raise ValueError(f"unknown model option {', '.join(hints)}")
            raise ValueError(f"unknown model option(s) {unknown}; valid options: {', '.join(sorted(known))}")
        return cls(**values)

    def replace(self, **overrides: Any) -> ResMLPConfig:
        return ResMLPConfig.from_dict({**self.to_dict(), **overrides})

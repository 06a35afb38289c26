"""Named presets, the paper's Table 3 rows, published weights, and registration with timm."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from resmlp.models.config import ResMLPConfig
from resmlp.models.mixer import MIXER_PRESETS

_S = dict(dim=384)
# the authors start B24/8's LayerScale at 1e-6 although it has 24 blocks (S24: 1e-5, CaiT's rule): DeiT's
# resmlp_models.py resmlpB_24 (patch_size=8, init_scale=1e-6) and timm's resmlp_big_24_224 (patch 8,
# init_values=1e-6). No published code defines the paper's B24/16 (Table 1): it takes B24/8's 1e-6, the
# value of the same width and depth, rather than CaiT's 1e-5 for depth 24
_B = dict(dim=768, layerscale_init=1e-6)

PRESETS: dict[str, dict[str, Any]] = {
    "resmlp_s12": dict(_S, depth=12),
    "resmlp_s24": dict(_S, depth=24),
    "resmlp_s36": dict(_S, depth=36),
    "resmlp_b24": dict(_B, depth=24),
    "resmlp_s12_p14": dict(_S, depth=12, patch_size=14),
    "resmlp_s12_p8": dict(_S, depth=12, patch_size=8),
    "resmlp_b24_p8": dict(_B, depth=24, patch_size=8),
    "resmlp_s12_cmlp": dict(_S, depth=12, pooling="class_mlp"),
    "resmlp_s24_cmlp": dict(_S, depth=24, pooling="class_mlp"),
    "resmlp_s36_cmlp": dict(_S, depth=36, pooling="class_mlp"),
    **MIXER_PRESETS,
}

# the same architectures as DeiT's resmlp_models.py and timm's mlp_mixer.py name them: `--model resmlp_12` (DeiT's
# main.py) and `--model resmlp_12_224` (timm's train.py) build our preset, in the one grammar (resmlp.build);
# timm:resmlp_12_224 stays timm's own module
PRESET_ALIASES: dict[str, str] = {
    "resmlp_12": "resmlp_s12", "resmlp_24": "resmlp_s24", "resmlp_36": "resmlp_s36", "resmlpB_24": "resmlp_b24",
    "resmlp_12_224": "resmlp_s12", "resmlp_24_224": "resmlp_s24", "resmlp_36_224": "resmlp_s36",
    "resmlp_big_24_224": "resmlp_b24",
}

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class PublishedWeights:
    url: str
    num_classes: int = 1000
    # preprocessing the weights were trained with (DeiT's ResMLP evaluation uses crop 0.9)
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    crop_pct: float = 0.9
    hf_hub_id: str | None = None  # timm's copy of the same weights on the Hugging Face Hub (timm's layout)
    extra: dict[str, Any] = field(default_factory=dict)


_FB = "https://dl.fbaipublicfiles.com/deit/"
_JX = "https://github.com/rwightman/pytorch-image-models/releases/download/v0.1-vitjx/"
_MIXER = dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), crop_pct=0.875)


def _hub(timm_name: str) -> str:
    return f"timm/{timm_name}"

def _google_mixer(size: str, ft_hash: str, in21k_hash: str) -> dict[str, PublishedWeights]:
    """Google's Mixer weights as timm republished them: ImageNet-21k pre-trained, and fine-tuned on 1k."""
    return {
        "goog_in21k_ft_in1k": PublishedWeights(_JX + f"jx_mixer_{size}_224-{ft_hash}.pth", **_MIXER,
                                               hf_hub_id=_hub(f"mixer_{size}_224.goog_in21k_ft_in1k")),
        "goog_in21k": PublishedWeights(_JX + f"jx_mixer_{size}_224_in21k-{in21k_hash}.pth", num_classes=21843,
                                       **_MIXER, hf_hub_id=_hub(f"mixer_{size}_224.goog_in21k")),
    }


# preset -> tag -> weights; the first tag is the default. Sources: the DeiT repository's ResMLP model
# zoo and timm's pretrained configs. The published "ResMLP-B24" weights are the 8x8-patch model.
PUBLISHED: dict[str, dict[str, PublishedWeights]] = {
    "resmlp_s12": {
        "fb_in1k": PublishedWeights(_FB + "resmlp_12_no_dist.pth", hf_hub_id=_hub("resmlp_12_224.fb_in1k")),
        "fb_distilled_in1k": PublishedWeights(
            _FB + "resmlp_12_dist.pth", hf_hub_id=_hub("resmlp_12_224.fb_distilled_in1k")
        ),
        "fb_dino": PublishedWeights(_FB + "resmlp_12_dino.pth", num_classes=0, hf_hub_id=_hub("resmlp_12_224.fb_dino")),
    },
    "resmlp_s24": {
        "fb_in1k": PublishedWeights(_FB + "resmlp_24_no_dist.pth", hf_hub_id=_hub("resmlp_24_224.fb_in1k")),
        "fb_distilled_in1k": PublishedWeights(
            _FB + "resmlp_24_dist.pth", hf_hub_id=_hub("resmlp_24_224.fb_distilled_in1k")
        ),
        "fb_dino": PublishedWeights(_FB + "resmlp_24_dino.pth", num_classes=0, hf_hub_id=_hub("resmlp_24_224.fb_dino")),
    },
    "resmlp_s36": {
        "fb_in1k": PublishedWeights(_FB + "resmlp_36_no_dist.pth", hf_hub_id=_hub("resmlp_36_224.fb_in1k")),
        "fb_distilled_in1k": PublishedWeights(
            _FB + "resmlp_36_dist.pth", hf_hub_id=_hub("resmlp_36_224.fb_distilled_in1k")
        ),
    },
    "resmlp_b24_p8": {
        "fb_in1k": PublishedWeights(_FB + "resmlpB_24_no_dist.pth", hf_hub_id=_hub("resmlp_big_24_224.fb_in1k")),
        "fb_distilled_in1k": PublishedWeights(
            _FB + "resmlpB_24_dist.pth", hf_hub_id=_hub("resmlp_big_24_224.fb_distilled_in1k")
        ),
        "fb_in22k_ft_in1k": PublishedWeights(
            _FB + "resmlpB_24_22k.pth", hf_hub_id=_hub("resmlp_big_24_224.fb_in22k_ft_in1k")
        ),
    },
    "mixer_b16": _google_mixer("b16", "76587d61", "617b3de2"),
    "mixer_l16": _google_mixer("l16", "92f9adc4", "846aa33c"),
}


@dataclass(frozen=True)
class Table3Row:
    """One row of the paper's Table 3 (or a preset), with the parameters and GFLOPs the paper prints."""

    label: str
    preset: str
    overrides: dict[str, Any]
    paper_params_m: float
    paper_gmacs: float


TABLE3_ROWS: list[Table3Row] = [
    Table3Row("ResMLP-S12", "resmlp_s12", {}, 15.4, 3.0),
    Table3Row("ResMLP-S24", "resmlp_s24", {}, 30.0, 6.0),
    Table3Row("ResMLP-B24", "resmlp_b24", {}, 115.7, 23.0),
    Table3Row("S12 Aff -> LayerNorm", "resmlp_s12", {"norm": "layernorm"}, 15.4, 3.0),
    Table3Row("S12 avg pooling -> class-MLP", "resmlp_s12_cmlp", {}, 17.7, 3.0),
    Table3Row("S12 linear -> none", "resmlp_s12", {"cross_patch": "none"}, 14.9, 2.8),
    Table3Row("S12 linear -> MLP", "resmlp_s12", {"cross_patch": "mlp"}, 18.6, 4.3),
    Table3Row("S12 linear -> conv 3x3", "resmlp_s12", {"cross_patch": "conv3x3"}, 30.8, 6.0),
    Table3Row("S12 linear -> conv 3x3 depth-wise", "resmlp_s12", {"cross_patch": "dwconv3x3"}, 14.9, 2.8),
    Table3Row("S12 linear -> conv 3x3 depth-separable", "resmlp_s12", {"cross_patch": "dwsep3x3"}, 16.7, 3.2),
    Table3Row("ResMLP-S12/14", "resmlp_s12_p14", {}, 15.6, 4.0),
    Table3Row("ResMLP-S12/8", "resmlp_s12_p8", {}, 22.1, 14.0),
    Table3Row("ResMLP-B24/8", "resmlp_b24_p8", {}, 129.1, 100.2),
]


def list_models(pattern: str = "*") -> list[str]:
    """Names of the presets matching a shell-style pattern (e.g. 'resmlp_s*')."""
    from fnmatch import fnmatch

    return sorted(name for name in PRESETS if fnmatch(name, pattern))


def model_config(name: str, **overrides: Any) -> ResMLPConfig:
    """The configuration of preset `name`, with `overrides` applied and validated."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; available: {', '.join(list_models())}"
        raise ValueError(f"unknown model {name!r}{hint}")
    if overrides.pop("dynamic_img_size", False):  # False: timm's default, accepted as timm's ViTs accept it
        raise ValueError(f"dynamic_img_size=True: {name} has no dynamic image size, as its cross-patch layer is tied "
                         "to the number of patches and no resampling of it is exact (docs/models.md, \"Resolution "
                         "change\"); change the size once: model.set_input_size(img_size=N), create_model(..., "
                         "img_size=N) or resmlp finetune CHECKPOINT --img-size N")
    return ResMLPConfig.from_dict({**PRESETS[name], **overrides})


def published_weights(name: str, tag: bool | str = True) -> PublishedWeights:
    """The published weights of preset `name` (`tag=True` for the default tag)."""
    tags = PUBLISHED.get(name)
    if not tags:
        with_weights = ", ".join(sorted(PUBLISHED))
        raise ValueError(f"no published weights for {name!r}; presets with weights: {with_weights}")
    if tag is True:
        return next(iter(tags.values()))
    if tag not in tags:
        raise ValueError(f"{name!r} has no weights tagged {tag!r}; tags: {', '.join(tags)}")
    return tags[tag]

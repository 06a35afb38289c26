"""MLP-Mixer (Tolstikhin et al., 2021) as a configuration of the shared ResMLP trunk.

A Mixer layer is a ResMLP block whose cross-patch sublayer is the token-mixing MLP (width D_S),
whose pre-normalisation is LayerNorm and which has no LayerScale.
"""

from __future__ import annotations

from typing import Any

# name: (width C, depth, D_S, D_C) from the Mixer paper's Table 1
MIXER_SIZES: dict[str, tuple[int, int, int, int]] = {
    "s": (512, 8, 256, 2048),
    "b": (768, 12, 384, 3072),
    "l": (1024, 24, 512, 4096),
    "h": (1280, 32, 640, 5120),
}


def mixer_config(size: str, patch_size: int) -> dict[str, Any]:
    """ResMLPConfig options for Mixer-{size}/{patch_size}."""
    dim, depth, tokens_hidden, channels_hidden = MIXER_SIZES[size]
    return dict(
        dim=dim,
        depth=depth,
        patch_size=patch_size,
        cross_patch="mlp",
        cross_patch_hidden=tokens_hidden,
        mlp_ratio=channels_hidden / dim,
        norm="layernorm",
        layerscale=False,
    )


MIXER_PRESETS: dict[str, dict[str, Any]] = {
    f"mixer_{size}{patch}": mixer_config(size, patch)
    for size, patch in [("s", 32), ("s", 16), ("b", 32), ("b", 16), ("l", 32), ("l", 16), ("h", 14)]
}

"""Moving a trained model to another input resolution (fine-tuning and transfer).

The cross-patch layers are tied to the patch grid, so a new resolution needs new weights. The rules (ResMLP:
bicubic resampling of the cross-patch matrices; Mixer: the exact block-diagonal expansion for an integer
grid ratio, resampling otherwise; convolutional cross-patch layers: nothing to do) are implemented once, in
`resmlp.models.resize`, and applied by `ResMLP.set_input_size`; these functions return a moved copy.
"""

from __future__ import annotations

import copy

from resmlp.models.resize import resize_matrix  # noqa: F401 (part of this module's API)
from resmlp.models.resmlp import ResMLP


def change_resolution(model: ResMLP, img_size: int) -> ResMLP:
    """A copy of `model` for `img_size` inputs (same patch size), weights carried over (ResMLP.set_input_size)."""
    cfg = model.config
    if img_size % cfg.patch_size:
        raise ValueError(
            f"img_size={img_size} is not a multiple of the patch size {cfg.patch_size}: the cross-patch "
            f"weights can only move to a whole patch grid (try {img_size // cfg.patch_size * cfg.patch_size} "
            f"or {(img_size // cfg.patch_size + 1) * cfg.patch_size})"
        )
    moved = copy.deepcopy(model)
    moved.set_input_size(img_size=img_size)
    return moved


def resize_cross_patch(model: ResMLP, img_size: int) -> ResMLP:
    """Copy of a ResMLP at `img_size` with every grid-tied weight interpolated to the new patch grid."""
    return change_resolution(model, img_size)


def expand_token_mixing(model: ResMLP, factor: int) -> ResMLP:
    """Mixer at `factor` times the resolution, initialised block-diagonally (Mixer paper, fine-tuning):
    on a K x K tiled image it gives exactly the logits of the original on one tile."""
    cfg = model.config
    if cfg.cross_patch != "mlp":
        raise ValueError(f"block-diagonal expansion applies to token-mixing MLPs (Mixer), not {cfg.cross_patch!r}")
    if factor < 1:
        raise ValueError(f"the expansion factor must be a positive integer, got {factor}")
    return change_resolution(model, cfg.img_size * factor)

"""Moving a trained model to another input resolution (fine-tuning and transfer).

The cross-patch layers are tied to the patch grid, so a new resolution needs new weights:
- ResMLP (linear cross-patch, class-MLP aggregation, position embedding): every matrix A, seen as a
  function of (output row, output col, input row, input col), is resampled to the new grid by bicubic
  interpolation, and divided by N'/N so that a sum over N' inputs keeps the magnitude of the sum over N.
  This is an approximation: a smooth, convolution-like A transfers well, the sharp self-spike of late
  layers is blurred; fine-tuning at the new resolution repairs the difference.
- MLP-Mixer (token-mixing MLP): the exact block-diagonal initialisation of the Mixer paper for an integer
  factor K: the image is treated as K x K tiles, each mixed by a copy of the pre-trained MLP.
- Convolutional or absent cross-patch layers need nothing: they do not depend on the grid size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from resmlp.models.resmlp import ResMLP


def change_resolution(model: ResMLP, img_size: int) -> ResMLP:
    """A copy of `model` for `img_size` inputs (same patch size), weights carried over as described above."""
    cfg = model.config
    if img_size % cfg.patch_size:
        raise ValueError(
            f"img_size={img_size} is not a multiple of the patch size {cfg.patch_size}: the cross-patch "
            f"weights can only move to a whole patch grid (try {img_size // cfg.patch_size * cfg.patch_size} "
            f"or {(img_size // cfg.patch_size + 1) * cfg.patch_size})"
        )
    if cfg.cross_patch == "mlp":
        if img_size % cfg.img_size:
            raise ValueError(
                f"a token-mixing MLP (Mixer) moves only to an integer multiple of its resolution "
                f"{cfg.img_size} (block-diagonal expansion), not to {img_size}"
            )
        return expand_token_mixing(model, img_size // cfg.img_size)
    return resize_cross_patch(model, img_size)


def resize_cross_patch(model: ResMLP, img_size: int) -> ResMLP:
    """Copy of a ResMLP at `img_size` with every grid-tied weight interpolated to the new patch grid."""
    cfg = model.config
    new = ResMLP(cfg.replace(img_size=img_size)).to(model.stem.proj.weight.dtype)
    old_grid, new_grid = cfg.grid_size, img_size // cfg.patch_size
    state = model.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            if name.endswith("cross_patch.weight") and value.ndim == 2:
                state[name] = resize_matrix(value, old_grid, new_grid)
            elif name.endswith("cross_patch.bias") and value.ndim == 1 and value.numel() == old_grid**2:
                state[name] = _resize_grid(value.reshape(1, 1, old_grid, old_grid), new_grid).flatten()
            elif name.endswith("aggregate.weight"):  # class-MLP: one weight for the class token, then patches
                patches = value[:, 1:].reshape(1, 1, old_grid, old_grid)
                resized = _resize_grid(patches, new_grid).reshape(1, -1) * (old_grid / new_grid) ** 2
                state[name] = torch.cat([value[:, :1], resized], dim=1)
            elif name == "pos_embed":
                grid = value.reshape(1, old_grid, old_grid, -1).permute(0, 3, 1, 2)
                state[name] = _resize_grid(grid, new_grid).permute(0, 2, 3, 1).reshape(1, new_grid**2, -1)
    new.load_state_dict(state)
    return new


def resize_matrix(weight: torch.Tensor, old_grid: int, new_grid: int) -> torch.Tensor:
    """Resample an (N, N) cross-patch matrix to (N', N'), scaling by N/N' to keep sums comparable."""
    a = weight.reshape(old_grid, old_grid, old_grid**2).permute(2, 0, 1).unsqueeze(0)  # inputs as channels
    a = _resize_grid(a, new_grid)[0].permute(1, 2, 0).reshape(new_grid**2, old_grid, old_grid)  # rows done
    a = _resize_grid(a.unsqueeze(0), new_grid)[0].reshape(new_grid**2, new_grid**2)  # columns done
    return a * (old_grid / new_grid) ** 2


def _resize_grid(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bicubic resampling of (B, C, g, g) to (B, C, size, size), in float32 for accuracy."""
    return F.interpolate(x.float(), size=(size, size), mode="bicubic", align_corners=False).to(x.dtype)


def expand_token_mixing(model: ResMLP, factor: int) -> ResMLP:
    """Mixer at `factor` times the resolution, initialised block-diagonally (Mixer paper, fine-tuning).

    The new token sequence is the raster order of the big grid, not tiles one after another, so the
    copies of W1 and W2 are scattered to the token positions of each K x K tile.
    """
    cfg = model.config
    if cfg.cross_patch != "mlp":
        raise ValueError(f"block-diagonal expansion applies to token-mixing MLPs (Mixer), not {cfg.cross_patch!r}")
    if factor < 1:
        raise ValueError(f"the expansion factor must be a positive integer, got {factor}")
    grid = cfg.grid_size
    hidden = model.blocks[0].cross_patch.fc1.out_features
    new = ResMLP(cfg.replace(img_size=cfg.img_size * factor, cross_patch_hidden=hidden * factor**2))
    new = new.to(model.stem.proj.weight.dtype)
    # token_index[t, j]: position in the big grid of local token j of tile t
    rows = torch.arange(grid * factor).reshape(factor, grid)
    token_index = torch.stack([
        (rows[ti][:, None] * grid * factor + rows[tj][None, :]).flatten()
        for ti in range(factor) for tj in range(factor)
    ])
    state = model.state_dict()
    new_state = new.state_dict()
    with torch.no_grad():
        for name, value in state.items():
            if ".cross_patch.fc" not in name:
                new_state[name] = value
                continue
            out = torch.zeros_like(new_state[name])
            for t, tokens in enumerate(token_index):
                units = slice(t * hidden, (t + 1) * hidden)
                if name.endswith("fc1.weight"):
                    out[units][:, tokens] = value
                elif name.endswith("fc1.bias"):
                    out[units] = value
                elif name.endswith("fc2.weight"):
                    out[tokens, units] = value
                else:  # fc2.bias
                    out[tokens] = value
            new_state[name] = out
    new.load_state_dict(new_state)
    return new

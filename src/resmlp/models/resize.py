"""Moving grid-tied weights to another patch grid (input size or patch size): the one implementation.

`ResMLP.set_input_size`, checkpoint loading at another `img_size` and `resmlp.transfer` (fine-tuning) all
call `fit_state_dict`, which fits each tensor of a state dict (this project's key names) to the shape the
target model has. The rules, by layer:
- linear cross-patch matrix A (N x N, ResMLP), its bias, the class-MLP aggregation weights and the
  position embedding: A, seen as a function of (output row, output col, input row, input col), is resampled
  bicubically to the new grid and divided by N'/N, so that a sum over N' inputs keeps the magnitude of the
  sum over N. An approximation: a smooth, convolution-like A transfers well, the sharp self-spike of late
  layers is blurred; fine-tuning at the new resolution repairs the difference.
- token-mixing MLP (Mixer) when the new grid is K times the old one and the hidden width K^2 times: the
  exact block-diagonal expansion of the Mixer paper: the image is treated as K x K tiles, each mixed by a
  copy of the pre-trained MLP (a K x K tiled image gives the same logits). Otherwise (non-integer ratio,
  hidden width unchanged) the token dimension of fc1/fc2 is resampled like A.
- stem projection, when the patch size changes: timm's `resample_patch_embed` (FlexiViT's pseudo-inverse
  resize), so a patch embeds as the old one did on the correspondingly resized image.
- convolutional or absent cross-patch layers have no grid-tied weights.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import resample_patch_embed


def _grid(num_patches: int) -> int:
    grid = math.isqrt(num_patches)
    if grid * grid != num_patches:
        raise ValueError(f"{num_patches} patches do not form a square grid")
    return grid


def resize_grid(x: torch.Tensor, size: int) -> torch.Tensor:
    """Bicubic resampling of (B, C, g, g) to (B, C, size, size), in float32 for accuracy."""
    if x.shape[-1] == size:
        return x
    return F.interpolate(x.float(), size=(size, size), mode="bicubic", align_corners=False).to(x.dtype)


def resize_tokens(x: torch.Tensor, dim: int, new_grid: int, scale: bool) -> torch.Tensor:
    """Resample tensor dimension `dim` (a raster-ordered patch grid) to new_grid^2 entries.

    scale: divide by N'/N (for weights that sum over the patches) so the sum keeps its magnitude.
    """
    old_grid = _grid(x.shape[dim])
    moved = x.movedim(dim, -1)
    lead = moved.shape[:-1]
    out = resize_grid(moved.reshape(1, -1, old_grid, old_grid), new_grid).reshape(*lead, new_grid**2)
    if scale:
        out = out * (old_grid / new_grid) ** 2
    return out.movedim(-1, dim)


def resize_matrix(weight: torch.Tensor, old_grid: int, new_grid: int) -> torch.Tensor:
    """Resample an (N, N) cross-patch matrix to (N', N'), scaling by N/N' to keep sums comparable."""
    if _grid(weight.shape[0]) != old_grid:
        raise ValueError(f"a {tuple(weight.shape)} matrix is not on a {old_grid}x{old_grid} grid")
    rows_done = resize_tokens(weight, 0, new_grid, scale=False)
    return resize_tokens(rows_done, 1, new_grid, scale=True)


def tile_token_index(grid: int, factor: int) -> torch.Tensor:
    """(K^2, N) positions, in the raster order of the K-times grid, of the local tokens of each K x K tile."""
    rows = torch.arange(grid * factor).reshape(factor, grid)
    return torch.stack([
        (rows[ti][:, None] * grid * factor + rows[tj][None, :]).flatten()
        for ti in range(factor) for tj in range(factor)
    ])


def expand_token_mlp(name: str, value: torch.Tensor, grid: int, factor: int) -> torch.Tensor:
    """One token-mixing MLP tensor (fc1/fc2 weight or bias) expanded block-diagonally to a K-times grid.

    The new token sequence is the raster order of the big grid, not tiles one after another, so the copies
    of W1 and W2 are scattered to the token positions of each tile.
    """
    index = tile_token_index(grid, factor)
    if name.endswith("fc1.bias"):
        return value.repeat(factor**2)
    if name.endswith("fc2.bias"):
        out = value.new_zeros(grid**2 * factor**2)
        for tokens in index:
            out[tokens] = value
        return out
    hidden = value.shape[0] if name.endswith("fc1.weight") else value.shape[1]
    big_hidden, big_tokens = hidden * factor**2, grid**2 * factor**2
    shape = (big_hidden, big_tokens) if name.endswith("fc1.weight") else (big_tokens, big_hidden)
    out = value.new_zeros(shape)
    for t, tokens in enumerate(index):
        units = torch.arange(t * hidden, (t + 1) * hidden)
        if name.endswith("fc1.weight"):
            out[units[:, None], tokens[None, :]] = value
        else:
            out[tokens[:, None], units[None, :]] = value
    return out


def _fit_token_mlp(name: str, value: torch.Tensor, target: torch.Size) -> torch.Tensor | None:
    if name.endswith("fc1.weight"):
        (hidden, tokens), (new_hidden, new_tokens) = value.shape, target
    elif name.endswith("fc2.weight"):
        (tokens, hidden), (new_tokens, new_hidden) = value.shape, target
    elif name.endswith("fc1.bias"):
        return value.repeat(target[0] // value.shape[0]) if target[0] % value.shape[0] == 0 else None
    else:  # fc2.bias: one per token
        tokens, new_tokens, hidden, new_hidden = value.shape[0], target[0], 1, 1
    grid, new_grid = _grid(tokens), _grid(new_tokens)
    factor = new_grid // grid
    if new_grid == grid * factor and new_hidden == hidden * factor**2 and factor > 1:
        return expand_token_mlp(name, value, grid, factor)
    if new_hidden != hidden:
        return None
    dim = 1 if name.endswith("fc1.weight") else 0
    return resize_tokens(value, dim, new_grid, scale=name.endswith("fc1.weight"))


def fit_tensor(name: str, value: torch.Tensor, target: torch.Size) -> torch.Tensor | None:
    """`value` (state-dict entry `name`) fitted to shape `target` by the rules above; None if no rule applies."""
    if value.shape == target:
        return value
    with torch.no_grad():
        if name.endswith("cross_patch.weight") and value.ndim == 2 and len(target) == 2:
            return resize_matrix(value, _grid(value.shape[0]), _grid(target[0]))
        if name.endswith("cross_patch.bias") and value.ndim == 1:
            return resize_tokens(value, 0, _grid(target[0]), scale=False)
        if ".cross_patch.fc" in name:
            return _fit_token_mlp(name, value, target)
        if name.endswith("aggregate.weight"):  # class-MLP: one weight for the class token, then the patches
            patches = resize_tokens(value[:, 1:], 1, _grid(target[1] - 1), scale=True)
            return torch.cat([value[:, :1], patches], dim=1)
        if name == "pos_embed":
            return resize_tokens(value, 1, _grid(target[1]), scale=False)
        if name == "stem.proj.weight" and value.shape[:2] == target[:2]:
            return resample_patch_embed(value, list(target[2:]), verbose=False)
    return None


def fit_state_dict(state_dict: dict[str, torch.Tensor], target: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """Every tensor of `state_dict` that has a rule fitted to the shape in `target`; others left as they are
    (a mismatch the caller then reports)."""
    out = dict(state_dict)
    for name, value in state_dict.items():
        if name in target and value.shape != target[name]:
            fitted = fit_tensor(name, value, target[name])
            if fitted is not None:
                out[name] = fitted
    return out

"""Weight images: the cross-patch matrices (paper Fig. 2 / B.1), Mixer token-mixing units (Mixer Fig. 5)
and patch-embedding units (Mixer Fig. 7).

Every figure has one panel per layer (or one panel for the stem); a panel is a mosaic of small images
separated by a one-pixel gap. Each small image is divided by its own largest |weight|, so it spans
[-1, 1] and is drawn with a diverging colour map centred at 0: white is 0, red positive, blue negative.
"""

from __future__ import annotations

import math
import textwrap

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display

import numpy as np
import torch
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from resmlp.models.resmlp import ResMLP

CMAP = "RdBu_r"


def cross_patch_matrices(model: ResMLP) -> dict[int, np.ndarray]:
    """Layer number (1-based) -> the N x N cross-patch matrix A; empty unless cross_patch is 'linear'."""
    if model.config.cross_patch != "linear":
        return {}
    return {i + 1: _numpy(b.cross_patch.weight) for i, b in enumerate(model.blocks)}


def local_weight_share(matrix: np.ndarray, grid: int) -> tuple[float, float]:
    """(share, uniform): the mean over patches of the share of a cross-patch row's |weight| that falls on the
    patch and its 8 neighbours, and what uniform weights would give. A convolution-like A is far above uniform."""
    rows, cols = np.divmod(np.arange(grid * grid), grid)
    near = (np.abs(rows[:, None] - rows[None, :]) <= 1) & (np.abs(cols[:, None] - cols[None, :]) <= 1)
    magnitude = np.abs(matrix)
    share = (magnitude * near).sum(1) / np.maximum(magnitude.sum(1), 1e-30)
    return float(share.mean()), float(near.sum(1).mean() / (grid * grid))


def token_mixing_fc1(model: ResMLP) -> dict[int, np.ndarray]:
    """Layer number -> the token-mixing MLP's first (hidden, N) matrix; empty unless cross_patch is 'mlp'."""
    if model.config.cross_patch != "mlp":
        return {}
    return {i + 1: _numpy(b.cross_patch.fc1.weight) for i, b in enumerate(model.blocks)}


def patch_embedding_units(model: ResMLP) -> np.ndarray:
    """The stem's (dim, in_chans, p, p) projection: one p x p (x channels) filter per embedding unit."""
    return _numpy(model.stem.proj.weight)


def central_patches(grid: int, size: int = 6) -> list[int]:
    """Indices (row-major) of the central size x size patches of a grid x grid layout (all if smaller)."""
    size = min(size, grid)
    start = (grid - size) // 2
    return [r * grid + c for r in range(start, start + size) for c in range(start, start + size)]


def frequency_order(units: np.ndarray) -> list[int]:
    """Units (k, h, w) ordered low spatial frequency first, each followed by its most opposite unit.

    This is the Mixer paper's display heuristic (its Fig. 5): sort by the mean frequency of the 2-D
    power spectrum, then pair every unit with the unused unit of most negative correlation.
    """
    k, h, w = units.shape
    power = np.abs(np.fft.fft2(units)) ** 2
    fy, fx = np.meshgrid(np.fft.fftfreq(h), np.fft.fftfreq(w), indexing="ij")
    radius = np.sqrt(fy**2 + fx**2)
    mean_freq = (power * radius).sum(axis=(1, 2)) / np.maximum(power.sum(axis=(1, 2)), 1e-12)
    flat = units.reshape(k, -1)
    flat = flat - flat.mean(axis=1, keepdims=True)
    flat = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
    corr = flat @ flat.T
    order, used = [], np.zeros(k, dtype=bool)
    for i in np.argsort(mean_freq, kind="stable"):
        if used[i]:
            continue
        used[i] = True
        order.append(int(i))
        candidates = np.where(~used)[0]
        if len(candidates):
            j = candidates[np.argmin(corr[i, candidates])]
            used[j] = True
            order.append(int(j))
    return order


def mosaic(images: np.ndarray, columns: int | None = None) -> np.ndarray:
    """Tile (k, h, w[, 3]) images into one array with a one-pixel NaN gap; each image scaled to [-1, 1]."""
    k, h, w = images.shape[:3]
    columns = columns or math.ceil(math.sqrt(k))
    rows = math.ceil(k / columns)
    scale = np.abs(images.reshape(k, -1)).max(axis=1)
    scaled = images / np.maximum(scale, 1e-12).reshape(k, *([1] * (images.ndim - 1)))
    out = np.full((rows * (h + 1) - 1, columns * (w + 1) - 1, *images.shape[3:]), np.nan, dtype=np.float32)
    for i in range(k):
        r, c = divmod(i, columns)
        out[r * (h + 1) : r * (h + 1) + h, c * (w + 1) : c * (w + 1) + w] = scaled[i]
    return out


def cross_patch_rows(matrix: np.ndarray, grid: int, size: int = 6) -> np.ndarray:
    """Rows of A for the central size x size patches, each as a grid x grid image: (size**2, grid, grid)."""
    return matrix[central_patches(grid, size)].reshape(-1, grid, grid)


def plot_cross_patch(matrices: dict[int, np.ndarray], grid: int, size: int = 6) -> Figure:
    """Paper Fig. 2 / B.1: one panel per layer, the rows of A for the central patches in their layout."""
    side = min(size, grid)
    panels = {layer: mosaic(cross_patch_rows(a, grid, size), columns=side) for layer, a in matrices.items()}
    return _panel_figure(
        panels,
        title=f"Cross-patch matrix A: rows of the central {side}x{side} patches, each a {grid}x{grid} image",
        label="Layer {}",
    )


def plot_token_mixing(fc1: dict[int, np.ndarray], grid: int, max_units: int = 64) -> Figure:
    """Mixer Fig. 5: one panel per layer, the first token-mixing linear layer's hidden units as images."""
    panels = {}
    for layer, w in fc1.items():
        units = w.reshape(-1, grid, grid)
        order = frequency_order(units)[:max_units]
        panels[layer] = mosaic(units[order])
    shown = min(max_units, next(iter(fc1.values())).shape[0])
    return _panel_figure(
        panels,
        title=f"Token-mixing MLP, first layer: {shown} hidden units each as a {grid}x{grid} image "
        "(low frequency first, opposite-phase pairs adjacent)",
        label="Layer {}",
    )


def plot_patch_embedding(weight: np.ndarray, max_units: int = 64) -> Figure:
    """Mixer Fig. 7: the stem's first `max_units` projection units, as RGB (3 channels) or a signed map."""
    units = weight[:max_units]
    in_chans, p = units.shape[1], units.shape[2]
    if in_chans == 3:
        images = units.transpose(0, 2, 3, 1)  # (k, p, p, 3); colour shows the signed weight per channel
        note = "RGB, each unit mapped to [0, 1] around 0.5 = zero weight"
    else:
        images = units.mean(axis=1)
        note = "mean over input channels" if in_chans > 1 else "signed weights"
    tile = mosaic(images)
    fig, ax = plt.subplots(figsize=(7, 7.4), layout="constrained")
    if tile.ndim == 3:
        ax.imshow(np.nan_to_num(tile * 0.5 + 0.5, nan=1.0).clip(0, 1), interpolation="nearest")
    else:
        fig.colorbar(_show_signed(ax, tile), ax=ax, shrink=0.6, label="weight / max |weight| of its unit")
    ax.set_title(
        f"Patch embedding: first {len(units)} of {len(weight)} units, {p}x{p} pixels\n({note})", fontsize=10
    )
    ax.set_axis_off()
    return fig


def _panel_figure(panels: dict[int, np.ndarray], title: str, label: str) -> Figure:
    columns = min(4, len(panels))
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(
        rows, columns, figsize=(3.2 * columns, 3.4 * rows + 0.4), layout="constrained", squeeze=False
    )
    for ax, (layer, tile) in zip(axes.flat, panels.items(), strict=False):
        image = _show_signed(ax, tile)
        ax.set_title(label.format(layer), fontsize=10)
        ax.set_axis_off()
    for ax in axes.flat[len(panels) :]:
        fig.delaxes(ax)
    fig.colorbar(image, ax=fig.axes, shrink=0.6, label="weight / max |weight| of its image")
    # wrapped to the figure's width: a one- or two-panel figure is narrower than the sentence (it was clipped)
    fig.suptitle(textwrap.fill(title, width=max(20, int(fig.get_figwidth() * 72 / 6.5))), fontsize=10)
    return fig


def _show_signed(ax: plt.Axes, tile: np.ndarray):
    cmap = matplotlib.colormaps[CMAP].with_extremes(bad="#bbbbbb")  # the NaN gaps between images
    return ax.imshow(tile, cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()

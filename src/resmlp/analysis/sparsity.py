"""Weight sparsity per layer (paper Fig. 3 / B.2): the fraction of weights below a fraction of the maximum.

There are no exact zeros in trained weights, so the paper counts components whose magnitude is below 5 %
of the matrix's largest magnitude (about what a 4-bit quantiser relative to the maximum rounds to zero).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import torch
from matplotlib import pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from resmlp.models.resmlp import ResMLP

# column -> legend label; cross-patch columns only exist for the kinds that have a matrix over patches
SERIES = {
    "cross_patch": "Linear A: N->N (cross-patch)",
    "token_fc1": "Token-mixing MLP fc1: N->hidden",
    "token_fc2": "Token-mixing MLP fc2: hidden->N",
    "channel_fc1": "Channel MLP fc1 (B): D->4D",
    "channel_fc2": "Channel MLP fc2 (C): 4D->D",
}


def fraction_small(weight: torch.Tensor, threshold: float = 0.05) -> float:
    """Fraction of entries with |w| < threshold * max|w| (0.0 for an all-zero matrix: nothing is 'small')."""
    if not 0.0 < threshold < 1.0:
        raise ValueError(f"threshold must be a fraction in (0, 1), e.g. 0.05 for 5 %, got {threshold}")
    magnitude = weight.detach().abs().float()
    peak = magnitude.max()
    if peak == 0:
        return 0.0
    return (magnitude < threshold * peak).float().mean().item()


def layer_sparsity(model: ResMLP, threshold: float = 0.05) -> list[dict[str, float | int]]:
    """One row per block: {'layer': 1-based index, column: fraction} for the matrices the block has."""
    kind = model.config.cross_patch
    rows = []
    for i, block in enumerate(model.blocks):
        row: dict[str, float | int] = {"layer": i + 1}
        if kind == "linear":
            row["cross_patch"] = fraction_small(block.cross_patch.weight, threshold)
        elif kind == "mlp":
            row["token_fc1"] = fraction_small(block.cross_patch.fc1.weight, threshold)
            row["token_fc2"] = fraction_small(block.cross_patch.fc2.weight, threshold)
        row["channel_fc1"] = fraction_small(block.channel_mlp.fc1.weight, threshold)
        row["channel_fc2"] = fraction_small(block.channel_mlp.fc2.weight, threshold)
        rows.append(row)
    return rows


def random_init_sparsity(model: ResMLP, threshold: float = 0.05, seed: int = 0) -> list[dict[str, float | int]]:
    """`layer_sparsity` of a freshly initialised model of `model`'s config (seeded; the caller's RNG untouched):
    the baseline a trained model's sparsity is read against (a uniform init already has ~threshold of its
    entries below threshold * max)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh = ResMLP(model.config)
    return layer_sparsity(fresh, threshold)


def plot_sparsity(rows: list[dict[str, float | int]], threshold: float) -> Figure:
    """Fig. 3 as a line plot over depth, one line per matrix kind."""
    layers = [r["layer"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.5, 4.2), layout="constrained")
    for key, label in SERIES.items():
        if key in rows[0]:
            ax.plot(layers, [r[key] for r in rows], marker="o", markersize=3, label=label)
    ax.set_xlabel("Layer")
    ax.set_ylabel(f"Fraction of |w| < {threshold:.0%} of max |w|")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylim(0, 1)
    ax.set_xticks(layers if len(layers) <= 16 else layers[:: max(1, len(layers) // 12)])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"Sparsity of the linear layers by depth (threshold {threshold:g} x max)", fontsize=10)
    return fig

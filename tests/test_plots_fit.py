"""Figures fit their text: no title or label cut at the figure's edge, no accuracy axis past 100 %."""

from __future__ import annotations

import numpy as np

from resmlp.analysis.benchmark import tradeoff_figure
from resmlp.analysis.filters import plot_token_mixing


def _inside(fig, artists) -> bool:
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box = fig.bbox
    for artist in artists:
        extent = artist.get_window_extent(renderer)
        if extent.x0 < box.x0 - 1 or extent.x1 > box.x1 + 1 or extent.y0 < box.y0 - 1 or extent.y1 > box.y1 + 1:
            return False
    return True


def test_the_tradeoff_plot_caps_accuracy_at_100_and_keeps_its_labels_inside():
    rows = [dict(model=name, throughput_img_s=speed, top1=top1, batch_size=32, device="cpu")
            for name, speed, top1 in (("resmlp_s12", 50.0, 99.5), ("timm:resnet10t", 200.0, 100.0),
                                      ("a_rather_long_model_name_indeed", 4000.0, 99.8))]
    fig = tradeoff_figure(rows)
    ax = fig.axes[0]
    assert ax.get_ylim()[1] <= 100.0
    assert _inside(fig, [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label])


def test_the_token_mixing_title_is_not_clipped_on_a_one_panel_figure():
    fc1 = {0: np.random.default_rng(0).normal(size=(16, 64))}
    fig = plot_token_mixing(fc1, grid=8)
    assert _inside(fig, [fig._suptitle])

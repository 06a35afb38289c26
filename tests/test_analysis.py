"""resmlp analyze: weight images, sparsity numbers and the report page."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from matplotlib import pyplot as plt

import resmlp
from resmlp.analysis import filters, sparsity
from resmlp.analysis.report import write_report
from resmlp.cli import main

TINY = dict(img_size=32, patch_size=8, dim=32, depth=3, num_classes=5)  # 4x4 = 16 patches


def image_panels(fig) -> list:
    """Axes that show an image (colour bars have none)."""
    return [ax for ax in fig.axes if ax.images]


@pytest.fixture(scope="module")
def s12():
    torch.manual_seed(0)
    return resmlp.create_model("resmlp_s12").eval()


def test_s12_figures_have_one_panel_per_layer_with_central_6x6_rows(s12):
    matrices = filters.cross_patch_matrices(s12)
    assert sorted(matrices) == list(range(1, 13))
    fig = filters.plot_cross_patch(matrices, grid=14)
    panels = image_panels(fig)
    assert [ax.get_title() for ax in panels] == [f"Layer {n}" for n in range(1, 13)]
    # 6x6 images of 14x14 pixels with one-pixel gaps
    assert panels[0].images[0].get_array().shape == (6 * 15 - 1, 6 * 15 - 1)
    plt.close(fig)
    fig = filters.plot_patch_embedding(filters.patch_embedding_units(s12))
    assert len(image_panels(fig)) == 1
    assert image_panels(fig)[0].images[0].get_array().shape == (
        8 * 17 - 1,
        8 * 17 - 1,
        3,
    )  # 64 RGB 16x16 units
    plt.close(fig)


def test_cross_patch_rows_put_each_weight_where_its_patch_is():
    grid = 10
    # row i of A points at the patch to the right of patch i: its image must light up one pixel right of i
    a = np.zeros((grid * grid, grid * grid), dtype=np.float32)
    for i in range(grid * grid):
        r, c = divmod(i, grid)
        a[i, r * grid + min(c + 1, grid - 1)] = 1.0
    central = filters.central_patches(grid, 6)
    assert central[0] == 2 * grid + 2 and central[-1] == 7 * grid + 7 and len(central) == 36
    rows = filters.cross_patch_rows(a, grid)
    for image, patch in zip(rows, central, strict=True):
        r, c = divmod(patch, grid)
        assert np.unravel_index(image.argmax(), image.shape) == (r, c + 1)
    tile = filters.mosaic(rows, columns=6)
    assert np.nanmax(tile) == 1.0 and np.isnan(tile[grid, 0])  # gap row between image rows


def test_mosaic_scales_each_image_to_unit_max_keeping_sign():
    images = np.stack([np.full((3, 3), 5.0), np.full((3, 3), -0.01)])
    tile = filters.mosaic(images, columns=2)
    assert np.allclose(tile[:3, :3], 1.0) and np.allclose(tile[:3, 4:], -1.0)


def test_frequency_order_puts_smooth_units_first_and_pairs_opposites():
    x = np.linspace(0, 2 * np.pi, 8, endpoint=False)
    smooth = np.outer(np.cos(x), np.ones(8))
    sharp = np.outer(np.cos(4 * x), np.ones(8))
    units = np.stack([sharp, smooth, -sharp, -smooth])
    order = filters.frequency_order(units)
    assert sorted(order) == [0, 1, 2, 3]
    assert set(order[:2]) == {1, 3}  # the low-frequency pair first, next to its opposite
    assert set(order[2:]) == {0, 2}


def test_fraction_small_matches_a_hand_built_matrix():
    w = torch.zeros(10, 10)
    w.view(-1)[:37] = 1.0
    w.view(-1)[37:50] = 0.049
    w.view(-1)[50:60] = -0.05
    w[9, 9] = -2.0
    # 37 ones, 13 x 0.049, 10 x -0.05, 39 zeros, one -2: max |w| = 2, so 5 % is 0.1 and 2 % is 0.04
    assert sparsity.fraction_small(w, 0.05) == pytest.approx((13 + 10 + 39) / 100)
    assert sparsity.fraction_small(w, 0.02) == pytest.approx(39 / 100)
    assert sparsity.fraction_small(w * -3.0, 0.05) == pytest.approx(0.62)  # scale- and sign-invariant
    assert sparsity.fraction_small(torch.zeros(3, 3)) == 0.0
    with pytest.raises(ValueError, match="fraction"):
        sparsity.fraction_small(w, 5)


def test_layer_sparsity_reads_the_right_matrices():
    model = resmlp.create_model("resmlp_s12", **TINY)
    with torch.no_grad():
        model.blocks[1].cross_patch.weight.fill_(1.0).view(-1)[:4] = 0.0  # 4 of 16x16 are small
        model.blocks[2].channel_mlp.fc2.weight.zero_()[0, 0] = 1.0
    rows = sparsity.layer_sparsity(model)
    assert [r["layer"] for r in rows] == [1, 2, 3]
    assert rows[1]["cross_patch"] == pytest.approx(4 / 256)
    assert rows[2]["channel_fc2"] == pytest.approx(1 - 1 / (32 * 128))
    assert set(rows[0]) == {"layer", "cross_patch", "channel_fc1", "channel_fc2"}


def _referenced_images(index: str) -> set[str]:
    return set(re.findall(r"src='([^']+)'", index))


def test_report_for_a_tiny_resmlp_links_every_png_and_writes_numbers(tmp_path):
    model = resmlp.create_model("resmlp_s12", **TINY)
    report = write_report(model, tmp_path, layers=[1, 3], threshold=0.1)
    pngs = {p.name for p in tmp_path.glob("*.png")}
    assert pngs == {"cross_patch_rows.png", "patch_embedding.png", "sparsity.png"}
    assert _referenced_images(report.index.read_text()) == pngs
    data = json.loads((tmp_path / "sparsity.json").read_text())
    assert data["threshold"] == 0.1 and len(data["layers"]) == 3  # sparsity covers all layers
    assert data["layers"][0]["cross_patch"] == pytest.approx(
        sparsity.fraction_small(model.blocks[0].cross_patch.weight, 0.1)
    )
    csv_lines = (tmp_path / "sparsity.csv").read_text().splitlines()
    assert csv_lines[0] == "layer,cross_patch,channel_fc1,channel_fc2" and len(csv_lines) == 4
    arrays = np.load(tmp_path / "weights.npz")
    assert sorted(arrays.files) == ["cross_patch_rows_layer1", "cross_patch_rows_layer3", "patch_embedding"]
    assert arrays["cross_patch_rows_layer3"].shape == (16, 4, 4)  # a 4x4 grid: all 16 patches are central
    with pytest.raises(ValueError, match="layers 1 to 3"):
        write_report(model, tmp_path / "bad", layers=[4])


def test_conv_cross_patch_says_which_figures_do_not_apply(tmp_path):
    model = resmlp.create_model("resmlp_s12", cross_patch="dwconv3x3", **TINY)
    report = write_report(model, tmp_path)
    assert "cross_patch_rows.png" not in report.figures
    assert any("Fig. 2" in note and "dwconv3x3" in note for note in report.not_applicable)
    index = report.index.read_text()
    assert "don't apply" in index and "dwconv3x3" in index
    assert (
        _referenced_images(index)
        == {p.name for p in tmp_path.glob("*.png")}
        == {"patch_embedding.png", "sparsity.png"}
    )


def test_analyze_cli_on_a_timm_format_checkpoint(tmp_path, capsys):
    torch.manual_seed(1)
    model = resmlp.create_model(
        "resmlp_s12", img_size=28, patch_size=7, in_chans=1, dim=32, depth=2, num_classes=10
    )
    path = resmlp.export_checkpoint(model, tmp_path / "timm.pth", format="timm")
    out = tmp_path / "report"
    assert main(["analyze", str(path), "--out", str(out), "--layers", "2"]) == 0
    assert (out / "index.html").is_file() and (out / "sparsity.json").is_file()
    arrays = np.load(out / "weights.npz")
    # the weights drawn are the checkpoint's, not a fresh model's
    expected = filters.cross_patch_rows(model.blocks[1].cross_patch.weight.detach().numpy(), 4)
    assert np.array_equal(arrays["cross_patch_rows_layer2"], expected)
    assert main(["analyze", str(path), "--out", str(out), "--layers", "7"]) == 2
    assert "layers 1 to 2" in capsys.readouterr().err


def test_analyze_cli_on_a_mixer(tmp_path):
    mixer = resmlp.create_model(
        "mixer_s16", img_size=32, patch_size=8, dim=32, depth=2, cross_patch_hidden=12, num_classes=3
    )
    path = resmlp.save(mixer, tmp_path / "mixer.safetensors")
    out = tmp_path / "report"
    assert main(["analyze", str(path), "--out", str(out)]) == 0
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {"token_mixing_units.png", "patch_embedding.png", "sparsity.png"}
    assert _referenced_images((out / "index.html").read_text()) == pngs
    fig = filters.plot_token_mixing(filters.token_mixing_fc1(mixer), grid=4)
    panels = image_panels(fig)
    assert [ax.get_title() for ax in panels] == ["Layer 1", "Layer 2"]
    assert panels[0].images[0].get_array().shape == (3 * 5 - 1, 4 * 5 - 1)  # 12 units of 4x4, 4 per row
    plt.close(fig)
    layers = json.loads((out / "sparsity.json").read_text())["layers"]
    assert set(layers[0]) == {"layer", "token_fc1", "token_fc2", "channel_fc1", "channel_fc2"}


def test_analyze_cli_takes_a_run_folder_and_a_timm_model_with_one_line_on_what_does_not_apply(tmp_path, capsys):
    import timm

    run = tmp_path / "run"
    resmlp.save(resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, dim=16, depth=2, num_classes=3),
                run / "best.safetensors")
    assert main(["analyze", str(run), "--out", str(tmp_path / "report"), "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert (tmp_path / "report" / "index.html").is_file()
    assert "5/5" in captured.err and "figure" in captured.err  # the progress bar on stderr
    path = resmlp.save(timm.create_model("test_resnet", num_classes=3), tmp_path / "resnet.safetensors")
    assert main(["analyze", str(path), "--out", str(tmp_path / "other")]) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if line.startswith("skipped:")]
    assert len(skipped) == 1 and "ResMLP/Mixer-specific: a ResNet has no cross-patch layer" in skipped[0]
    rows = json.loads((tmp_path / "other" / "sparsity.json").read_text())["layers"]
    weights = {n: p for n, p in timm.create_model("test_resnet", num_classes=3).named_parameters() if p.ndim >= 2}
    assert [r["layer"] for r in rows] == list(weights)  # every weight matrix and kernel, in the model's order
    first = resmlp.load(path).get_parameter(rows[0]["layer"])
    small = (first.abs() < 0.05 * first.abs().max()).float().mean().item()
    assert rows[0]["small"] == pytest.approx(small)
    assert (tmp_path / "other" / "first_conv.png").stat().st_size > 1000
    assert main(["analyze", str(path), "--out", str(tmp_path / "o2"), "--layers", "1"]) == 2
    assert "--layers counts ResMLP/Mixer blocks" in capsys.readouterr().err


def test_captions_describe_the_checkpoint_shown_not_the_papers_findings(tmp_path):
    from resmlp.analysis import filters

    model = resmlp.create_model("resmlp_s12", **TINY)
    with torch.no_grad():
        for block in model.blocks:  # a dense, non-local A; a sparse channel MLP: the opposite of the paper's
            block.cross_patch.weight.fill_(1.0)
            block.channel_mlp.fc1.weight.zero_()[0, 0] = 1.0
            block.channel_mlp.fc2.weight.zero_()[0, 0] = 1.0
    report = write_report(model, tmp_path, threshold=0.1)
    rows, sparse = report.figures["cross_patch_rows.png"], report.figures["sparsity.png"]
    # before: "Trained models show convolution-like local filters early ..." and "A are sparser than the channel MLP"
    assert "Trained models show" not in rows and "In trained ResMLPs" not in sparse
    assert "Here A is no sparser than the channel MLP: 0% of its weights are small against 100%" in sparse
    share, uniform = filters.local_weight_share(np.ones((16, 16)), 4)
    assert share == pytest.approx(uniform) == pytest.approx((4 * 4 + 8 * 6 + 4 * 9) / 16 / 16)
    assert f"layer 1 {share:.0%}" in rows and f"(uniform weights: {uniform:.0%})" in rows
    identity_share, _ = filters.local_weight_share(np.eye(16), 4)
    assert identity_share == 1.0  # all weight on the patch itself: fully local

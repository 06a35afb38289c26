"""Resolution change: Mixer's block-diagonal expansion is exact; ResMLP's matrix resize is sound."""

from __future__ import annotations

import pytest
import torch
from conftest import make_trained_like_

import resmlp
from resmlp.transfer import change_resolution, expand_token_mixing, resize_cross_patch, resize_matrix

MIXER = dict(img_size=32, patch_size=8, dim=16, depth=2, num_classes=5)


@pytest.mark.parametrize("factor", [2, 3])
def test_mixer_expansion_on_tiled_image_gives_identical_logits(factor):
    small = make_trained_like_(resmlp.create_model("mixer_s16", **MIXER)).eval()
    big = expand_token_mixing(small, factor).eval()
    assert big.config.img_size == 32 * factor and big.config.num_patches == 16 * factor**2
    image = torch.randn(2, 3, 32, 32)
    tiled = image.repeat(1, 1, factor, factor)  # K x K copies of the image
    with torch.no_grad():
        diff = (big(tiled) - small(image)).abs().max()
    assert diff < 1e-5


def test_mixer_expansion_is_not_trivially_true():
    """On a non-tiled image the expanded model differs: the check above tests the tiling property."""
    small = make_trained_like_(resmlp.create_model("mixer_s16", **MIXER)).eval()
    big = expand_token_mixing(small, 2).eval()
    with torch.no_grad():
        assert (big(torch.randn(1, 3, 64, 64)) - small(torch.randn(1, 3, 32, 32))).abs().max() > 1e-3


def test_resmlp_resize_to_same_size_is_identity():
    model = make_trained_like_(resmlp.create_model("resmlp_s12_cmlp", img_size=32, patch_size=8, dim=16, depth=2,
                                                   pos_embed=True)).eval()
    same = resize_cross_patch(model, 32).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (same(x) - model(x)).abs().max() < 1e-5


def test_resized_matrix_preserves_what_a_uniform_image_sees():
    """Constant A and a uniform image: the resized model computes exactly the same thing at any grid."""
    model = make_trained_like_(resmlp.create_model("resmlp_s12_cmlp", img_size=32, patch_size=8, dim=16,
                                                   depth=2)).eval()
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            block.cross_patch.weight.fill_(0.05 * (i + 1))
            block.cross_patch.bias.fill_(0.1 * (i - 1))
        for layer in model.class_mlp.layers:
            layer.aggregate.weight[:, 1:].fill_(0.02)
    big = change_resolution(model, 56).eval()
    assert big.config.num_patches == 49
    with torch.no_grad():
        small_out = model(torch.full((1, 3, 32, 32), 0.3))
        big_out = big(torch.full((1, 3, 56, 56), 0.3))
    assert (small_out - big_out).abs().max() < 1e-4


def test_resize_matrix_keeps_row_sums_of_a_smooth_matrix():
    g = 8
    coords = torch.stack(torch.meshgrid(torch.arange(g), torch.arange(g), indexing="ij"), -1).reshape(-1, 2).float()
    dist2 = ((coords[:, None] - coords[None]) ** 2).sum(-1)
    smooth = torch.exp(-dist2 / 8)  # a blurred-identity, convolution-like A
    resized = resize_matrix(smooth, g, 16)
    # each central output patch sums its inputs as the matching central patch of the small grid did
    old_center = torch.tensor([3 * g + 3, 3 * g + 4, 4 * g + 3, 4 * g + 4])
    new_center = torch.tensor([7 * 16 + 7, 7 * 16 + 8, 8 * 16 + 7, 8 * 16 + 8])
    ratio = resized[new_center].sum(1) / smooth[old_center].sum(1)
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=0.05), ratio


def test_impossible_resolutions_are_clear_errors():
    resmlp_model = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=1)
    with pytest.raises(ValueError, match="not a multiple of the patch size 8.*try 40 or 48"):
        change_resolution(resmlp_model, 44)
    with pytest.raises(ValueError, match="not 'linear'"):
        expand_token_mixing(resmlp_model, 2)


def test_convolutional_cross_patch_moves_unchanged():
    model = make_trained_like_(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=1,
                                                   cross_patch="dwsep3x3"))
    big = change_resolution(model, 64)
    torch.testing.assert_close(big.blocks[0].cross_patch.conv.weight, model.blocks[0].cross_patch.conv.weight)
    assert big(torch.randn(1, 3, 64, 64)).shape == (1, 1000)


def test_mixer_to_a_non_integer_grid_ratio_resamples_the_token_mlp():
    """48/32 is no integer ratio: the token-MLP keeps its width and its token dimension is resampled."""
    mixer = make_trained_like_(resmlp.create_model("mixer_s16", **MIXER)).eval()
    with torch.no_grad():  # token MLPs that treat every token alike (weights constant over tokens)
        for block in mixer.blocks:
            fc1, fc2 = block.cross_patch.fc1, block.cross_patch.fc2
            fc1.weight.copy_(torch.randn(fc1.out_features, 1).expand_as(fc1.weight) / fc1.in_features)
            fc2.weight.copy_(torch.randn(1, fc2.in_features).expand_as(fc2.weight) / fc2.in_features)
            fc2.bias.fill_(0.1)
    moved = change_resolution(mixer, 48).eval()
    fc1 = moved.blocks[0].cross_patch.fc1
    assert (fc1.out_features, fc1.in_features) == (mixer.blocks[0].cross_patch.fc1.out_features, 36)
    # a uniform image: the resampled MLP sums 36 equal tokens as the original summed 16, so the logits agree
    with torch.no_grad():
        small = mixer(torch.full((1, 3, 32, 32), 0.3))
        big = moved(torch.full((1, 3, 48, 48), 0.3))
    assert (small - big).abs().max() < 1e-4

"""Fixed pixel permutations for the permutation-invariance experiment (resmlp.data.permute)."""


import pytest
import torch

from resmlp.data import build_dataset, dataset_stats
from resmlp.data.permute import PixelPermutation, pixel_permutation
from resmlp.preprocess import Preprocess


@pytest.mark.parametrize("mode", ["patch", "global"])
def test_permutation_is_a_fixed_bijection(mode):
    perm = pixel_permutation(mode, 28, 4, seed=3)
    assert sorted(perm.tolist()) == list(range(28 * 28))  # a bijection of the pixels
    assert torch.equal(perm, pixel_permutation(mode, 28, 4, seed=3))  # fixed: same seed, same permutation
    assert not torch.equal(perm, pixel_permutation(mode, 28, 4, seed=4))
    assert (perm != torch.arange(28 * 28)).float().mean() > 0.5  # it actually moves pixels


def test_patch_mode_keeps_patches_whole_with_one_shared_pixel_order():
    img, p = 28, 4
    perm = pixel_permutation("patch", img, p, seed=0)
    rows, cols = torch.arange(img * img) // img, torch.arange(img * img) % img
    dest_patch = (rows // p) * (img // p) + cols // p
    src_patch = (rows[perm] // p) * (img // p) + cols[perm] // p
    mapping = {}
    for d, s in zip(dest_patch.tolist(), src_patch.tolist(), strict=True):
        assert mapping.setdefault(d, s) == s  # every destination patch takes all its pixels from one patch
    assert sorted(mapping.values()) == list(range((img // p) ** 2))  # the patches are only reordered
    assert list(mapping.values()) != sorted(mapping.values())
    # the in-patch offset of a source pixel depends only on the destination offset: one shared permutation
    dest_offset = (rows % p) * p + cols % p
    src_offset = (rows[perm] % p) * p + cols[perm] % p
    shared = {}
    for d, s in zip(dest_offset.tolist(), src_offset.tolist(), strict=True):
        assert shared.setdefault(d, s) == s
    assert list(shared.values()) != list(range(p * p))


def test_global_mode_mixes_pixels_across_patches():
    img, p = 28, 4
    perm = pixel_permutation("global", img, p, seed=0)
    rows, cols = torch.arange(img * img) // img, torch.arange(img * img) % img
    src_patch = (rows[perm] // p) * (img // p) + cols[perm] // p
    first_patch = src_patch.view(img // p, p, img // p, p)[0, :, 0, :]
    assert first_patch.unique().numel() > 1


def test_transform_moves_values_and_checks_size():
    image = torch.arange(2 * 28 * 28, dtype=torch.float32).view(2, 28, 28)
    t = PixelPermutation("global", 28, seed=1)
    out = t(image)
    assert torch.equal(out.flatten(1), image.flatten(1)[:, t.perm])  # every channel permuted the same way
    assert torch.equal(out.flatten(1).sort().values, image.flatten(1).sort().values)
    with pytest.raises(ValueError, match="28x28"):
        t(torch.zeros(1, 32, 32))
    with pytest.raises(ValueError, match="multiple of patch_size"):
        pixel_permutation("patch", 28, 5)
    with pytest.raises(ValueError, match="not one of"):
        pixel_permutation("rows", 28)


def test_build_dataset_applies_the_same_permutation_to_both_splits():
    mean, std = dataset_stats("synthetic", 1)
    transform = Preprocess(16, 1, mean, std, crop_pct=1.0).eval_transform()
    kw = dict(data_dir=None, in_chans=1, transform=transform, synthetic_size=(8, 8), img_size=16)
    plain = build_dataset("synthetic", "train", **kw)
    permuted = build_dataset("synthetic", "train", permute="patch", permute_patch=4, permute_seed=7, **kw)
    perm = pixel_permutation("patch", 16, 4, 7)
    assert torch.equal(permuted[0][0].flatten(1), plain[0][0].flatten(1)[:, perm])
    val_plain = build_dataset("synthetic", "val", **kw)
    val_permuted = build_dataset("synthetic", "val", permute="patch", permute_patch=4, permute_seed=7, **kw)
    assert torch.equal(val_permuted[3][0].flatten(1), val_plain[3][0].flatten(1)[:, perm])


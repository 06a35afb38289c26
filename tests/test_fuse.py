"""resmlp.fuse: the folded inference model computes the same logits, for every preset."""

from __future__ import annotations

import pytest
import torch
from conftest import build_fast, make_trained_like_

import resmlp
from resmlp.folding import FusedBlock
from resmlp.models.registry import PRESETS, model_config

# Presets above ~10 GMACs or 100M parameters are checked at a 4x4 patch grid (same widths, depth,
# norms and pooling; only N shrinks) to keep CI fast: the folding is per block and does not depend on N.
FULL_SIZE = {"resmlp_s12", "resmlp_s24", "resmlp_s36", "resmlp_s12_p14", "resmlp_s12_cmlp",
             "resmlp_s24_cmlp", "resmlp_s36_cmlp", "mixer_s32", "mixer_s16", "mixer_b32"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_fused_logits_equal_for_every_preset(name):
    cfg = model_config(name)
    if name not in FULL_SIZE:
        cfg = cfg.replace(img_size=4 * cfg.patch_size)
    model = build_fast(cfg, seed=len(name))
    fused = resmlp.fuse(model)
    x = torch.randn(2, 3, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference, out = model(x), fused(x)
    assert reference.abs().max() > 0.1  # the check is meaningful only if logits are not ~0
    assert (out - reference).abs().max() < 1e-4
    foldable = cfg.cross_patch == "linear" and cfg.norm == "affine"
    assert all(isinstance(b, FusedBlock) for b in fused.blocks) == foldable


def test_fuse_removes_every_affine_and_layerscale():
    model = make_trained_like_(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2))
    fused = resmlp.fuse(model)
    names = [n for n, _ in fused.named_modules()]
    assert not [n for n in names if n.endswith(("_norm", "_scale"))]
    assert isinstance(fused.norm, torch.nn.Identity)
    assert sum(p.numel() for p in fused.parameters()) < sum(p.numel() for p in model.parameters()) + 16 * 16 * 2
    # the original model is untouched and still trainable
    assert all(p.requires_grad for p in model.parameters())


def test_fuse_keeps_class_mlp_and_other_blocks_exact():
    for overrides in (dict(pooling="class_mlp"), dict(norm="layernorm"), dict(cross_patch="dwsep3x3")):
        model = make_trained_like_(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2,
                                                       **overrides)).eval()
        x = torch.randn(3, 3, 32, 32)
        with torch.no_grad():
            assert (resmlp.fuse(model)(x) - model(x)).abs().max() < 1e-5

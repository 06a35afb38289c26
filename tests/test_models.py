"""The model core: every configuration builds and runs, the API behaves as timm users expect."""

from __future__ import annotations

import itertools

import pytest
import torch

import resmlp
from resmlp.layers import ACTIVATIONS, CROSS_PATCH, NORMS, CrossPatchLinear, LayerScale
from resmlp.models.resmlp import ResMLP, ResMLPConfig, default_layerscale_init


@pytest.mark.parametrize(
    "cross_patch,norm,act,pooling",
    [*((c, "affine", "gelu", "avg") for c in CROSS_PATCH),
     *((("linear", n, a, p) for n, a, p in itertools.product(NORMS, ACTIVATIONS, ("avg", "class_mlp"))))],
)
def test_every_variant_trains_a_step(cross_patch, norm, act, pooling, tiny_config):
    cfg = tiny_config.replace(cross_patch=cross_patch, norm=norm, act=act, pooling=pooling)
    model = ResMLP(cfg)
    x = torch.randn(4, 3, 32, 32)
    logits = model(x)
    assert logits.shape == (4, 7)
    logits.logsumexp(-1).mean().backward()
    stem_grad = model.stem.proj.weight.grad
    assert stem_grad is not None and stem_grad.abs().sum() > 0


def test_cross_patch_linear_is_A_times_X():
    layer = CrossPatchLinear(6)
    x = torch.randn(2, 6, 5)
    expected = torch.einsum("nm,bmc->bnc", layer.weight, x) + layer.bias[None, :, None]
    torch.testing.assert_close(layer(x), expected)


def test_cross_patch_mixes_patches_but_not_channels(tiny_config):
    """Changing one patch changes the others' outputs only through the cross-patch layer."""
    for kind, should_mix in (("linear", True), ("none", False)):
        model = ResMLP(tiny_config.replace(cross_patch=kind)).eval()
        x = torch.randn(1, 3, 32, 32)
        tokens = model.forward_features(x)
        x2 = x.clone()
        x2[..., :8, :8] += 1.0  # first patch only
        tokens2 = model.forward_features(x2)
        others_changed = (tokens2[:, 1:] - tokens[:, 1:]).abs().max() > 1e-6
        assert bool(others_changed) == should_mix


def test_layerscale_init_follows_depth():
    # CaiT's rule (CaiT paper, Section 2.1): 0.1 up to depth 18, 1e-5 at 24, 1e-6 deeper
    assert [default_layerscale_init(d) for d in (6, 12, 13, 18, 19, 24, 25, 36)] == [
        0.1, 0.1, 0.1, 0.1, 1e-5, 1e-5, 1e-6, 1e-6]
    for depth, value in ((12, 0.1), (24, 1e-5), (36, 1e-6)):
        model = ResMLP(ResMLPConfig(img_size=32, patch_size=16, dim=8, depth=depth))
        gammas = torch.cat([m.gamma.detach() for m in model.modules() if isinstance(m, LayerScale)])
        torch.testing.assert_close(gammas, torch.full_like(gammas, value))
    custom = ResMLP(ResMLPConfig(img_size=32, patch_size=16, dim=8, depth=2, layerscale_init=0.2))
    assert float(custom.blocks[0].channel_scale.gamma.detach()[0]) == pytest.approx(0.2)


# LayerScale's initial value in the authors' code: DeiT's resmlp_models.py (init_scale of resmlp_12/24/36 and
# resmlpB_24, which is B24/8: patch_size=8) and timm's mlp_mixer.py (init_values of resmlp_12/24/36 and
# resmlp_big_24_224, also patch 8); B24/8 is 1e-6 at 24 blocks. No code defines B24/16: its 1e-6 is B24/8's
AUTHORS_LAYERSCALE_INIT = {"resmlp_s12": 0.1, "resmlp_s24": 1e-5, "resmlp_s36": 1e-6, "resmlp_b24": 1e-6,
                           "resmlp_b24_p8": 1e-6, "resmlp_s12_p8": 0.1, "resmlp_s12_p14": 0.1}


@pytest.mark.parametrize("preset", sorted(AUTHORS_LAYERSCALE_INIT))
def test_presets_start_layerscale_at_the_authors_values(preset):
    from resmlp.models.registry import model_config

    assert model_config(preset).layerscale_value == AUTHORS_LAYERSCALE_INIT[preset]


def test_b24_builds_with_layerscale_at_1e_6():
    from resmlp.models.registry import model_config

    # a narrow B24 (same preset, smaller input) so the test builds quickly
    model = ResMLP(model_config("resmlp_b24_p8", img_size=16, depth=2, num_classes=2))
    gammas = torch.cat([m.gamma.detach() for m in model.modules() if isinstance(m, LayerScale)])
    torch.testing.assert_close(gammas, torch.full_like(gammas, 1e-6))


def test_model_api_shapes(tiny_config):
    model = ResMLP(tiny_config.replace(pos_embed=True)).eval()
    x = torch.randn(3, 3, 32, 32)
    tokens = model.forward_features(x)
    assert tokens.shape == (3, 16, 32)
    assert model.forward_head(tokens, pre_logits=True).shape == (3, 32)
    torch.testing.assert_close(model.forward_head(tokens), model(x))
    layers = model.get_intermediate_layers(x, n=2)
    assert len(layers) == 2 and all(t.shape == (3, 16, 32) for t in layers)
    torch.testing.assert_close(layers[-1], tokens)
    assert len(model.get_intermediate_layers(x, n=[0])) == 1
    with pytest.raises(ValueError, match="out of range"):
        model.get_intermediate_layers(x, n=[5])
    model.reset_classifier(3)
    assert model(x).shape == (3, 3) and model.config.num_classes == 3
    model.reset_classifier(0)
    assert model(x).shape == (3, 32)
    assert "pos_embed" in model.no_weight_decay()


@pytest.mark.parametrize(
    "x,match",
    [
        (torch.randn(3, 32, 32), "batch dimension"),
        (torch.randn(1, 1, 32, 32), "1 channels but the model expects 3"),
        (torch.randn(1, 3, 28, 28), "expects 32x32.*N=16 patches"),
        (torch.zeros(1, 3, 32, 32, dtype=torch.uint8), "floating-point"),
        (torch.randn(1, 3, 32, 32, dtype=torch.float64), "dtype"),
    ],
)
def test_bad_input_is_a_clear_value_error(x, match, tiny_config):
    with pytest.raises(ValueError, match=match):
        ResMLP(tiny_config)(x)


@pytest.mark.hosttype
def test_bf16_autocast_accepts_float_input(tiny_config):
    model = ResMLP(tiny_config).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 3, 32, 32))
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize(
    "overrides,match",
    [
        (dict(cross_patch="attention"), "cross_patch='attention' is not one of"),
        (dict(norm="group"), "norm='group'"),
        (dict(img_size=30), "not a multiple of patch_size"),
        (dict(depht=3), "unknown model option 'depht' \\(did you mean 'depth'\\?\\)"),
        (dict(dimm=8), "did you mean 'dim'"),
        (dict(zzz=8), r"unknown model option\(s\) \['zzz'\]; valid options: act,"),
        (dict(drop_path_rate=1.5), "drop_path_rate"),
    ],
)
def test_bad_config_is_rejected(overrides, match):
    with pytest.raises(ValueError, match=match):
        resmlp.create_model("resmlp_s12", **overrides)


def test_unknown_preset_suggests_close_names():
    with pytest.raises(ValueError, match="did you mean.*resmlp_s12"):
        resmlp.create_model("resmlp_s21")


def test_grayscale_model(tiny_config):
    model = ResMLP(tiny_config.replace(in_chans=1))
    assert model(torch.randn(2, 1, 32, 32)).shape == (2, 7)


def test_mixer_presets_initialise_as_mixer_and_resmlp_presets_as_deit():
    """Mixer: its authors' Flax init (lecun_normal kernels, zero biases, zero head), as timm's
    mlp_mixer._init_weights(flax=True); ResMLP: DeiT's resmlp_models.py (trunc_normal 0.02, zero biases)."""
    from functools import partial

    import timm
    from timm.models import named_apply
    from timm.models.mlp_mixer import _init_weights as timm_init

    torch.manual_seed(0)
    ours = resmlp.create_model("mixer_s16", img_size=64, num_classes=10)
    theirs = timm.create_model("mixer_s16_224", img_size=64, num_classes=10)
    named_apply(partial(timm_init, flax=True), theirs)
    ours_p = {k: v.detach() for k, v in ours.named_parameters()}
    theirs_p = {k: v.detach() for k, v in theirs.named_parameters()}
    assert float(ours_p["head.weight"].abs().max()) == 0 and float(ours_p["head.bias"].abs().max()) == 0
    pairs = [("blocks.0.cross_patch.fc1.weight", "blocks.0.mlp_tokens.fc1.weight"),
             ("blocks.0.channel_mlp.fc1.weight", "blocks.0.mlp_channels.fc1.weight"),
             ("blocks.0.channel_mlp.fc2.weight", "blocks.0.mlp_channels.fc2.weight"),
             ("stem.proj.weight", "stem.proj.weight")]
    for a, b in pairs:
        assert ours_p[a].shape == theirs_p[b].shape
        fan_in = ours_p[a][0].numel()
        assert float(ours_p[a].std()) == pytest.approx(float(theirs_p[b].std()), rel=0.1)
        assert float(ours_p[a].std()) == pytest.approx(fan_in ** -0.5, rel=0.1)  # lecun: 1/sqrt(fan_in)
    assert float(ours_p["blocks.0.channel_mlp.fc1.bias"].abs().max()) == 0
    resmlp_model = resmlp.create_model("resmlp_s12", img_size=64, num_classes=10)
    fc1 = resmlp_model.blocks[0].channel_mlp.fc1.weight.detach()
    assert float(fc1.std()) == pytest.approx(0.02, rel=0.1) and float(resmlp_model.head.weight.detach().abs().max()) > 0

"""The contract timm checks on its own models, on every preset (tiny widths/depths, the preset's structure)."""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import make_trained_like_
from timm.data import resolve_data_config

import resmlp
from resmlp.models.registry import PRESETS

TINY = dict(img_size=32, dim=16, depth=3, num_classes=5)


def _tiny(name: str, **kw) -> torch.nn.Module:
    patch = 8 if PRESETS[name].get("patch_size", 16) >= 8 else 4
    extra = dict(cross_patch_hidden=12) if name.startswith("mixer") else {}
    torch.manual_seed(0)
    return make_trained_like_(timm.create_model(name, **{**TINY, "patch_size": patch, **extra, **kw}))


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_forward_backward_cfg_head(name):
    model = _tiny(name)
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 5)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    cfg = model.pretrained_cfg
    assert model.default_cfg is cfg
    assert cfg["input_size"] == (3, 32, 32) and cfg["num_classes"] == 5
    assert isinstance(model.get_submodule(cfg["first_conv"]), torch.nn.Conv2d)
    assert model.get_submodule(cfg["classifier"]) is model.get_classifier()
    assert resolve_data_config({}, model=model)["input_size"] == (3, 32, 32)
    model.reset_classifier(0)
    assert model(x).shape == (2, model.head_hidden_size)
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, model.num_features)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_torchscript_fx_and_compiled_graphs_agree(name):
    model = _tiny(name).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)
        scripted = torch.jit.script(model)
        torch.testing.assert_close(scripted(x), expected, rtol=1e-4, atol=1e-5)
        traced = torch.fx.symbolic_trace(model)
        torch.testing.assert_close(traced(x), expected, rtol=1e-4, atol=1e-5)


def test_compile_fullgraph():
    model = _tiny("resmlp_s12_cmlp").eval()
    x = torch.randn(2, 3, 32, 32)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("name", ["resmlp_s12", "resmlp_s12_cmlp", "mixer_b16"])
def test_forward_intermediates(name):
    model = _tiny(name).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        final, maps = model.forward_intermediates(x)
        tokens = model.forward_intermediates(x, indices=[0, 2], output_fmt="NLC", intermediates_only=True)
        normed = model.forward_intermediates(x, 1, norm=True, output_fmt="NLC", intermediates_only=True)
        features = model.forward_features(x)
    grid = 32 // model.config.patch_size
    assert len(maps) == 3 and all(m.shape == (2, 16, grid, grid) for m in maps)
    assert [t.shape for t in tokens] == [(2, grid * grid, 16)] * 2
    torch.testing.assert_close(final, features)
    # timm's semantics: intermediates are the raw block outputs; forward_features applies the final norm
    torch.testing.assert_close(model.norm(tokens[-1]), features)
    torch.testing.assert_close(normed[0], features)
    torch.testing.assert_close(maps[-1].flatten(2).transpose(1, 2), tokens[-1])
    assert not torch.allclose(tokens[0], tokens[1])


def test_prune_intermediate_layers_keeps_the_features():
    model = _tiny("resmlp_s12_cmlp").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        wanted = model.forward_intermediates(x, indices=[1], intermediates_only=True)
        assert model.prune_intermediate_layers([1]) == [1]
        assert len(model.blocks) == 2 and model.config.depth == 2
        torch.testing.assert_close(model.forward_intermediates(x, indices=[1], intermediates_only=True), wanted)
    assert model(x).shape == (2, 16)  # no head left


def test_features_only_through_timm():
    net = timm.create_model("resmlp_s12", features_only=True, out_indices=(2, 5), img_size=32, patch_size=8,
                            dim=16, depth=6)
    maps = net(torch.randn(2, 3, 32, 32))
    assert [m.shape for m in maps] == [(2, 16, 4, 4)] * 2
    assert net.feature_info.channels() == [16, 16] and net.feature_info.reduction() == [8, 8]


def test_grad_checkpointing_gives_the_same_gradients():
    model = _tiny("resmlp_s24")
    x = torch.randn(2, 3, 32, 32)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing(True)
    model(x).sum().backward()
    for a, p in zip(plain, model.parameters(), strict=True):
        torch.testing.assert_close(p.grad, a, rtol=1e-4, atol=1e-6)


def test_optimizer_helpers():
    model = _tiny("resmlp_s12_cmlp", pos_embed=True)
    assert {"pos_embed", "class_mlp.cls_token"} <= model.no_weight_decay()
    from timm.optim import create_optimizer_v2

    opt = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    assert len(opt.param_groups) > 2


def test_published_cfgs_registered_like_timms():
    names = timm.list_pretrained("resmlp*")
    assert {"resmlp_s12.fb_in1k", "resmlp_s12.fb_distilled_in1k", "resmlp_s12.fb_dino",
            "resmlp_b24_p8.fb_in22k_ft_in1k"} <= set(names)
    assert {"mixer_b16.goog_in21k_ft_in1k", "mixer_b16.goog_in21k"} <= set(timm.list_pretrained("mixer_b16*"))
    cfg = timm.models.get_pretrained_cfg("resmlp_s12.fb_in1k").to_dict()
    assert cfg["hf_hub_id"] == "timm/resmlp_12_224.fb_in1k" and cfg["crop_pct"] == 0.9
    assert cfg["url"].endswith("resmlp_12_no_dist.pth") and cfg["paper_ids"].startswith("arXiv:2105.03404")
    mixer = timm.models.get_pretrained_cfg("mixer_b16.goog_in21k").to_dict()
    assert mixer["mean"] == (0.5, 0.5, 0.5) and mixer["num_classes"] == 21843
    assert timm.models.get_pretrained_cfg("resmlp_s12.fb_dino").num_classes == 0


def test_custom_and_loaded_models_describe_themselves(tmp_path):
    model = timm.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, num_classes=10, dim=16,
                              depth=2)
    assert resolve_data_config({}, model=model)["input_size"] == (1, 28, 28)
    meta = {"preprocess": dict(img_size=28, in_chans=1, mean=[0.286], std=[0.353], crop_pct=1.0,
                               interpolation="bilinear")}
    path = resmlp.save(model, tmp_path / "fm.safetensors", metadata=meta)
    data_cfg = resolve_data_config({}, model=resmlp.load(path))
    assert data_cfg["input_size"] == (1, 28, 28) and data_cfg["mean"] == (0.286,)
    assert data_cfg["crop_pct"] == 1.0 and data_cfg["interpolation"] == "bilinear"


@pytest.mark.parametrize("name", ["resmlp_s12", "mixer_s32"])
def test_big_preset_forward(name):
    model = timm.create_model(name, num_classes=3).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 224, 224)).shape == (1, 3)


def test_two_epochs_with_timms_training_utilities():
    from timm.data import Mixup
    from timm.loss import SoftTargetCrossEntropy
    from timm.optim import create_optimizer_v2
    from timm.scheduler import create_scheduler_v2
    from timm.utils import ModelEmaV3

    torch.manual_seed(0)
    model = timm.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2, num_classes=4,
                              drop_path_rate=0.1)
    ema = ModelEmaV3(model, decay=0.9)
    opt = create_optimizer_v2(model, "adamw", lr=3e-3, weight_decay=0.05)
    sched, epochs = create_scheduler_v2(opt, "cosine", num_epochs=2, warmup_epochs=0)
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, num_classes=4, label_smoothing=0.1)
    loss_fn = SoftTargetCrossEntropy()
    images, labels = torch.randn(16, 3, 32, 32), torch.arange(16) % 4
    losses = []
    for epoch in range(epochs):
        for start in range(0, 16, 8):
            x, y = mixup(images[start:start + 8], labels[start:start + 8])
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            ema.update(model)
            losses.append(loss.item())
        sched.step(epoch + 1)
    assert epochs == 2 and all(torch.isfinite(torch.tensor(losses)))
    assert not torch.equal(ema.module.head.weight, model.head.weight)  # the EMA lags the trained weights
    assert ema.module(images).shape == (16, 4)

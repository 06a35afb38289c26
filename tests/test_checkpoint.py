"""Checkpoints: our safetensors format, timm and DeiT interoperability, and refusing bad files."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
import timm
import torch
from conftest import make_trained_like_
from timm.models.mlp_mixer import Affine as TimmAffine
from timm.models.mlp_mixer import MlpMixer, ResBlock

import resmlp
from resmlp.checkpoint import (
    CheckpointError,
    WeightsUnavailableError,
    detect_format,
    from_resmlp_keys,
    to_resmlp_keys,
)
from resmlp.models import registry


def _logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(x)


@pytest.fixture(scope="module")
def image() -> torch.Tensor:
    return torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("timm_name,ours", [("resmlp_12_224", "resmlp_s12"), ("mixer_b16_224", "mixer_b16")])
def test_timm_weights_give_identical_logits(timm_name, ours, image, tmp_path):
    theirs = make_trained_like_(timm.create_model(timm_name, pretrained=False))
    path = tmp_path / "timm.pth"
    torch.save(theirs.state_dict(), path)
    model = resmlp.create_model(ours, checkpoint_path=path)
    assert (_logits(model, image) - _logits(theirs, image)).abs().max() < 1e-5

    # and the other way: our export loads strictly into timm's model
    exported = tmp_path / "back.safetensors"
    resmlp.export_checkpoint(model, exported, format="timm")
    fresh = timm.create_model(timm_name, pretrained=False)
    from safetensors.torch import load_file

    fresh.load_state_dict(load_file(exported), strict=True)
    assert (_logits(fresh, image) - _logits(model, image)).abs().max() < 1e-5


def _tiny_timm_resmlp() -> MlpMixer:
    return make_trained_like_(MlpMixer(num_classes=5, img_size=32, patch_size=8, num_blocks=2, embed_dim=24,
                                       mlp_ratio=4,
                                       block_layer=ResBlock, norm_layer=TimmAffine))


def _deit_state_dict(timm_model: MlpMixer) -> dict[str, torch.Tensor]:
    """timm -> DeiT names, written independently of resmlp.checkpoint to check its mapping."""
    out = {}
    for k, v in timm_model.state_dict().items():
        k = k.replace("stem.", "patch_embed.").replace("linear_tokens.", "attn.")
        k = k.replace("mlp_channels.", "mlp.").replace(".ls1", ".gamma_1").replace(".ls2", ".gamma_2")
        out[k] = v
    return out


@pytest.mark.parametrize("layout", ["flat", "under_model", "with_args"])
def test_deit_files_load(layout, tmp_path):
    theirs = _tiny_timm_resmlp()
    sd = _deit_state_dict(theirs)
    payload = {"flat": sd, "under_model": {"model": sd},
               "with_args": {"model": sd, "epoch": 3, "args": argparse.Namespace(lr=5e-3)}}[layout]
    path = tmp_path / "deit.pth"
    torch.save(payload, path)
    model = resmlp.load(path)  # architecture read off the weights
    assert model.config.depth == 2 and model.config.dim == 24 and model.config.num_patches == 16
    x = torch.randn(3, 3, 32, 32)
    assert (_logits(model, x) - _logits(theirs, x)).abs().max() < 1e-5


def test_format_detection_and_round_trips():
    theirs = _tiny_timm_resmlp()
    timm_sd = theirs.state_dict()
    assert detect_format(timm_sd) == "timm_resmlp"
    assert detect_format(_deit_state_dict(theirs)) == "deit_resmlp"
    ours = to_resmlp_keys(timm_sd)
    assert detect_format(ours) == "resmlp"
    assert "blocks.1.cross_patch_scale.gamma" in ours and ours["norm.alpha"].shape == (24,)
    for fmt in ("timm_resmlp", "deit_resmlp"):
        back = from_resmlp_keys(ours, fmt)
        again = to_resmlp_keys(back)
        assert again.keys() == ours.keys() and all(torch.equal(again[k], ours[k]) for k in ours)
    assert from_resmlp_keys(ours, "timm_resmlp").keys() == timm_sd.keys()
    with pytest.raises(CheckpointError, match="unrecognised checkpoint keys"):
        detect_format({"encoder.layer.0.weight": torch.zeros(1)})


def test_deit_export_round_trip(tmp_path):
    model = make_trained_like_(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2))
    path = resmlp.export_checkpoint(model, tmp_path / "deit.pth", format="deit")
    raw = torch.load(path, weights_only=True)
    assert "model" in raw and "blocks.0.attn.weight" in raw["model"] and "blocks.0.gamma_1" in raw["model"]
    x = torch.randn(2, 3, 32, 32)
    assert (_logits(resmlp.load(path), x) - _logits(model, x)).abs().max() < 1e-6


def test_export_refuses_what_timm_cannot_express(tmp_path):
    model = resmlp.create_model("resmlp_s12_cmlp", img_size=32, patch_size=8, dim=16, depth=1)
    with pytest.raises(CheckpointError, match="class_mlp.*no equivalent in timm"):
        resmlp.export_checkpoint(model, tmp_path / "x.pth", format="timm")
    assert not (tmp_path / "x.pth").exists()


@pytest.mark.parametrize(
    "overrides",
    [dict(pooling="class_mlp", pos_embed=True), dict(norm="batchnorm", act="relu"), dict(norm="l2"),
     dict(cross_patch="dwsep3x3"), dict(cross_patch="mlp", cross_patch_hidden=12, norm="layernorm")],
)
def test_save_load_rebuilds_the_model_alone(overrides, tmp_path):
    model = make_trained_like_(resmlp.ResMLP(resmlp.ResMLPConfig(img_size=32, patch_size=8, dim=16, depth=2,
                                                                 num_classes=4, **overrides)))
    meta = {"class_names": list("abcd"), "preprocess": {"mean": [0.5], "std": [0.25]}}
    path = resmlp.save(model, tmp_path / "m.safetensors", metadata=meta)
    loaded = resmlp.load(path)
    assert loaded.config == model.config
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(_logits(loaded, x), _logits(model, x), rtol=0, atol=0)
    assert resmlp.read_metadata(path) == meta
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_save_insists_on_safetensors(tmp_path):
    with pytest.raises(ValueError, match=r"\*.safetensors"):
        resmlp.save(resmlp.ResMLP(resmlp.ResMLPConfig(img_size=16, patch_size=8, dim=8, depth=1)), tmp_path / "m.pt")


def test_truncated_and_foreign_files_are_refused_with_the_file_named(tmp_path):
    model = resmlp.ResMLP(resmlp.ResMLPConfig(img_size=16, patch_size=8, dim=8, depth=1))
    good = resmlp.save(model, tmp_path / "good.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated.safetensors.*truncated"):
        resmlp.load(truncated)
    foreign = tmp_path / "foreign.safetensors"
    foreign.write_bytes(b"GIF89a not weights at all")
    with pytest.raises(CheckpointError, match="foreign.safetensors"):
        resmlp.load(foreign)
    bad_pth = tmp_path / "cut.pth"
    torch.save(model.state_dict(), bad_pth)
    bad_pth.write_bytes(bad_pth.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="cut.pth is truncated"):
        resmlp.load(bad_pth)
    not_weights = tmp_path / "list.pth"
    torch.save([1, 2, 3], not_weights)
    with pytest.raises(CheckpointError, match="no state dict"):
        resmlp.load(not_weights)
    with pytest.raises(FileNotFoundError, match="missing.pth does not exist"):
        resmlp.load(tmp_path / "missing.pth")


class _Payload:
    """A pickle that would run code when loaded without weights_only."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_pickles_that_need_code_are_refused_and_never_run(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": _Payload(str(marker))}, path)
    with pytest.raises(CheckpointError, match="refusing to load.*never run code"):
        resmlp.load(path)
    assert not marker.exists()


def test_mismatched_checkpoint_says_what_differs(tmp_path):
    deep = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=3)
    path = resmlp.save(deep, tmp_path / "deep.safetensors")
    shallow = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2)
    with pytest.raises(CheckpointError, match="depth: checkpoint 3, model 2"):
        resmlp.load_checkpoint(shallow, path)
    other_res = resmlp.create_model("resmlp_s12", img_size=64, patch_size=8, dim=16, depth=3)
    with pytest.raises(CheckpointError, match="img_size: checkpoint 32, model 64"):
        resmlp.load_checkpoint(other_res, path)


def test_new_head_when_num_classes_differs(tmp_path):
    src = make_trained_like_(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2))
    path = resmlp.save(src, tmp_path / "src.safetensors")
    model = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=2, num_classes=3,
                                checkpoint_path=path)
    assert model.head.out_features == 3
    torch.testing.assert_close(model.blocks[1].cross_patch.weight, src.blocks[1].cross_patch.weight)


def test_pretrained_without_network_names_the_file_to_place(tmp_path, monkeypatch):
    monkeypatch.setattr("resmlp.models.weight_tags._connects", lambda host, port: False)  # no probe of the network
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "hub"))
    weights = registry.PublishedWeights("http://127.0.0.1:9/resmlp_12_no_dist.pth")
    monkeypatch.setitem(registry.PUBLISHED, "resmlp_s12", {"fb_in1k": weights})
    expected = tmp_path / "hub" / "checkpoints" / "resmlp_12_no_dist.pth"
    with pytest.raises(WeightsUnavailableError, match=f"place it at {expected}"):
        resmlp.create_model("resmlp_s12", pretrained=True)
    # once the file is placed there by hand, the same call works offline (DeiT format, as published)
    src = make_trained_like_(resmlp.create_model("resmlp_s12"))
    resmlp.export_checkpoint(src, expected, format="deit")
    model = resmlp.create_model("resmlp_s12", pretrained=True)
    torch.testing.assert_close(model.blocks[3].cross_patch.weight, src.blocks[3].cross_patch.weight)
    with pytest.raises(ValueError, match="no weights tagged 'fb_xyz'"):
        resmlp.create_model("resmlp_s12", pretrained="fb_xyz")
    with pytest.raises(ValueError, match="no published weights for 'resmlp_s12_p8'"):
        resmlp.create_model("resmlp_s12_p8", pretrained=True)


def test_published_weights_table_points_at_real_file_names():
    names = {w.url.rsplit("/", 1)[-1] for tags in registry.PUBLISHED.values() for w in tags.values()}
    assert "resmlp_12_no_dist.pth" in names and "resmlpB_24_22k.pth" in names
    assert all(Path(n).suffix == ".pth" for n in names)


def test_timm_models_save_and_load_alone(tmp_path):
    """A convnet teacher trained by this project's engine is saved and rebuilt like our models."""
    convnet = timm.create_model("resnet10t", num_classes=4, in_chans=1).eval()
    path = resmlp.save(convnet, tmp_path / "teacher.safetensors", metadata={"class_names": list("abcd")})
    loaded = resmlp.load(path).eval()
    assert type(loaded) is type(convnet)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(_logits(loaded, x), _logits(convnet, x))
    with pytest.raises(ValueError, match="not Linear"):
        resmlp.save(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")

"""Weights both ways: timm / DeiT / DINO layouts in and out, pretrained resolution from caches, input sizes.

The DeiT- and DINO-side models are written here from those projects' key names and shapes (1-D Affine and
LayerScale, `attn` token mixer, `backbone.` prefix), so the round trips test the real layouts.
"""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import make_trained_like_
from safetensors.torch import save_file
from timm.layers import Mlp, PatchEmbed
from timm.models.mlp_mixer import Affine as TimmAffine
from timm.models.mlp_mixer import MlpMixer, ResBlock
from torch import nn

import resmlp
from resmlp.models import registry
from resmlp.models.pretrained import imagenet_class_names

SMALL = dict(img_size=32, patch_size=8, dim=16, depth=2)


class DeitAffine(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        return self.alpha * x + self.beta


class DeitLayer(nn.Module):
    def __init__(self, dim: int, num_patches: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = DeitAffine(dim), DeitAffine(dim)
        self.attn = nn.Linear(num_patches, num_patches)
        self.mlp = Mlp(dim, 4 * dim)
        self.gamma_1 = nn.Parameter(torch.full((dim,), 0.1))
        self.gamma_2 = nn.Parameter(torch.full((dim,), 0.1))

    def forward(self, x):
        x = x + self.gamma_1 * self.attn(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.gamma_2 * self.mlp(self.norm2(x))


class DeitResMLP(nn.Module):
    """The DeiT repository's ResMLP layout (patch_embed / blocks.i.attn / gamma_1 / 1-D alpha)."""

    def __init__(self, img_size=32, patch_size=8, dim=16, depth=2, num_classes=1000) -> None:
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, 3, dim)
        n = (img_size // patch_size) ** 2
        self.blocks = nn.ModuleList(DeitLayer(dim, n) for _ in range(depth))
        self.norm = DeitAffine(dim)
        self.head = nn.Linear(dim, num_classes) if num_classes else nn.Identity()

    def forward(self, x):
        x = self.patch_embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(1))


def _timm_resmlp() -> MlpMixer:
    """timm's own ResMLP class at a tiny size (its registered names fix the patch size)."""
    return MlpMixer(img_size=32, patch_size=8, num_blocks=2, embed_dim=16, mlp_ratio=4, block_layer=ResBlock,
                    norm_layer=TimmAffine)


def _logits(model, x):
    with torch.no_grad():
        return model.eval()(x)


X = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))


def test_deit_round_trip(tmp_path):
    ours = make_trained_like_(resmlp.create_model("resmlp_s12", **SMALL))
    path = resmlp.export_checkpoint(ours, tmp_path / "deit.pth", format="deit")
    deit = DeitResMLP()
    deit.load_state_dict(torch.load(path, weights_only=True)["model"], strict=True)
    torch.testing.assert_close(_logits(deit, X), _logits(ours, X), rtol=1e-4, atol=1e-5)
    # and a DeiT file loads back, through timm's loaders as through ours
    theirs = make_trained_like_(DeitResMLP())
    torch.save({"model": theirs.state_dict()}, tmp_path / "theirs.pth")
    via_timm = timm.create_model("resmlp_s12", checkpoint_path=str(tmp_path / "theirs.pth"), **SMALL)
    torch.testing.assert_close(_logits(via_timm, X), _logits(theirs, X), rtol=1e-4, atol=1e-5)
    fresh = resmlp.create_model("resmlp_s12", **SMALL)
    timm.models.load_checkpoint(fresh, str(tmp_path / "theirs.pth"))
    torch.testing.assert_close(_logits(fresh, X), _logits(theirs, X), rtol=1e-4, atol=1e-5)


def test_timm_round_trip(tmp_path):
    theirs = make_trained_like_(_timm_resmlp())
    torch.save({"state_dict": theirs.state_dict()}, tmp_path / "timm.pth")
    ours = timm.create_model("resmlp_s12", checkpoint_path=str(tmp_path / "timm.pth"), **SMALL)
    torch.testing.assert_close(_logits(ours, X), _logits(theirs, X), rtol=1e-4, atol=1e-5)
    back = resmlp.export_checkpoint(ours, tmp_path / "back.pth", format="timm")
    fresh = _timm_resmlp()
    fresh.load_state_dict(torch.load(back, weights_only=True), strict=True)
    torch.testing.assert_close(_logits(fresh, X), _logits(ours, X), rtol=1e-4, atol=1e-5)


def test_dino_round_trip_and_checkpoints(tmp_path):
    ours = make_trained_like_(resmlp.create_model("resmlp_s12", num_classes=0, **SMALL))
    path = resmlp.export_checkpoint(ours, tmp_path / "dino.pth", format="dino")
    # what DINO's eval_knn.py does: take checkpoint_key, strip 'module.' and 'backbone.', load non-strictly
    state = torch.load(path, weights_only=True)["teacher"]
    state = {k.removeprefix("module.").removeprefix("backbone."): v for k, v in state.items()}
    backbone = DeitResMLP(num_classes=0)
    result = backbone.load_state_dict(state, strict=False)
    assert not result.missing_keys and not result.unexpected_keys
    torch.testing.assert_close(_logits(backbone, X), _logits(ours, X), rtol=1e-4, atol=1e-5)
    # a DINO training checkpoint: teacher / student (under module.), a projection head to drop
    teacher = make_trained_like_(DeitResMLP(num_classes=0))
    student = make_trained_like_(DeitResMLP(num_classes=0), seed=1)
    head = {"head.mlp.0.weight": torch.randn(8, 16), "head.last_layer.weight": torch.randn(4, 8)}
    ckpt = {"teacher": {**{f"backbone.{k}": v for k, v in teacher.state_dict().items()}, **head},
            "student": {**{f"module.backbone.{k}": v for k, v in student.state_dict().items()},
                        **{f"module.{k}": v for k, v in head.items()}},
            "epoch": 10}
    torch.save(ckpt, tmp_path / "checkpoint.pth")
    loaded = resmlp.create_model("resmlp_s12", num_classes=0, checkpoint_path=tmp_path / "checkpoint.pth", **SMALL)
    torch.testing.assert_close(_logits(loaded, X), _logits(teacher, X), rtol=1e-4, atol=1e-5)
    chosen = timm.create_model("resmlp_s12", pretrained=True, num_classes=0, pretrained_cfg_overlay=dict(
        file=str(tmp_path / "checkpoint.pth"), checkpoint_key="student"), **SMALL)
    torch.testing.assert_close(_logits(chosen, X), _logits(student, X), rtol=1e-4, atol=1e-5)


def test_ema_files_load(tmp_path):
    src = make_trained_like_(resmlp.create_model("resmlp_s12", **SMALL))
    ema = make_trained_like_(resmlp.create_model("resmlp_s12", **SMALL), seed=3)
    torch.save({"state_dict": src.state_dict(), "state_dict_ema": ema.state_dict()}, tmp_path / "ema.pth")
    model = resmlp.create_model("resmlp_s12", **SMALL)
    resmlp.load_checkpoint(model, tmp_path / "ema.pth")
    torch.testing.assert_close(_logits(model, X), _logits(ema, X))  # EMA weights first, as timm's loaders


def test_deit_training_checkpoints_load_model_as_deit_evaluates(tmp_path):
    # DeiT's main.py saves {'model', 'model_ema', 'optimizer', ...}; its --eval and --resume load ['model']
    raw = make_trained_like_(DeitResMLP())
    ema = make_trained_like_(DeitResMLP(), seed=5)
    torch.save({"model": raw.state_dict(), "model_ema": ema.state_dict(), "epoch": 3}, tmp_path / "checkpoint.pth")
    loaded = resmlp.create_model("resmlp_s12", checkpoint_path=tmp_path / "checkpoint.pth", **SMALL)
    torch.testing.assert_close(_logits(loaded, X), _logits(raw, X), rtol=1e-4, atol=1e-5)
    # the EMA stays reachable by name
    chosen = timm.create_model("resmlp_s12", pretrained=True, pretrained_cfg_overlay=dict(
        file=str(tmp_path / "checkpoint.pth"), checkpoint_key="model_ema"), **SMALL)
    torch.testing.assert_close(_logits(chosen, X), _logits(ema, X), rtol=1e-4, atol=1e-5)


def test_pretrained_from_the_hub_cache_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    src = make_trained_like_(_timm_resmlp())
    weights = registry.PublishedWeights("http://127.0.0.1:9/none.pth", hf_hub_id="timm/resmlp_12_224.fb_in1k")
    monkeypatch.setitem(registry.PUBLISHED, "resmlp_s12", {"fb_in1k": weights})
    repo = tmp_path / "hub" / "models--timm--resmlp_12_224.fb_in1k"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()},
              str(repo / "snapshots" / commit / "model.safetensors"))
    model = timm.create_model("resmlp_s12", pretrained=True, cache_dir=str(tmp_path / "hub"), **SMALL)
    torch.testing.assert_close(_logits(model, X), _logits(src, X), rtol=1e-4, atol=1e-5)
    assert model.pretrained_cfg["crop_pct"] == 0.9 and model.pretrained_cfg["tag"] == "fb_in1k"
    # timm's stem adaptation for other channel counts: a grayscale image as the RGB model sees it
    gray = timm.create_model("resmlp_s12", pretrained=True, in_chans=1, cache_dir=str(tmp_path / "hub"), **SMALL)
    torch.testing.assert_close(_logits(gray, X[:, :1]), _logits(src, X[:, :1].expand(-1, 3, -1, -1)),
                               rtol=1e-4, atol=1e-5)
    assert gray.pretrained_cfg["input_size"] == (1, 32, 32)


def test_pretrained_falls_back_to_the_url_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants as hf

    monkeypatch.setattr(hf, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path / "torch"))
    weights = registry.PublishedWeights("http://127.0.0.1:9/resmlp_12_no_dist.pth", hf_hub_id="timm/absent")
    monkeypatch.setitem(registry.PUBLISHED, "resmlp_s12", {"fb_in1k": weights})
    src = make_trained_like_(DeitResMLP())
    (tmp_path / "torch" / "checkpoints").mkdir(parents=True)
    torch.save({"model": src.state_dict()}, tmp_path / "torch" / "checkpoints" / "resmlp_12_no_dist.pth")
    model = timm.create_model("resmlp_s12", pretrained=True, cache_dir=str(tmp_path / "hub"), **SMALL)
    torch.testing.assert_close(_logits(model, X), _logits(src, X), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("factor", [2, 3])
def test_mixer_at_k_times_the_size_is_exact_on_tiled_images(tmp_path, factor):
    mixer = make_trained_like_(resmlp.create_model("mixer_s16", cross_patch_hidden=12, num_classes=5, **SMALL))
    path = resmlp.export_checkpoint(mixer, tmp_path / "mixer.pth", format="timm")
    big = timm.create_model("mixer_s16", checkpoint_path=str(path), img_size=32 * factor, patch_size=8, dim=16,
                            depth=2, cross_patch_hidden=12 * factor**2, num_classes=5)
    tiled = X.repeat(1, 1, factor, factor)
    torch.testing.assert_close(_logits(big, tiled), _logits(mixer, X), rtol=1e-4, atol=1e-5)
    moved = make_trained_like_(resmlp.create_model("mixer_s16", cross_patch_hidden=12, num_classes=5, **SMALL))
    expected = _logits(moved, X)
    moved.set_input_size(img_size=32 * factor)
    assert moved.pretrained_cfg["input_size"] == (3, 32 * factor, 32 * factor)
    torch.testing.assert_close(_logits(moved, tiled), expected, rtol=1e-4, atol=1e-5)


def test_set_input_size_on_resmlp_and_checkpoints_at_another_size(tmp_path):
    model = make_trained_like_(resmlp.create_model("resmlp_s12_cmlp", **SMALL))
    path = resmlp.save(model, tmp_path / "m.safetensors")
    model.set_input_size(img_size=48)
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 1000)
    assert model.blocks[0].cross_patch.weight.shape == (36, 36)
    again = resmlp.create_model("resmlp_s12_cmlp", checkpoint_path=path, img_size=48, patch_size=8, dim=16,
                                depth=2)
    torch.testing.assert_close(again.state_dict(), model.state_dict())
    model.set_input_size(patch_size=16)
    assert model(torch.randn(1, 3, 48, 48)).shape == (1, 1000)
    with pytest.raises(ValueError, match="input is 40x40 but the model expects 48x48.*set_input_size"):
        model(torch.randn(1, 3, 40, 40))


def test_imagenet_class_names():
    assert imagenet_class_names(1000)[207] == "golden retriever"
    assert len(imagenet_class_names(21843)) == 21843
    assert imagenet_class_names(10) is None

"""One loading rule, timm's: a checkpoint's head is kept whenever it fits; `num_classes` defaults to the file's;
only a different `num_classes` starts a new head (said in one warning). Errors describe the file as it is."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import make_trained_like_
from safetensors.torch import save_file

import resmlp
from resmlp.errors import CheckpointError

SMALL = dict(img_size=32, patch_size=8, dim=16, depth=2)


@pytest.fixture
def timm_file(tmp_path):
    """A 10-class checkpoint in timm's key layout (as timm's own training script writes it)."""
    from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

    model = make_trained_like_(MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=2, embed_dim=16,
                                        mlp_ratio=4, block_layer=ResBlock, norm_layer=Affine))
    path = tmp_path / "timm10.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    return path, model


def _quiet(**kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # keeping the head must not warn
        return resmlp.create_model("resmlp_s12", **kwargs)


def test_the_head_is_kept_when_num_classes_matches(timm_file):
    path, theirs = timm_file
    model = _quiet(num_classes=10, checkpoint_path=path, **SMALL)
    assert torch.equal(model.head.weight, theirs.head.weight)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(model.eval()(x), theirs.eval()(x), atol=1e-5)


def test_num_classes_defaults_to_the_files(timm_file):
    path, theirs = timm_file
    model = _quiet(checkpoint_path=path, **SMALL)
    assert model.config.num_classes == 10 and torch.equal(model.head.weight, theirs.head.weight)


def test_another_num_classes_starts_a_new_head_and_says_so(timm_file):
    path, theirs = timm_file
    with pytest.warns(UserWarning, match="10-class head is not loaded") as caught:
        model = resmlp.create_model("resmlp_s12", num_classes=3, checkpoint_path=path, **SMALL)
    assert len(caught) == 1 and len(str(caught[0].message).splitlines()) == 1
    assert model.head.weight.shape == (3, 16)
    assert torch.equal(model.stem.proj.weight, theirs.stem.proj.weight)  # the trunk is loaded


def test_a_mismatch_is_described_as_the_file_is(tmp_path):
    small = resmlp.create_model("resmlp_s12", img_size=28, patch_size=4, in_chans=1, num_classes=10, dim=16,
                                depth=2)
    path = tmp_path / "s28.safetensors"
    resmlp.save(small, path)
    for kwargs in ({}, {"num_classes": 10}, {"num_classes": 4}):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(CheckpointError) as info:
                resmlp.create_model("resmlp_s12", checkpoint_path=path, **kwargs)
        message = str(info.value)
        # before: the grid refitted to the model reported 56 px, and a dropped head 0 classes
        assert "img_size: checkpoint 28, model 224" in message
        assert "num_classes: checkpoint" not in message
        assert "reset_head" not in message  # create_model has no such option


def test_a_head_only_mismatch_names_an_option_that_exists(tmp_path):
    model = resmlp.create_model("resmlp_s12", num_classes=10, **SMALL)
    path = tmp_path / "m.safetensors"
    resmlp.save(model, path)
    other = resmlp.create_model("resmlp_s12", num_classes=4, **SMALL)
    with pytest.raises(CheckpointError, match=r"load_checkpoint\(model, path, reset_head=True\)"):
        resmlp.load_checkpoint(other, path)
    resmlp.load_checkpoint(other, path, reset_head=True)  # the option the message names works

"""dynamic_img_size, as timm's ViTs take it, is refused for ResMLP and Mixer in one line that says why and what
to do instead (docs/models.md, "Resolution change"): their cross-patch layer is tied to the number of patches."""

from __future__ import annotations

import pytest
import timm

import resmlp
from resmlp.cli import main


@pytest.mark.parametrize("name", ["resmlp_s12", "mixer_s16"])
def test_dynamic_img_size_is_refused_naming_the_docs_and_the_alternative(name):
    for create in (timm.create_model, resmlp.create_model):
        with pytest.raises(ValueError) as e:
            create(name, dynamic_img_size=True, dim=16, depth=1)
        message = str(e.value)
        assert "\n" not in message and "docs/models.md" in message and "tied to the number of patches" in message
        assert "set_input_size(img_size=N)" in message and "resmlp finetune CHECKPOINT --img-size N" in message
    assert isinstance(timm.create_model(name, dynamic_img_size=False, dim=16, depth=1), resmlp.ResMLP)


def test_dynamic_img_size_in_a_recipe_is_one_config_error(tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "r"), "--set", "model.dynamic_img_size=true", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "model: dynamic_img_size=True: resmlp_s12 has no dynamic image size" in err and "Traceback" not in err

"""Presets land on the paper's numbers; `resmlp models` reports them; timm sees the presets."""

from __future__ import annotations

import json

import pytest
import timm

import resmlp
from resmlp.cli import main
from resmlp.complexity import complexity, count_gmacs, count_params
from resmlp.models.registry import PRESETS, TABLE3_ROWS, model_config


@pytest.mark.parametrize("row", TABLE3_ROWS, ids=lambda r: r.label)
def test_table3_row_matches_paper(row):
    params, gmacs = complexity(model_config(row.preset, **row.overrides))
    assert abs(params / 1e6 - row.paper_params_m) <= 0.1, f"{row.label}: {params / 1e6:.2f}M"
    assert abs(gmacs - row.paper_gmacs) <= 0.1, f"{row.label}: {gmacs:.2f} GMACs"


@pytest.mark.parametrize(
    "name,expected",
    [("mixer_b16", 59_880_472), ("mixer_b32", 60_293_428), ("mixer_l16", 208_196_168)],
)
def test_mixer_parameter_counts_are_exact(name, expected):
    assert complexity(model_config(name))[0] == expected


def test_deeper_rows_of_appendix_table_d3():
    """S36 44.7M / 8.9 GMACs; class-MLP S24 32.4M and S36 47.1M (Table D.3)."""
    for name, params_m, gmacs in (("resmlp_s36", 44.7, 8.9), ("resmlp_s24_cmlp", 32.4, 6.0),
                                  ("resmlp_s36_cmlp", 47.1, 8.9)):
        params, measured = complexity(model_config(name))
        assert abs(params / 1e6 - params_m) <= 0.1 and abs(measured - gmacs) <= 0.1


def test_meta_counting_equals_real_model_counting():
    cfg = model_config("resmlp_s12", img_size=64, num_classes=10)
    model = resmlp.ResMLP(cfg)
    assert complexity(cfg) == pytest.approx((count_params(model), count_gmacs(model, (3, 64, 64))))


def test_models_command_json_lists_every_preset_and_row(capsys):
    assert main(["models", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    names = {d["name"] for d in data}
    assert set(PRESETS) <= names and {r.label for r in TABLE3_ROWS} <= names
    for d in data:
        assert d["params"] > 0 and d["gmacs"] > 0
        if d["kind"] == "table3":
            assert abs(d["params_m"] - d["paper_params_m"]) <= 0.1
            assert abs(d["gmacs"] - d["paper_gmacs"]) <= 0.1


def test_models_command_table(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "resmlp_s12_cmlp" in out and "S12 linear -> conv 3x3 depth-separable" in out


def test_list_models_pattern():
    assert resmlp.list_models("resmlp_s12*") == ["resmlp_s12", "resmlp_s12_cmlp", "resmlp_s12_p14", "resmlp_s12_p8"]
    assert len(resmlp.list_models("mixer_*")) == 7


def test_presets_are_registered_in_timm():
    assert set(PRESETS) <= set(timm.list_models("*"))
    model = timm.create_model("resmlp_s12", num_classes=10, img_size=64)
    assert isinstance(model, resmlp.ResMLP)
    assert model.config.num_classes == 10 and model.config.depth == 12 and model.config.num_patches == 16

"""docs/claims.md is what benchmarks/claims.py computes from the results it cites, by the one verdict rule."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import claims  # noqa: E402 (benchmarks/ is not a package)
from verdict import effect, verdict  # noqa: E402


@pytest.mark.parametrize(("delta", "noise", "paper", "expected"), [
    (5.0, None, 1.0, "one run"),
    (0.84, 7.3, 0.7, "within the noise"),
    (-3.0, 1.0, 0.4, "contradicted"),
    (1.5, 1.0, 1.1, "reproduced"),
    (6.3, 2.0, 1.1, "same sign, different size"),
    (0.3, 1.0, 0.0, "consistent"),
    (3.0, 1.0, 0.0, "contradicted"),
])
def test_the_verdict_rule(delta, noise, paper, expected):
    assert verdict(delta, noise, paper) == expected


def test_effect_noise_needs_a_spread_on_both_sides():
    assert effect([1.0, 3.0], [0.0]) == (2.0, None)
    assert effect([1.0, 3.0], [0.0, 1.0]) == (1.5, 1.5)


def test_claims_page_is_generated_from_its_sources():
    # a hand edit of a verdict or number, or new run records without regenerating, fails here
    assert (ROOT / "docs" / "claims.md").read_text() == claims.render(), "run: python benchmarks/claims.py"


def test_quoted_numbers_are_in_the_documents_they_cite():
    for c in claims.CLAIMS_TABLE:
        if isinstance(c.measure, claims.Cited):
            text = (ROOT / c.measure.source).read_text()
            missing = [q for q in c.measure.quotes if q not in text]
            assert not missing, f"{c.claim}: {missing} not in {c.measure.source}"


def test_every_claim_of_the_paper_has_a_row():
    rows = [c.claim for c in claims.CLAIMS_TABLE]
    for needle in ("ReLU", "SiLU", "HardSwish", "BatchNorm", "l2-norm", "expansion factor", "position encodings",
                   "absorbed", "Table D.1", "Table D.2", "Table D.3: class-MLP", "Fig. 2: the last", "Fig. B.2",
                   "below ViT", "12 layers beat 6", "Flowers-102", "pre-norm and post-norm", "Fig. 4"):
        assert any(needle in row for row in rows), needle


def test_ablation_rows_use_the_study_rows_paper_deltas():
    # each ablation claim's paper delta is the study's own (claims.ablation raises on a mismatch)
    from ablations import BY_LABEL

    for c in claims.CLAIMS_TABLE:
        if isinstance(c.measure, claims.Ablation):
            assert c.measure.paper_delta == BY_LABEL[c.measure.label].paper_delta, c.measure.label


def test_one_run_rows_never_get_a_verdict_beyond_one_run():
    runs = {"baseline": [50.0], "class-mlp": [58.0, 59.0]}
    _, result = claims.ablation(claims.Ablation("class-mlp", 77.5 - 76.6), runs)
    assert result == "one run"

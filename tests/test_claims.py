"""docs/claims.md is what benchmarks/claims.py computes from the results it cites, by the one verdict rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import claims  # noqa: E402 (benchmarks/ is not a package)
from verdict import effect, verdict  # noqa: E402


@pytest.mark.parametrize(("delta", "noise", "paper", "expected"), [
    (5.0, None, 1.0, "one run"),
    (0.3, 1.0, 1.5, "within the noise"),
    (0.84, 7.3, 0.7, "the scale cannot tell"),
    # issue 49: the depth-wise conv row, once "reproduced": the noise is 30x the paper's effect
    (-9.99, 9.83, -0.3, "the scale cannot tell"),
    (-20.0, 9.83, -0.3, "same sign, different size"),  # the paper's small delta lies outside ours ± noise
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
                   "below ViT", "12 layers beat 6", "Flowers-102", "pre-norm and post-norm", "Fig. 4",
                   # issue 42 item 6: the headline, Table 1 at equal FLOPs and on the H100, Table 3's other rows,
                   # Table 2's S24, Appendix A's CaiT steps and linear layer, Appendix B, the training cost
                   "ImageNet-ReaL", "comparable FLOPs", "faster than DeiT-S (throughput ratio), H100", "patch 16 → 14",
                   "B24/8 without distillation", "ImageNet-21k", "DINO pre-training of ResMLP-S24", "SA → MLP",
                   "class-attention → class-MLP", "(79.5 %)", "expansion table", "similar to the supervised S24",
                   "distilled S12", "two days",
                   # issue 49 item 4: Appendix A's distillation and normalisation, Table 1's B24 and convnets,
                   # Sec. 3.4's patches, Table D.3's distilled class-MLP
                   "distillation of the CaiT-derived", "normalisation results disagree", "B24 runs at a sixth",
                   "B24's peak memory", "convnets' throughputs", "smaller patches benefit larger models",
                   "distillation with class-MLP"):
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
    assert result.split(";")[0] == "one run"


def test_every_verdict_from_the_2_epoch_study_carries_its_caveat_in_the_table():
    runs = claims.read_runs(claims.read_records(claims.RECORDS))
    rows = [line for line in claims.render().splitlines() if line.startswith("| ")]
    studied = [c for c in claims.CLAIMS_TABLE
               if isinstance(c.measure, (claims.Ablation, claims.Contrast, claims.Swapped))]
    assert len(studied) >= 20
    for c in studied:
        row = next(r for r in rows if r.startswith(f"| {c.claim} |"))
        assert row.rstrip(" |").endswith(claims.TWO_EPOCH_CAVEAT), c.claim
    assert runs  # the records were read


def test_the_gpu_sentence_says_what_was_measured_on_a_gpu():
    page = claims.render()
    assert "Nothing was measured on a GPU" not in page and "H100" in page


# ------------------------------------------------------------------------------------------ the records (T13)
GOOD = dict(label="baseline", seed=0, budget=2, epochs=2, test_top1=51.0, selected_epoch=2, wall_seconds=100.0,
            amp="bf16", code="abc1234", host="host", synthetic=False)


def _records(tmp_path, records) -> Path:
    path = tmp_path / "records.json"
    path.write_text(json.dumps(records) if not isinstance(records, str) else records)
    return path


@pytest.mark.parametrize(("bad", "words"), [
    (dict(test_top1=150), "test_top1 is 150"),
    (dict(test_top1=-40), "test_top1 is -40"),
    (dict(test_top1=1e308), "test_top1 is 1e+308"),
    (dict(test_top1=True), "test_top1 is True"),
    (dict(test_top1="51"), "test_top1 is '51'"),
    (dict(seed=True), "seed is True"),
    (dict(label="no-such-row"), "label is 'no-such-row'"),
    (dict(wall_seconds=-1), "wall_seconds is -1"),
    (dict(extra=1), "fields ablations.py never writes"),
])
def test_an_impossible_record_is_refused_in_one_line_naming_it_and_nothing_is_written(bad, words, tmp_path,
                                                                                        monkeypatch, capsys):
    page = tmp_path / "claims.md"
    monkeypatch.setattr(claims, "CLAIMS", page)
    path = _records(tmp_path, [GOOD, {**GOOD, "seed": 1, **bad}])
    assert claims.main(["--records", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "record 1" in err and words in err, err
    assert not page.exists()


def test_nan_is_refused_though_json_accepts_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(claims, "CLAIMS", tmp_path / "claims.md")
    path = _records(tmp_path, json.dumps([GOOD]).replace("51.0", "NaN"))
    assert claims.main(["--records", str(path)]) == 2
    assert "test_top1 is nan" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "words"), [("{", "not valid JSON"), ('{"a": 1}', "not a list"),
                                             ("[1]", "record 0 is 1, not a run record")])
def test_a_broken_records_file_is_refused_in_one_line(text, words, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(claims, "CLAIMS", tmp_path / "claims.md")
    assert claims.main(["--records", str(_records(tmp_path, text))]) == 2
    assert words in capsys.readouterr().err


def test_a_duplicated_seed_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(claims, "CLAIMS", tmp_path / "claims.md")
    path = _records(tmp_path, [GOOD, {**GOOD, "test_top1": 60.0}])
    assert claims.main(["--records", str(path)]) == 2
    assert "record 1 ('baseline', seed 0) repeats record 0" in capsys.readouterr().err


def test_records_of_other_studies_are_counted_on_the_page_not_dropped_silently(tmp_path):
    records = json.loads(claims.RECORDS.read_text())
    path = _records(tmp_path, [*records, {**GOOD, "budget": 10, "epochs": 10}, {**GOOD, "synthetic": True}])
    assert "2 record(s) of other studies" in claims.render(path)
    assert "record(s) of other studies" not in claims.render()


def test_the_page_is_written_atomically_never_through_a_link(tmp_path, monkeypatch):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    page = tmp_path / "claims.md"
    page.symlink_to(outside)
    monkeypatch.setattr(claims, "CLAIMS", page)
    assert claims.main([]) == 0
    assert outside.read_text() == "keep" and not page.is_symlink() and page.read_text() == claims.render()


def test_the_normalisation_row_names_the_papers_contradiction_and_measures_appendix_as_claim():
    (row,) = [c for c in claims.CLAIMS_TABLE if "normalisation results disagree" in c.claim]
    assert "+0.4" in row.paper and "+1.1" in row.paper and "opposite signs" in row.paper
    # Appendix A's sign (Aff above LayerNorm), read from the LayerNorm row's runs the other way round
    assert isinstance(row.measure, claims.Swapped) and row.measure.label == "layernorm"
    assert row.measure.paper_delta == 0.4
    runs = {"baseline": [51.0, 51.2], "layernorm": [49.0, 49.2]}  # Aff 2 points above LayerNorm: Appendix A's sign
    ours, result = claims.swapped(row.measure, runs)
    assert "(**+2.00**" in ours and result.startswith("same sign, different size")

"""docs/claims.md, generated: every claim of the paper, the number measured for it here, and its verdict.

    .venv/bin/python benchmarks/claims.py            # rewrite docs/claims.md
    .venv/bin/python benchmarks/claims.py --check    # exit 1 if docs/claims.md is not what this writes

Each row's verdict is computed by the one rule of `benchmarks/verdict.py` from the numbers and seeds:
ablation rows from the run records of `benchmarks/results/ablations.json`, counts from the code itself,
and rows measured by other studies from the numbers their documents print (tests/test_claims.py checks that
each quoted number is in the document the row names). A row can therefore not say more than its numbers.

The run records are parsed, not trusted (`read_records`): every record must be an object of the fields
ablations.py writes, each of its type (a number is not a bool), top-1 a finite percentage, its label a row of
the study, and no (label, budget, data, seed) twice; anything else stops the script with one line naming the
record and exit status 2, before the page is written. Records of other studies (another epoch budget, the
synthetic smoke test) are counted on the page, never dropped silently. The page is written atomically
(resmlp.fileio.atomic_write).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from ablations import BY_LABEL, recipe_file, run_overrides
from torch.utils._python_dispatch import TorchDispatchMode
from verdict import RULE, effect, exact_verdict, half_range, verdict

from resmlp.complexity import complexity, count_gmacs, count_params
from resmlp.fileio import atomic_write
from resmlp.folding import fuse
from resmlp.models.registry import TABLE3_ROWS, model_config
from resmlp.models.resmlp import ResMLP
from resmlp.train.config import load_config

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results" / "ablations.json"
CLAIMS = ROOT / "docs" / "claims.md"
ABLATION_BUDGET = 2  # the epochs of the ablation study the table cites
FIRST_STUDY = "f043d4a"  # the commit of the 10-row study's 20 runs (imported into the records)
ABLATION_COMMAND = "`benchmarks/ablations.py --epochs 2 --seeds 0,1,2`"
ABLATION_SCALE = ("Fashion-MNIST 28x28, width 64, depth 4, patch 4 (0.15 M params), 2 epochs (far from converged) "
                  "vs ImageNet, S12, 400 epochs")
APPENDIX_A_SCALE = ("as above, on our Affine ResMLP; the paper's Appendix A numbers are on its CaiT-derived MLP "
                    "baseline (LayerNorm, class-MLP, position encoding, 79.2 %)")
NEEDS_IMAGENET = "not measured: needs ImageNet"
# what every verdict computed from the 2-epoch study means (docs/ablations.md, "Ablations: 20 rows")
TWO_EPOCH_CAVEAT = ("after 2 epochs, far from converged: a difference in learning speed, not in the paper's "
                    "converged accuracy (docs/ablations.md)")
MAX_RECORDS_BYTES = 16 << 20  # the records of every study so far take ~20 kB
ONE_CHECKPOINT = (0.0,)  # a qualitative observation of one checkpoint: one value, no spread


@dataclass(frozen=True)
class Ablation:
    """A row of the ablation study: its label in benchmarks/ablations.py and the paper's delta."""

    label: str
    paper_delta: float
    note: str = ""
    show_params: bool = False  # say the row's parameters against its reference's (counted)


@dataclass(frozen=True)
class Swapped:
    """An ablation row's runs as the reference and its reference's as the row: a claim made the other way
    round (Appendix A's linear layer over the cross-patch MLP) with its own paper delta."""

    label: str
    paper_delta: float
    note: str = ""


@dataclass(frozen=True)
class Contrast:
    """The difference of two ablation effects (row minus reference, at two settings), e.g. a gain vs depth."""

    first: tuple[str, str]
    second: tuple[str, str]
    paper_delta: float
    note: str = ""


@dataclass(frozen=True)
class Cited:
    """A number measured by another study of this repository: quoted from `source`, with its runs."""

    text: str
    source: str
    quotes: tuple[str, ...]  # strings the source must contain (tests/test_claims.py)
    row: tuple[float, ...]  # the measured value per run
    reference: tuple[float, ...]  # the compared value per run
    paper_delta: float


@dataclass(frozen=True)
class Exact:
    """A count computed here, by the function named."""

    what: str


@dataclass(frozen=True)
class NotMeasured:
    reason: str


@dataclass(frozen=True)
class Claim:
    claim: str
    paper: str
    command: str
    scale: str
    measure: Ablation | Swapped | Contrast | Cited | Exact | NotMeasured
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------- counts
class ElementwiseOps(TorchDispatchMode):
    """Counts the element-wise arithmetic of a forward pass (FlopCounterMode counts only matrix products)."""

    WEIGHT = {"add": 1, "sub": 1, "mul": 1, "div": 1, "addcmul": 2}

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001 (torch's signature)
        out = func(*args, **(kwargs or {}))
        self.ops += self.WEIGHT.get(func.overloadpacket.__name__.rstrip("_"), 0) * out.numel()
        return out


def inference_cost(model: torch.nn.Module, img: int) -> tuple[int, float, int]:
    """(parameters, GMACs, element-wise operations) of one image's forward pass; on the meta device."""
    with ElementwiseOps() as counter, torch.no_grad():
        model.eval()(torch.zeros(1, 3, img, img, device="meta"))
    return count_params(model), count_gmacs(model, (3, img, img)), counter.ops


def folding_counts() -> dict[str, tuple[int, float, int]]:
    """ResMLP-S12 at 224 px: with its Affines, folded (resmlp.fuse), and built without any Affine."""
    with torch.device("meta"):
        plain = ResMLP(model_config("resmlp_s12"))
        bare = ResMLP(model_config("resmlp_s12", norm="none", layerscale=False))
    return {"Affine": inference_cost(plain, 224), "folded": inference_cost(fuse(plain), 224),
            "no Affine": inference_cost(bare, 224)}


def table3_counts() -> tuple[bool, str]:
    worst, shown = 0.0, []
    for row in TABLE3_ROWS:
        params, gmacs = complexity(model_config(row.preset, **row.overrides))
        worst = max(worst, abs(params / 1e6 - row.paper_params_m), abs(gmacs - row.paper_gmacs))
        if row.label in ("ResMLP-S12", "ResMLP-S24", "ResMLP-B24"):
            shown.append(f"{row.label.removeprefix('ResMLP-')} {params / 1e6:.2f} / {gmacs:.2f} GMACs")
    return worst <= 0.1, (f"{len(TABLE3_ROWS)} rows, the largest difference from the paper's rounded numbers "
                          f"{worst:.2f} ({', '.join(shown)}, ...): deterministic count")


@functools.cache  # deterministic counts of full-size networks: computed once per process
def exact(what: str) -> tuple[str, str]:
    """(our number, verdict) of a count."""
    if what == "table3":
        holds, text = table3_counts()
        return text, exact_verdict(holds)
    counts = folding_counts()
    (p_aff, g_aff, e_aff), (p_fold, g_fold, e_fold), (p_bare, g_bare, e_bare) = (
        counts["Affine"], counts["folded"], counts["no Affine"])
    remainder = e_fold - e_bare
    if what == "folding-channel":
        text = (f"S12 at 224 px: element-wise operations {e_aff:,} with the Affines, {e_fold:,} folded "
                f"(`resmlp.fuse`), {e_bare:,} for the network built without any Affine; matrix products "
                f"{g_aff:.4f} / {g_fold:.4f} / {g_bare:.4f} GMACs. Every channel-MLP Affine and LayerScale and "
                "the final Affine fold away completely (exact count, `benchmarks/claims.py`)")
        return text, exact_verdict(g_fold == g_bare and remainder < e_aff - e_bare)
    text = (f"after folding, {remainder:,} element-wise operations remain beyond the Affine-free network: one "
            "multiply per element per block, the cross-patch sublayer's per-channel scale (alpha x LayerScale), "
            "which A, shared by all channels, cannot absorb; that is "
            f"{100 * remainder / (g_fold * 1e9):.3f} % of the {g_fold:.2f} GMACs. The folded cross-patch bias "
            f"becomes (patches x channels): {p_fold:,} parameters vs {p_aff:,} unfolded and {p_bare:,} without "
            "Affine (exact count)")
    return text, exact_verdict(remainder == 0)


# ------------------------------------------------------------------------------------------ run records
class RecordError(ValueError):
    """A run record that cannot be what ablations.py wrote; the message is one line naming it."""


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# field -> (check, what it must be); `synthetic` and `selected_epoch` may be absent (older records)
FIELDS = {
    "label": (lambda v: isinstance(v, str) and v in BY_LABEL, "a row label of benchmarks/ablations.py"),
    "seed": (lambda v: _is_int(v) and 0 <= v < 2**31, "a whole number >= 0"),
    "budget": (lambda v: _is_int(v) and 1 <= v <= 100_000, "a whole number of epochs >= 1"),
    "epochs": (lambda v: _is_int(v) and 1 <= v <= 100_000, "a whole number of epochs >= 1"),
    "test_top1": (lambda v: _is_number(v) and 0 <= v <= 100, "a finite percentage in [0, 100]"),
    "wall_seconds": (lambda v: _is_number(v) and v >= 0, "a finite number of seconds >= 0"),
    "amp": (lambda v: isinstance(v, str), "a string"),
    "code": (lambda v: isinstance(v, str), "a string"),
    "host": (lambda v: isinstance(v, str), "a string"),
}
OPTIONAL_FIELDS = {
    "synthetic": (lambda v: isinstance(v, bool), "true or false"),
    "selected_epoch": (lambda v: v is None or (_is_int(v) and v >= 0), "a whole number >= 0 or null"),
}


def read_records(path: Path) -> list[dict]:
    """Every record of `path`, each checked (FIELDS); RecordError naming the first bad one."""
    name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    if not path.is_file() or path.stat().st_size > MAX_RECORDS_BYTES:
        raise RecordError(f"{name} is not a regular file of at most {MAX_RECORDS_BYTES} bytes; restore it from git")
    try:
        records = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise RecordError(f"{name} is not valid JSON ({str(e)[:80]}); restore it from git") from None
    if not isinstance(records, list):
        raise RecordError(f"{name} holds {json.dumps(records)[:40]}, not a list of run records; restore it from git")
    seen: dict[tuple, int] = {}
    for i, r in enumerate(records):
        where = f"{name} record {i}" + (f" ({r.get('label')!r}, seed {r.get('seed')!r})" if isinstance(r, dict)
                                        else "")
        if not isinstance(r, dict):
            raise RecordError(f"{where} is {json.dumps(r)[:40]}, not a run record (an object); remove or restore it")
        unknown = sorted(set(r) - set(FIELDS) - set(OPTIONAL_FIELDS))
        if unknown:
            raise RecordError(f"{where} has fields ablations.py never writes: {', '.join(map(str, unknown))}; "
                              "remove or restore it")
        for key, (ok, what) in FIELDS.items():
            if key not in r or not ok(r[key]):
                raise RecordError(f"{where}: {key} is {r.get(key, 'missing')!r}, must be {what}; remove or restore "
                                  "the record")
        for key, (ok, what) in OPTIONAL_FIELDS.items():
            if key in r and not ok(r[key]):
                raise RecordError(f"{where}: {key} is {r[key]!r}, must be {what}; remove or restore the record")
        key = (r["label"], r["budget"], r.get("synthetic", False), r["seed"])
        if key in seen:
            raise RecordError(f"{where} repeats record {seen[key]} (same row, budget, data and seed): a seed counted "
                              "twice would shrink the noise; remove one of them")
        seen[key] = i
    return records


def study_records(records: list[dict]) -> list[dict]:
    """The records of the study this table cites: real data, ABLATION_BUDGET epochs."""
    return [r for r in records if r["budget"] == ABLATION_BUDGET and not r.get("synthetic", False)]


def read_runs(records: list[dict]) -> dict[str, list[float]]:
    runs: dict[str, list[float]] = {}
    for r in study_records(records):
        runs.setdefault(r["label"], []).append(float(r["test_top1"]))
    return runs


def budget_line(records: list[dict]) -> str:
    """The compute the ablation rows stand on, from the records: the 10-row study's runs and the later ones,
    and how many records belong to other studies (never dropped silently)."""
    used = study_records(records)
    earlier = [r["wall_seconds"] for r in used if r["code"] == FIRST_STUDY]
    later = [r["wall_seconds"] for r in used if r["code"] != FIRST_STUDY]
    others = len(records) - len(used)
    return (f"Ablation budget: {ABLATION_BUDGET} epochs per run, one compute thread per run, one run at a time on "
            f"2-core hosts shared with other work: {len(earlier)} runs ({sum(earlier) / 60:.1f} min of training) "
            f"with commit {FIRST_STUDY}, {len(later)} runs ({sum(later) / 60:.1f} min) with later commits (the "
            "third seeds and the new rows, at the lowest priority beside four other jobs)."
            + (f" {others} record(s) of other studies (another epoch budget or the synthetic smoke test) are in "
               "the records file and not in this table." if others else ""))


# ------------------------------------------------------------------------------------------ ablations


def _cell(values: list[float]) -> str:
    spread = half_range(values)
    return f"{statistics.mean(values):.2f}" + (f" ± {spread:.2f}" if spread is not None else "")


def study_params(label: str) -> int:
    """Parameters of an ablation row's model (10 classes), counted."""
    v = BY_LABEL[label]
    cfg = load_config(recipe_file(v.recipe), run_overrides(v, ABLATION_BUDGET, 0, False))
    return complexity(cfg.model_config(num_classes=10))[0]


def ablation(m: Ablation, runs: dict[str, list[float]]) -> tuple[str, str]:
    v = BY_LABEL[m.label]
    if m.paper_delta != v.paper_delta:
        raise ValueError(f"{m.label}: paper delta {m.paper_delta} here, {v.paper_delta} in ablations.py")
    row, ref = runs.get(m.label), runs.get(v.reference)
    if not row or not ref:
        return "not run yet", "not measured"
    delta, noise = effect(row, ref)
    note = m.note
    if m.show_params:
        ours, theirs = study_params(m.label), study_params(v.reference)
        note = (f"{ours / 1e6:.3f} M parameters vs {theirs / 1e6:.3f} M ({100 * (ours / theirs - 1):+.0f} %) at "
                "this scale")
    text = (f"{_cell(ref)} → {_cell(row)} (**{delta:+.2f}**, noise {'—' if noise is None else f'{noise:.2f}'}); "
            f"{len(row)} seeds ({v.reference}: {len(ref)}), selected on validation, AVX-512 BF16 "
            f"hosts, bf16 (benchmarks/results/ablations.md)" + (f"; {note}" if note else ""))
    return text, f"{verdict(delta, noise, m.paper_delta)}; {TWO_EPOCH_CAVEAT}"


def swapped(m: Swapped, runs: dict[str, list[float]]) -> tuple[str, str]:
    """An ablation row read the other way round: its reference's runs against the row's."""
    v = BY_LABEL[m.label]
    row, ref = runs.get(v.reference), runs.get(m.label)
    if not row or not ref:
        return "not run yet", "not measured"
    delta, noise = effect(row, ref)
    text = (f"{_cell(ref)} ({m.label}) → {_cell(row)} ({v.reference}) (**{delta:+.2f}**, noise "
            f"{'—' if noise is None else f'{noise:.2f}'}); {len(row)}/{len(ref)} seeds, the runs of the row "
            f"{m.label!r} read the other way round (benchmarks/results/ablations.md)" + (f"; {m.note}" if m.note
                                                                                          else ""))
    return text, f"{verdict(delta, noise, m.paper_delta)}; {TWO_EPOCH_CAVEAT}"


def contrast(m: Contrast, runs: dict[str, list[float]]) -> tuple[str, str]:
    effects = []
    for row, ref in (m.first, m.second):
        if not runs.get(row) or not runs.get(ref):
            return "not run yet", "not measured"
        effects.append(effect(runs[row], runs[ref]))
    (d1, n1), (d2, n2) = effects
    noise = None if n1 is None or n2 is None else n1 + n2
    text = (f"gain {m.first[0]} − {m.first[1]} **{d1:+.2f}** vs {m.second[0]} − {m.second[1]} **{d2:+.2f}**: "
            f"difference **{d1 - d2:+.2f}** (noise {'—' if noise is None else f'{noise:.2f}'}, the four rows' "
            f"half-ranges), seeds {len(runs[m.first[0]])}/{len(runs[m.first[1]])}/{len(runs[m.second[0]])}/"
            f"{len(runs[m.second[1]])} (benchmarks/results/ablations.md)" + (f"; {m.note}" if m.note else ""))
    return text, f"{verdict(d1 - d2, noise, m.paper_delta)}; {TWO_EPOCH_CAVEAT}"


def cited(m: Cited) -> tuple[str, str]:
    delta, noise = effect(list(m.row), list(m.reference))
    return f"{m.text} ({m.source})", verdict(delta, noise, m.paper_delta)


# ---------------------------------------------------------------------------------------------- claims
AB = ABLATION_COMMAND
H100 = "one H100 at batch 256 (fp32, code 526c678) vs a V100 at batch 32"
CLAIMS_TABLE: list[Claim] = [
    Claim("Tables 1 and 3: ResMLP-S12 / S24 / B24 top-1 on ImageNet-val, with Table 3's ImageNet-ReaL and "
          "ImageNet-V2 columns", "S12 76.6 / 83.3 / 64.4, S24 79.4 / 85.3 / 67.9, B24 81.0 / 86.1 / 69.0 "
          "(val / real / V2)", "none run (the published weights evaluate with `resmlp eval resmlp_s12.fb_in1k --data "
          "folder:DIR --split val --real-labels real.json` and `--data imagenetv2:DIR`, at the authors' crop 0.9)", "",
          NotMeasured(NEEDS_IMAGENET + "-val, the ImageNet-ReaL labels and ImageNet-V2")),
    Claim("Table 1 / Sec. 3.2: at comparable FLOPs, ResMLP's accuracy trade-off is below convnets' and "
          "Transformers'", "S24 79.4 at 6.0 GFLOPs vs DeiT-S 79.8 at 4.6 and RegNetY-4GF 80.0 at 4.0; B24 81.0 at "
          "23.0 vs DeiT-B 81.8 at 17.5 and RegNetY-16GF 82.9 at 16.0", "none", "",
          NotMeasured(NEEDS_IMAGENET + " (the accuracies); ResMLP's FLOPs are counted in the Table 3 row, the "
                      "throughputs measured in the Table 1 rows")),
    Claim("Table 3: parameters and FLOPs of every preset and ablation row",
          "S12 15.4 M / 3.0 GFLOPs, S24 30.0 / 6.0, B24 115.7 / 23.0, conv 3x3 30.8 / 6.0, S12/8 22.1 / 14.0, "
          "B24/8 129.1 / 100.2, ...", "`resmlp models`",
          "none: the full-size networks at 224x224", Exact("table3")),
    Claim("Sec. 2: Aff \"has no cost at inference time, since it can absorbed in the adjacent linear layer\" "
          "(channel MLP, classifier)", "no number", "`resmlp.fuse(model)`", "none: S12 at 224 px",
          Exact("folding-channel")),
    Claim("Sec. 2: the same, for the cross-patch sublayer's Aff and LayerScale", "no number",
          "`resmlp.fuse(model)`", "none: S12 at 224 px", Exact("folding-cross-patch")),
    Claim("Table 1: ResMLP-S12 is faster than DeiT-S (throughput ratio)",
          "1415.1 / 940.4 im/s = **1.50x** (V100, batch 32)",
          "`resmlp benchmark --output table1.csv --plot table1.png --accuracy ...`",
          "2-core CPU under load (load average 5-7) vs a V100; random weights (speed does not depend on them)",
          Cited("3.0 / 2.3 im/s = **1.30x** at batch 32 (1.1 / 0.7 at batch 1); one run, median of 5 interleaved "
                "rounds, timed under load, fp32", "docs/analysis.md", ("| 3.0 | 1.1 |", "| 2.3 | 0.7 |"),
                (1.30 - 1,), (0.0,), 0.50)),
    Claim("Table 1: S24 runs at half S12's speed", "715.4 / 1415.1 = **0.51**", "same", "as above",
          Cited("1.6 / 3.0 = **0.53** (same run, timed under load)", "docs/analysis.md", ("| 1.6 | 0.4 |",),
                (0.53 - 1,), (0.0,), 0.51 - 1)),
    Claim("Table 1: ResMLP-S12 is faster than DeiT-S (throughput ratio), H100", "1415.1 / 940.4 im/s = **1.50x** "
          "(V100, batch 32)", "`resmlp benchmark --device cuda --batch-size 256`", H100,
          Cited("4,984 / 3,905 im/s = **1.28x**; one run", "README.md", ("| 1.28x |", "4,984 / 2,530 / 839",
                                                                        "DeiT-S 3,905"), (1.28 - 1,), (0.0,), 0.50)),
    Claim("Table 1: S24 runs at half S12's speed, H100", "715.4 / 1415.1 = **0.51**", "same", H100,
          Cited("2,530 / 4,984 = **0.51** (same run)", "README.md", ("4,984 / 2,530 / 839",), (0.51 - 1,), (0.0,),
                0.51 - 1)),
    Claim("Table 1: S12 needs less peak memory than DeiT-S", "179.5 / 217.2 MB = **0.83**", "same",
          "CPU resident-set growth vs GPU allocator peak; the paper does not say whether weights count",
          Cited("activations of one batch-32 forward 147.9 / 167.4 MB = **0.88**; with the weights 206.5 / 251.5 "
                "MB = **0.82** (same run)", "docs/analysis.md", ("147.9", "167.4", "58.6", "84.1"),
                (0.82 - 1,), (0.0,), 0.83 - 1)),
    Claim("Table 1: S24 needs more peak memory than S12", "235.3 / 179.5 MB = **1.31**", "same", "as above",
          Cited("activations only 138.7 / 147.9 = **0.94**; with the weights 253.2 / 206.5 = **1.23** (same run)",
                "docs/analysis.md", ("138.7", "114.5"), (1.23 - 1,), (0.0,), 1.31 - 1)),
    Claim("Table 1: B24 runs at a sixth of S12's speed", "231.3 / 1415.1 im/s = **0.16**", "same", H100,
          Cited("839 / 4,984 = **0.17** (same run)", "README.md", ("4,984 / 2,530 / 839",), (839 / 4984 - 1,),
                (0.0,), 231.3 / 1415.1 - 1)),
    Claim("Table 1: B24's peak memory", "663.0 MB (S12 179.5, S24 235.3; V100, batch 32)", "none", "",
          NotMeasured("not measured: the memory rows above timed S12, S24 and DeiT-S on the CPU (docs/analysis.md); "
                      "B24 was in no memory run")),
    Claim("Table 1: the convnets' throughputs beside S12's", "RegNetY-4GF 861.0, EfficientNet-B3 661.8 vs S12 "
          "1415.1 im/s (V100, batch 32)", "none", "",
          NotMeasured("not measured: no run timed RegNetY-4GF or EfficientNet-B3 (the benchmark's default convnet "
                      "is ResNet-50); `resmlp benchmark --models resmlp_s12,timm:regnety_040,timm:efficientnet_b3 "
                      "--device cuda --batch-size 32` would, on a GPU")),
    Claim("Table 3: the cross-patch sublayer is essential (linear → none)", "76.6 → 56.5 (**-20.1**)", AB,
          ABLATION_SCALE, Ablation("cross-none", 56.5 - 76.6)),
    Claim("Table 3: linear → MLP cross-patch", "**+0.7**", AB, ABLATION_SCALE, Ablation("cross-mlp", 77.3 - 76.6)),
    Claim("Table 3: linear → conv 3x3", "**+0.7** for 2x the parameters (30.8 vs 15.4 M)", AB, ABLATION_SCALE,
          Ablation("cross-conv3x3", 77.3 - 76.6, show_params=True)),
    Claim("Table 3: linear → depth-wise conv 3x3", "**-0.3**", AB, ABLATION_SCALE,
          Ablation("cross-dwconv3x3", 76.3 - 76.6)),
    Claim("Table 3: linear → depth-separable conv 3x3", "**+0.4**", AB, ABLATION_SCALE,
          Ablation("cross-dwsep3x3", 77.0 - 76.6)),
    Claim("Table 3: Affine → LayerNorm", "**+1.1**", AB, ABLATION_SCALE, Ablation("layernorm", 77.7 - 76.6)),
    Claim("Table 3: average pooling → class-MLP", "**+0.9** for +15 % parameters (17.7 vs 15.4 M)", AB,
          ABLATION_SCALE, Ablation("class-mlp", 77.5 - 76.6, show_params=True)),
    Claim("Table D.3: class-MLP's gain shrinks with depth", "gain +0.9 at 12 layers, +0.4 at 24 (+0.8 at 36): "
          "12 minus 24 layers **+0.5**", "`benchmarks/ablations.py --epochs 2 --seeds 0,1,2 --only "
          "depth2,depth2-class-mlp`", ABLATION_SCALE + "; our depths 2 and 4 vs 12 and 24",
          Contrast(("depth2-class-mlp", "depth2"), ("class-mlp", "baseline"), 0.9 - 0.4)),
    Claim("Table D.3: distillation with class-MLP pooling", "12 / 24 / 36 layers: 78.6 / 81.1 / 81.4 (val), "
          "over class-MLP without distillation 77.5 / 79.8 / 80.5", "none", "",
          NotMeasured(NEEDS_IMAGENET + " (our distillation row, Table 3's, trains the average-pooled model)")),
    Claim("Table D.3: deeper is better (12 vs 24 layers)", "76.6 vs 79.4 (half the depth: **-2.8**)", AB,
          ABLATION_SCALE + "; 2 vs 4 blocks", Ablation("depth2", 76.6 - 79.4)),
    Claim("Table 3: smaller patches are better (16 → 8 pixels)", "76.6 vs 79.1 (coarser: **-2.5**)", AB,
          ABLATION_SCALE + "; our grids are 4x4 vs 7x7", Ablation("patch7", 76.6 - 79.1)),
    Claim("Table 3: patch 16 → 14 (ResMLP-S12/14)", "76.9 / 83.7 / 65.0 (val / real / V2) vs 76.6 (**+0.3**) for "
          "4.0 vs 3.0 GFLOPs", "none", "",
          NotMeasured(NEEDS_IMAGENET + ": 14-pixel patches leave a 2x2 grid on 28x28 Fashion-MNIST (the row above "
                      "compares 4 and 7); its size, 15.6 M / 4.0 GFLOPs, is counted in the Table 3 row")),
    Claim("Table 3: ResMLP-B24/8 without distillation", "81.0 / 85.7 / 68.6 (val / real / V2): B24/16's val top-1 "
          "for 4.4x the FLOPs (100.2 vs 23.0)", "none", "", NotMeasured(NEEDS_IMAGENET)),
    Claim("Sec. 3.4: smaller patches benefit larger models only with distillation or more data",
          "16 → 8 pixels: S12 76.6 → 79.1 (**+2.5**); B24 81.0 → 81.0 (**0**), B24/8 distilled 83.6, ImageNet-21k "
          "84.4 (Table 3)", "none", "",
          NotMeasured(NEEDS_IMAGENET + ": the 2-epoch study's patch row is one small model without distillation; "
                      "a larger model's patch rows, with and without a teacher, were not run")),
    Claim("Table 3: ImageNet-21k pre-training (60 epochs) of ResMLP-B24/8", "84.4 / 88.9 / 74.2 (val / real / V2) "
          "vs 83.6 distilled on ImageNet-1k", "`resmlp train --recipe in21k-pretrain --data imagenet21k:PATH`, then "
          "`resmlp finetune RUN/best.safetensors --recipe in21k-finetune-1k --data folder:DIR` (shipped, never run "
          "here)", "", NotMeasured("not measured: needs ImageNet-21k and ImageNet")),
    Claim("Table 3 / D.1: DeiT-style training beats the \"old-fashioned\" ResNet recipe",
          "76.6 vs 69.2 (**-7.4**), with 400 vs 90 epochs", AB,
          ABLATION_SCALE + "; both recipes get the same epochs here, where the paper's gap includes 400 vs 90 "
          "epochs", Ablation("old-fashioned", 69.2 - 76.6)),
    Claim("Table D.1: each step from DeiT's recipe towards ResNet-50's (CutMix/Mixup, erasing, RandAugment, SGD, "
          "stochastic depth, repeated augmentation, 120 epochs, step decay) costs accuracy; then batch size 256 "
          "recovers most of it, to about ResNet-50's 90-epoch training",
          "76.6 → 76.0 → 75.9 → 73.2 → 72.1 → 70.7 → 69.4 → 67.7 → 63.5, then batch 256: 69.3 (**+5.8**); "
          "ResNet-50 training, 90 epochs: 69.2", "none", "",
          NotMeasured(NEEDS_IMAGENET + " (only the two ends are compared, row above)")),
    Claim("Table D.2: more epochs help, saturating after 800 (S36)", "300 → 1000 epochs: 79.3, 79.7, 80.1, 80.4, "
          "80.3; 400 vs 800: **-0.7** for half the epochs", AB,
          ABLATION_SCALE + "; 1 vs 2 epochs (saturation is not measurable at 2 epochs)",
          Ablation("epochs-half", 79.7 - 80.4)),
    Claim("Appendix A: SA → MLP, CaiT-S24's self-attention replaced by a cross-patch MLP", "82.7 → 80.2 (**-2.5**)",
          "none", "", NotMeasured("not measured: needs CaiT-S24 and its MLP variant trained on ImageNet; this "
                                  "project builds no self-attention or class-attention block")),
    Claim("Appendix A: class-attention → class-MLP gives the attention-free baseline", "80.2 → 79.2 (**-1.0**)",
          "none", "", NotMeasured("not measured: as the row above (class-MLP pooling itself is the Table 3 row "
                                  "\"average pooling → class-MLP\")")),
    Claim("Appendix A: distillation of the CaiT-derived MLP baseline", "79.2 → 81.5 (**+2.3**), hard "
          "distillation", "none", "",
          NotMeasured("not measured: needs ImageNet and the CaiT-derived baseline (LayerScale, class embedding, "
                      "position encodings), which this project does not build; distillation of ResMLP is the Table 3 "
                      "row \"distillation from a convnet improves ResMLP\"")),
    Claim("Appendix A: ReLU is close to GELU (\"a bit more unstable in some settings\")", "79.1 vs 79.2 (**-0.1**)",
          AB, APPENDIX_A_SCALE, Ablation("act-relu", 79.1 - 79.2, "stability is not measured")),
    Claim("Appendix A: SiLU is worse than GELU (\"did not manage to get good results\")", "78.7 vs 79.2 (**-0.5**)",
          AB, APPENDIX_A_SCALE, Ablation("act-silu", 78.7 - 79.2)),
    Claim("Appendix A: HardSwish is worse than GELU", "78.8 vs 79.2 (**-0.4**)", AB, APPENDIX_A_SCALE,
          Ablation("act-hardswish", 78.8 - 79.2)),
    Claim("Appendix A / Sec. 3.4: pre-normalisation with BatchNorm \"could provide an accuracy gain\"",
          "over LayerNorm: BatchNorm +0.8, Aff +0.4, so BatchNorm over Aff **+0.4**", AB, APPENDIX_A_SCALE,
          Ablation("batchnorm", 0.8 - 0.4)),
    Claim("Appendix A vs Table 3: the paper's two normalisation results disagree (Aff over LayerNorm)",
          "Appendix A: Aff **+0.4** over LayerNorm (CaiT-derived MLP baseline, 79.2); Table 3: Aff → LayerNorm "
          "+1.1, i.e. Aff -1.1 (ResMLP-S12, 76.6 → 77.7): opposite signs", AB, APPENDIX_A_SCALE,
          Swapped("layernorm", 0.4, "the paper's delta is Appendix A's; Table 3's (Aff -1.1 against LayerNorm) "
                  "has the other sign: the paper contradicts itself across two baselines, and this row can agree "
                  "with at most one of them (the Table 3 row \"Affine → LayerNorm\" reads the same runs the "
                  "other way)")),
    Claim("Appendix A: l2-norm pre-normalisation equals Aff", "both +0.4 over LayerNorm (**0**: no effect)", AB,
          APPENDIX_A_SCALE, Ablation("l2norm", 0.0)),
    Claim("Appendix A: a large expansion factor of the cross-patch MLP is detrimental", "x1 79.2 vs x4 78.8 "
          "(**+0.4** for the smaller factor)", AB, APPENDIX_A_SCALE + "; against our cross-mlp row (x4)",
          Ablation("cross-mlp-x1", 79.2 - 78.8)),
    Claim("Appendix A: the cross-patch MLP's expansion table", "x0.25 78.6, x0.5 79.2, x1 79.2, x2 79.3, x3 78.8, "
          "x4 78.8", "none", "", NotMeasured("not measured beyond x1 and x4 (the row above): x0.25, x0.5, x2 and x3 "
                                             "are not rows of the 2-epoch study")),
    Claim("Appendix A: a linear N x N cross-patch layer beats the cross-patch MLP (79.5 %)",
          "79.5 vs 78.6-79.3 for the MLP at x0.25-x4 (x4 78.8: **+0.7**)", AB,
          APPENDIX_A_SCALE + "; the MLP is our cross-mlp row (x4)",
          Swapped("cross-mlp", 79.5 - 78.8, "Table 3, in the final setting, finds the opposite (linear → MLP +0.7)")),
    Claim("Appendix A / Sec. 2: position encodings bring nothing (\"does not change the results\")",
          "no number (**0**: no effect)", AB, APPENDIX_A_SCALE, Ablation("pos-embed", 0.0)),
    Claim("Sec. 3.4: pre-norm and post-norm both converge", "no number", "none", "",
          NotMeasured("not measured: this project builds only the paper's pre-normalised block")),
    Claim("Fig. 4: ResMLP overfits ImageNet-val slightly more than convnets and DeiT (ImageNet-V2 vs val)",
          "curves of ImageNet-V2 vs ImageNet-val top-1", "per checkpoint `resmlp eval CKPT --data folder:DIR --split "
          "val --output A` and `resmlp eval CKPT --data imagenetv2:DIR --output B`, then `resmlp analyze-fig4 "
          "A/summary.json B/summary.json ... --paper --output FIG` (never run here)", "",
          NotMeasured(NEEDS_IMAGENET + " and ImageNet-V2")),
    Claim("Fig. 2: the early cross-patch layers learn convolution-like filters",
          "shifted, local patterns in early layers (S24, ImageNet)",
          "`resmlp analyze runs/quickstart/best.safetensors --out DIR`",
          "quickstart model (4 blocks, 7x7 grid, 8 epochs) vs S24 (24 blocks, 14x14 grid, 400 epochs)",
          Cited("the 7x7 matrices A look noisy rather than convolution-like ([figure](figures/quickstart/"
                "cross_patch_rows.png)); one checkpoint", "docs/benchmarks.md", ("noisy rather than",),
                ONE_CHECKPOINT, ONE_CHECKPOINT, 1.0)),
    Claim("Fig. 2: the last 7 of S24's layers differ in character (a spike and a diffuse response)",
          "layer 20 and deeper", "none", "", NotMeasured(NEEDS_IMAGENET + " (a trained S24)")),
    Claim("Fig. 3: A is sparser than the channel MLP", "A clearly sparser than B and C (share of weights below "
          "5 % of the maximum)", "same as Fig. 2", "as above",
          Cited("A 18-25 % vs channel MLP 22-40 % below 5 % of the maximum ([figure](figures/quickstart/"
                "sparsity.png)); one checkpoint", "docs/benchmarks.md", ("18-25 %", "22-40 %"),
                ONE_CHECKPOINT, ONE_CHECKPOINT, 1.0)),
    Claim("Fig. B.1: the supervised S12's 12 cross-patch layers look like the supervised S24's of Fig. 2",
          "no number (12 layers' rows of A, 6x6 central patches)",
          "`resmlp analyze runs/quickstart/best.safetensors --out DIR` (any ResMLP checkpoint)", "",
          NotMeasured(NEEDS_IMAGENET + " (trained S12 and S24); the command draws the same rows for any ResMLP "
                      "checkpoint, the quickstart's in the Fig. 2 row")),
    Claim("Fig. B.2: the supervised S12's cross-patch sparsity is similar to the supervised S24's (Fig. 3)",
          "no number", "none", "", NotMeasured(NEEDS_IMAGENET + " (trained S12 and S24)")),
    Claim("Fig. B.2: the distilled S12 is about as sparse as the supervised S12", "no number", "none", "",
          NotMeasured(NEEDS_IMAGENET + " (S12 trained with and without distillation)")),
    Claim("Fig. B.2: the DINO-trained S12 is less sparse in its cross-patch layers than the supervised one",
          "no number", "none", "", NotMeasured(NEEDS_IMAGENET + " (S12 trained with labels and with DINO)")),
    Claim("Table 3: distillation from a convnet improves ResMLP", "S12 76.6 → 77.8 (**+1.2**), S24 +1.4, "
          "B24/8 +2.6", "`resmlp train --recipe fashion-mnist-teacher --output runs/teacher`, then "
          "`benchmarks/distill_fashion_mnist.py --teacher runs/teacher/best.safetensors`",
          "quickstart-size student and resnet10t teacher on Fashion-MNIST vs S12 and RegNetY-16GF on ImageNet",
          Cited("87.90 → 88.15 (**+0.25**), teacher resnet10t 93.03 %; one seed, 5 epochs, selected on "
                "validation, AVX-512 BF16 host, bf16", "docs/distillation_dino_finetune.md",
                ("87.90 %", "**88.15 %**", "**93.03 %**"), (88.15,), (87.90,), 1.2)),
    Claim("Abstract, Tables 1 and 3: with distillation, ResMLP reaches good accuracy/complexity trade-offs next "
          "to convnets", "S24 distilled 80.8 % at 30 M vs RegNetY-4GF 80.0 % at 21 M",
          "`resmlp train --recipe fashion-mnist-full` vs `resmlp train --recipe fashion-mnist-convnet`",
          "28x28 Fashion-MNIST, < 1 M parameters, 20-40 epochs vs ImageNet at 12-30 M parameters",
          Cited("distilled ResMLP (0.81 M) **92.04 %** vs a resnet10t narrowed to 0.82 M without teacher "
                "**92.51 %** at 20 epochs; 93.04 % vs 93.30 % at 40; one seed each, selected on validation",
                "docs/training.md", ("**92.04 %**", "92.51 %", "**93.04 %**", "93.30 %"), (92.04,), (92.51,),
                0.8)),
    Claim("Table 2: DINO pre-training gives usable frozen features (k-NN, linear)", "S12 k-NN 62.6, linear 67.5",
          "`resmlp pretrain dino --recipe dino-fashion-mnist`, `resmlp eval-linear ...`",
          "quickstart-size model, 2 global crops, no local crops, Fashion-MNIST vs S12 with multi-crop on ImageNet",
          Cited("k-NN **82.04 %** vs random weights 52.24 %, linear probe 82.12 %; one seed, 30 epochs",
                "docs/distillation_dino_finetune.md", ("**82.04 %**", "52.24 %", "82.12 %"), (82.04,), (52.24,),
                10.0)),
    Claim("Table 2: DINO pre-training of ResMLP-S24", "linear 72.8, k-NN 69.4 (S12: 67.5 / 62.6)", "none", "",
          NotMeasured(NEEDS_IMAGENET + " (the `dino-imagenet` recipe with model.name resmlp_s24)")),
    Claim("Table 2: under DINO, ResMLP is below ViT and its k-NN competitive with a convnet's",
          "S12 k-NN 62.6 vs ResNet-50 67.5, ViT-S 74.5", "none", "", NotMeasured(NEEDS_IMAGENET)),
    Claim("Sec. 3.2 / Table 3: fine-tuning a DINO-pre-trained ResMLP vs training from scratch",
          "S12 76.6 → 76.5 (**-0.1**; S24 79.4 → 79.9, +0.5)",
          "`resmlp finetune runs/dino/dino/best.safetensors --recipe fashion-mnist-quick --epochs 3` vs "
          "`resmlp train --recipe fashion-mnist-quick --set schedule.epochs=3`",
          "a 3-epoch budget, where any good start helps, vs ImageNet-length schedules; the small model is "
          "S12-like, so the paper's sign to compare is S12's (negative)",
          Cited("86.99 → 88.46 (**+1.47**); one seed, 3 epochs, selected on validation",
                "docs/distillation_dino_finetune.md", ("**88.46 %**", "86.99 %"), (88.46,), (86.99,), -0.1)),
    Claim("Table 4: transfer to CIFAR-10 / CIFAR-100", "S12 98.1 / 87.0, S24 98.7 / 89.5",
          "`resmlp finetune CKPT --recipe transfer-cifar100 --data cifar100:DIR` (= `cifar-finetune`; shipped, "
          "never run here)", "",
          NotMeasured(NEEDS_IMAGENET + " pre-training (the recipe is shipped)")),
    Claim("Table 4: transfer to Flowers-102, Stanford Cars, iNaturalist 2018/2019", "S12 97.4 / 84.6 / 60.2 / 71.0, "
          "S24 97.9 / 89.5 / 64.3 / 72.5", "`resmlp finetune CKPT --recipe transfer-flowers --data flowers102:DIR`; "
          "likewise `transfer-cars` with `stanford-cars:DIR`, `transfer-inat18` with `inat2018:DIR`, "
          "`transfer-inat19` with `inat2019:DIR` (shipped, never run here)", "",
          NotMeasured(NEEDS_IMAGENET + " pre-training (or the published weights) and those datasets")),
    Claim("Sec. 3.1: \"The majority of our models take two days to train on eight V100-32GB GPUs\"",
          "2 days on 8 V100", "none", "", NotMeasured("not measured: needs ImageNet and 8 GPUs; no full-length "
                                                       "training was run here (the H100 training throughputs are in "
                                                       "README.md)")),
    Claim("Table 5: seq2seq ResMLP is on par with a Transformer", "WMT14 tokenized BLEU EN-DE 26.4 vs 27.3 "
          "(**-0.9**), EN-FR 40.3 vs 38.1 (**+2.2**), ResMLP-6 vs Transformer base",
          "`OMP_NUM_THREADS=1 benchmarks/translate_numbers.py --max-minutes 20 --tasks numbers-en-de`",
          "number-word translation at the ceiling, 1.4 M parameters, exact match, trained with Adam (the paper: "
          "Adagrad) vs WMT14, dimension 512, BLEU",
          Cited("exact match on 1,000 held-out numbers: EN-DE 97.7 vs 97.3 (**+0.4**); one seed, 20 minutes",
                "docs/translation.md", ("**97.7**", "97.3"), (97.7,), (97.3,), -0.9)),
    Claim("Table 5: 12 layers beat 6", "EN-DE 26.8 vs 26.4, EN-FR 40.6 vs 40.3", "none", "",
          NotMeasured("not measured: needs WMT14 (the `wmt14` preset and preparation are in docs/translation.md)")),
    Claim("MLP-Mixer: a patch-based MLP is invariant to shuffling patches + one shared in-patch permutation",
          "Mixer's curves \"match perfectly\"; ResNet50x1 \"drops significantly\" (MLP-Mixer paper, seeds/004)",
          "`benchmarks/permutation.py --epochs 1 --seeds 0 --models resmlp,convnet`",
          "ResMLP (not Mixer) and resnet10t, 1 epoch of Fashion-MNIST vs Mixer-B/16 and ResNet50x1",
          Cited("ResMLP 82.50 → 82.51 (**-0.01**); resnet10t 88.82 → 86.44 (**-2.38**); one seed, one epoch",
                "benchmarks/results/permutation.md", ("82.51", "-0.01", "86.44", "+2.38"), (82.51,), (82.50,),
                0.0)),
    Claim("MLP-Mixer: a global pixel permutation hurts the MLP much less than the convnet",
          "Mixer ~45 % drop vs ResNet ~75 %", "same", "as above",
          Cited("ResMLP **-2.73**, resnet10t **-2.87** points; one seed, one epoch",
                "benchmarks/results/permutation.md", ("+2.73", "+2.87"), (2.87 - 2.73,), (0.0,), 30.0)),
]

INTRO = """# The paper's claims, and what this repository has measured of them

Generated by `benchmarks/claims.py` (do not edit by hand: `tests/test_claims.py` fails when this page and the
generator disagree). One row per claim of the ResMLP paper (Touvron et al. 2021, with its appendix), plus the
MLP-Mixer permutation experiment. The ablation rows are computed from the run records in
`benchmarks/results/ablations.json`; counts are computed by the generator; every other number is quoted from
the document the row names, where the command and host are given (a test checks that the quoted numbers are
there). Where no measurement fits a CPU, the row says **not measured** and why.

**Selection.** Accuracies are of the checkpoint selected on 5,000 images carved from the training set; the
test split was read once, for it. A run with one epoch has nothing to select from.

**Hosts.** 2-core, GPU-less AMD EPYC machines, shared with other work: **AVX2** only (no native bf16; fp32)
and **AVX-512 BF16** (native bf16; `amp: auto` trains in bf16). Timed rows were timed under load and say so;
accuracies do not depend on the load. The rows marked "H100" quote the Table 1 throughputs measured on one
NVIDIA H100 (README.md, "Measured on a GPU"); every other row was measured on these CPUs, and no accuracy was
measured on a GPU.

**2-epoch rows.** Every verdict computed from the ablation study carries its caveat in the verdict itself: two
epochs leave every model far from converged, so such a verdict compares learning speed at that budget, not the
paper's converged accuracies (docs/ablations.md).

**The verdict rule** (`benchmarks/verdict.py`, the only place it is stated; the delta is a row's mean minus
its reference's, the noise the sum of their half-ranges over seeds; for ratios, the distance from 1):

"""


def render(records_path: Path | None = None) -> str:
    records = read_records(records_path or RECORDS)
    runs = read_runs(records)
    lines = [INTRO + RULE, "",
             budget_line(records), "",
             "| claim (paper) | paper's number | our command | our number (runs; source) | scale difference | "
             "verdict |", "|---|---|---|---|---|---|"]
    for c in CLAIMS_TABLE:
        m = c.measure
        if isinstance(m, Ablation):
            ours, result = ablation(m, runs)
        elif isinstance(m, Swapped):
            ours, result = swapped(m, runs)
        elif isinstance(m, Contrast):
            ours, result = contrast(m, runs)
        elif isinstance(m, Cited):
            ours, result = cited(m)
        elif isinstance(m, Exact):
            ours, result = exact(m.what)
        else:
            ours, result = "—", m.reason
        lines.append(f"| {c.claim} | {c.paper} | {c.command} | {ours} | {c.scale or '—'} | {result} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/claims.md differs from the output")
    parser.add_argument("--records", type=Path, default=RECORDS, help="the run records (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        text = render(args.records)
    except RecordError as e:  # one line, nothing written
        print(f"claims.py: {e}", file=sys.stderr)
        return 2
    if args.check:
        same = CLAIMS.is_file() and CLAIMS.read_text() == text
        print("docs/claims.md is up to date" if same else "docs/claims.md differs: run benchmarks/claims.py")
        return 0 if same else 1
    atomic_write(CLAIMS, lambda tmp: tmp.write_text(text))  # a new file renamed over the page: never through a link
    print(f"wrote {CLAIMS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

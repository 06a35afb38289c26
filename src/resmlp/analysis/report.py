"""`resmlp analyze`'s output: the figures as PNGs, their numbers (JSON, CSV, NPZ) and an index.html page."""

from __future__ import annotations

import csv
import html
import io
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib import pyplot as plt
from matplotlib.figure import Figure

from resmlp.analysis import filters, sparsity
from resmlp.errors import ConfigError
from resmlp.fileio import atomic_write
from resmlp.models.resmlp import ResMLP


@dataclass
class Report:
    """What was written: figure file -> caption, numbers files, and figures that don't apply (with why)."""

    out_dir: Path
    figures: dict[str, str] = field(default_factory=dict)
    numbers: list[str] = field(default_factory=list)
    not_applicable: list[str] = field(default_factory=list)
    # the sparsity comparison of this checkpoint and of a random init of its config (the baseline), as sentences
    sparsity_sentence: str = ""
    baseline_sentence: str = ""
    baseline: list[dict[str, float | int]] = field(default_factory=list)

    @property
    def index(self) -> Path:
        return self.out_dir / "index.html"


def select_layers(layers: list[int] | None, depth: int) -> list[int]:
    """Validate 1-based layer numbers against the model's depth; None means all layers."""
    if not layers:
        return list(range(1, depth + 1))
    bad = [n for n in layers if not 1 <= n <= depth]
    if bad:
        raise ValueError(f"layers {bad} don't exist: this model has layers 1 to {depth}")
    return sorted(set(layers))


def write_report(
    model: ResMLP,
    out_dir: str | Path,
    layers: list[int] | None = None,
    threshold: float = 0.05,
    source: str = "",
    progress: bool = False,
) -> Report:
    """Write every figure that applies to `model` into `out_dir`, with numbers and index.html.
    progress: a tqdm bar on stderr, one step per figure and one for the numbers."""
    from tqdm.auto import tqdm

    if not (math.isfinite(threshold) and 0 < threshold <= 1):
        raise ConfigError(f"--threshold {threshold!r}: expected a fraction of each matrix's largest |weight| in "
                          "(0, 1] (the paper's figures use 0.05)")
    bar = tqdm(total=5, unit="figure", file=sys.stderr, dynamic_ncols=True, disable=not progress)
    with bar:
        return _write_report(model, out_dir, layers, threshold, source, bar)


def _write_report(model: ResMLP, out_dir: str | Path, layers: list[int] | None, threshold: float, source: str,
                  bar) -> Report:
    def step(next_up: str) -> None:  # one figure done; name the next on the bar
        bar.update()
        bar.set_description_str(next_up, refresh=False)

    cfg = model.config
    chosen = select_layers(layers, cfg.depth)
    report = Report(Path(out_dir))
    report.out_dir.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}

    bar.set_description_str("cross-patch matrices", refresh=False)
    matrices = filters.cross_patch_matrices(model)
    if matrices:
        side = min(6, cfg.grid_size)
        picked = {n: matrices[n] for n in chosen}
        _save_figure(
            report,
            "cross_patch_rows.png",
            filters.plot_cross_patch(picked, cfg.grid_size),
            f"Paper Fig. 2 / B.1. Rows of each layer's cross-patch matrix A for the central {side}x{side} "
            f"patches, each drawn as a {cfg.grid_size}x{cfg.grid_size} image of the weights that patch "
            "gives to every patch. Each image is scaled to its own max |weight| (red > 0, blue < 0). "
            + _locality_sentence(picked, cfg.grid_size),
        )
        arrays.update(
            {
                f"cross_patch_rows_layer{n}": filters.cross_patch_rows(a, cfg.grid_size)
                for n, a in picked.items()
            }
        )
    else:
        report.not_applicable.append(
            f"Cross-patch matrix images (paper Fig. 2): this model's cross-patch sublayer is "
            f"'{cfg.cross_patch}', which has no N x N matrix A (only 'linear' has one)."
        )

    step("token-mixing units")
    token_fc1 = filters.token_mixing_fc1(model)
    if token_fc1:
        picked = {n: token_fc1[n] for n in chosen}
        _save_figure(
            report,
            "token_mixing_units.png",
            filters.plot_token_mixing(picked, cfg.grid_size),
            f"Mixer Fig. 5. Hidden units of each layer's first token-mixing linear layer: each unit has "
            f"one weight per patch, drawn as a {cfg.grid_size}x{cfg.grid_size} image. Up to 64 units per "
            "layer, low spatial frequency first, each next to the unit most opposite to it.",
        )
        arrays.update({f"token_fc1_layer{n}": w for n, w in picked.items()})
    else:
        report.not_applicable.append(
            f"Token-mixing units (Mixer Fig. 5): only for the 'mlp' cross-patch sublayer of MLP-Mixer; this "
            f"model's is '{cfg.cross_patch}'."
        )

    step("patch embedding")
    stem = filters.patch_embedding_units(model)
    _save_figure(
        report,
        "patch_embedding.png",
        filters.plot_patch_embedding(stem),
        f"Mixer Fig. 7. The patch embedding's linear projection units, {cfg.patch_size}x{cfg.patch_size} "
        "pixels each (the first 64), each scaled to its own max |weight|.",
    )
    arrays["patch_embedding"] = stem

    step("sparsity")
    rows = sparsity.layer_sparsity(model, threshold)
    report.baseline = sparsity.random_init_sparsity(model, threshold)
    report.sparsity_sentence = _sparsity_sentence(rows)
    report.baseline_sentence = _sparsity_sentence(report.baseline, "A randomly initialised model of this config "
                                                                   "(the baseline)", "has")
    _save_figure(
        report,
        "sparsity.png",
        sparsity.plot_sparsity(rows, threshold),
        f"Paper Fig. 3 / B.2. Per layer, the fraction of weights whose magnitude is below {threshold:g} "
        f"times the matrix's largest magnitude. {report.sparsity_sentence}{report.baseline_sentence}"
        "Numbers: sparsity.json, sparsity.csv.",
    )
    if cfg.cross_patch not in ("linear", "mlp"):
        report.not_applicable.append(
            f"Cross-patch sparsity: the '{cfg.cross_patch}' sublayer has no matrix over patches; only the "
            "channel MLP's matrices are measured."
        )
    step("numbers and index.html")
    _write_numbers(report, model, rows, threshold, arrays, source)
    atomic_write(report.index, lambda tmp: tmp.write_text(_html(report, model, rows, threshold, source)))
    bar.update()
    return report


# The captions say what this checkpoint's figures show, in numbers computed from it; what the paper found for
# its ImageNet models is quoted as the paper's, never asserted of the model shown (docs/claims.md compares).
def _locality_sentence(matrices: dict[int, np.ndarray], grid: int) -> str:
    shares = {n: filters.local_weight_share(a, grid) for n, a in matrices.items()}
    uniform = next(iter(shares.values()))[1]
    listed = ", ".join(f"layer {n} {share:.0%}" for n, (share, _) in shares.items())
    return (f"Here the patch and its 8 neighbours hold this share of a row's |weight|: {listed} (uniform weights: "
            f"{uniform:.0%}). The paper reports convolution-like local filters in early layers of its ImageNet "
            "models.")


def _sparsity_sentence(rows: list[dict[str, float | int]], subject: str = "", verb: str = "") -> str:
    """The A-versus-channel-MLP comparison of `rows`; with `subject`, the same numbers as a baseline's."""
    if "cross_patch" not in rows[0]:
        return ""
    cross = float(np.mean([r["cross_patch"] for r in rows]))
    channel = float(np.mean([(r["channel_fc1"] + r["channel_fc2"]) / 2 for r in rows]))
    if subject:
        return f"{subject} {verb} {cross:.0%} small weights in A and {channel:.0%} in the channel MLP. "
    than = "sparser than" if cross > channel else "no sparser than"
    return (f"Here A is {than} the channel MLP: {cross:.0%} of its weights are small against {channel:.0%}, "
            "averaged over layers (the paper reports A sparser for its ImageNet models). ")


def _save_figure(report: Report, name: str, fig: Figure, caption: str) -> None:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    atomic_write(report.out_dir / name, lambda tmp: tmp.write_bytes(buffer.getvalue()))
    report.figures[name] = caption


def _write_numbers(
    report: Report,
    model: ResMLP,
    rows: list[dict],
    threshold: float,
    arrays: dict[str, np.ndarray],
    source: str,
) -> None:
    out = report.out_dir
    payload = {
        "source": source,
        "threshold": threshold,
        "definition": "fraction of entries with |w| < threshold * max|w| of the same matrix",
        "columns": {k: v for k, v in sparsity.SERIES.items() if k in rows[0]},
        "config": model.config.to_dict(),
        "layers": rows,
        "random_init_layers": report.baseline,  # the same numbers for a seeded random init of the config
    }
    atomic_write(out / "sparsity.json", lambda tmp: tmp.write_text(json.dumps(payload, indent=2)))

    def write_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(out / "sparsity.csv", write_csv)

    def write_npz(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object, so numpy doesn't append its own suffix
            np.savez_compressed(f, **arrays)

    atomic_write(out / "weights.npz", write_npz)
    report.numbers = ["sparsity.json", "sparsity.csv", "weights.npz"]


def _html(report: Report, model: ResMLP, rows: list[dict], threshold: float, source: str) -> str:
    cfg = model.config
    esc = html.escape
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>resmlp analyze</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
        "img{max-width:100%;border:1px solid #ddd}figure{margin:2em 0}"
        "figcaption{color:#333;margin-top:.5em}"
        "table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style>",
        "</head><body>",
        f"<h1>Weight analysis of {esc(source or 'a model')}</h1>",
        f"<p>{cfg.depth} layers, width {cfg.dim}, {cfg.img_size}px images in {cfg.patch_size}px patches "
        f"({cfg.grid_size}x{cfg.grid_size} = {cfg.num_patches} patches), "
        f"cross-patch '{esc(cfg.cross_patch)}', "
        f"norm '{esc(cfg.norm)}'.</p>",
    ]
    for name, caption in report.figures.items():
        parts.append(
            f"<figure><img src='{esc(name)}' alt='{esc(name)}'><figcaption>{esc(caption)}"
            "</figcaption></figure>"
        )
    if report.not_applicable:
        parts.append("<h2>Figures that don't apply to this model</h2><ul>")
        parts += [f"<li>{esc(note)}</li>" for note in report.not_applicable]
        parts.append("</ul>")
    columns = [k for k in rows[0] if k != "layer"]
    parts.append(f"<h2>Sparsity (|w| &lt; {threshold:g} x max)</h2><table><tr><th>layer</th>")
    parts += [f"<th>{esc(sparsity.SERIES[c])}</th>" for c in columns]
    parts.append("</tr>")
    for r in rows:
        parts.append(
            f"<tr><td>{r['layer']}</td>" + "".join(f"<td>{r[c]:.1%}</td>" for c in columns) + "</tr>"
        )
    parts.append(
        "</table><p>Numbers: " + ", ".join(f"<a href='{n}'>{n}</a>" for n in report.numbers) + "</p>"
    )
    parts.append("</body></html>\n")
    return "\n".join(parts)

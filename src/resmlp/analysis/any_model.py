"""`resmlp analyze` of a model that is not a ResMLP or Mixer (timm:NAME, torchvision:NAME, as `resmlp train`
trains them): what applies to any network, the sparsity of every weight matrix (the measure of the paper's
Fig. 3) and the first convolution's filters (as Mixer's Fig. 7 draws a patch embedding). The cross-patch
figures are ResMLP/Mixer-specific and are listed as not applying, in one line.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

from torch import nn

from resmlp.analysis import filters, sparsity
from resmlp.analysis.report import Report, _save_figure
from resmlp.fileio import atomic_write

NOT_APPLICABLE = ("the paper's cross-patch figures (Fig. 2, Mixer Fig. 5) and per-block sparsity (Fig. 3) are "
                  "ResMLP/Mixer-specific: a {name} has no cross-patch layer; drawn instead: every weight matrix's "
                  "sparsity and the first convolution's filters")


def weight_sparsity(model: nn.Module, threshold: float) -> list[dict[str, float | int | str]]:
    """One row per weight matrix or kernel (2-D or more) in the order the model holds them."""
    return [dict(layer=name, shape="x".join(map(str, p.shape)), small=sparsity.fraction_small(p, threshold))
            for name, p in model.named_parameters() if p.ndim >= 2]


def write_any_model_report(model: nn.Module, out_dir: str | Path, threshold: float = 0.05,
                           source: str = "") -> Report:
    """sparsity.json / sparsity.csv for every weight matrix, first_conv.png where the model has a convolution
    with a square kernel, and index.html."""
    report = Report(Path(out_dir))
    report.out_dir.mkdir(parents=True, exist_ok=True)
    name = type(model).__name__
    report.not_applicable.append(NOT_APPLICABLE.format(name=name))
    conv = next((m for m in model.modules() if isinstance(m, nn.Conv2d) and m.kernel_size[0] == m.kernel_size[1]),
                None)
    if conv is not None:
        weight = conv.weight.detach().float().cpu().numpy()
        _save_figure(report, "first_conv.png", filters.plot_patch_embedding(weight),
                     f"The first convolution's filters ({weight.shape[2]}x{weight.shape[2]} pixels, the first 64 of "
                     f"{weight.shape[0]}), each scaled to its own max |weight|: Mixer Fig. 7's view of a stem.")
    rows = weight_sparsity(model, threshold)
    payload = dict(source=source, threshold=threshold, model=name,
                   definition="fraction of entries with |w| < threshold * max|w| of the same matrix", layers=rows)
    atomic_write(report.out_dir / "sparsity.json", lambda tmp: tmp.write_text(json.dumps(payload, indent=2)))

    def write_csv(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["layer", "shape", "small"])
            writer.writeheader()
            writer.writerows(rows)

    atomic_write(report.out_dir / "sparsity.csv", write_csv)
    report.numbers = ["sparsity.json", "sparsity.csv"]
    atomic_write(report.index, lambda tmp: tmp.write_text(_html(report, name, rows, threshold, source)))
    return report


def _html(report: Report, name: str, rows: list[dict], threshold: float, source: str) -> str:
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>resmlp analyze</title></head><body>",
             f"<h1>Weight analysis of {esc(source or 'a model')} ({esc(name)})</h1>"]
    parts += [f"<figure><img src='{esc(f)}' alt='{esc(f)}'><figcaption>{esc(c)}</figcaption></figure>"
              for f, c in report.figures.items()]
    parts += ["<h2>Not applicable</h2><ul>", *[f"<li>{esc(n)}</li>" for n in report.not_applicable], "</ul>",
              f"<h2>Sparsity (|w| &lt; {threshold:g} x max)</h2><table><tr><th>weight</th><th>shape</th>"
              "<th>small</th></tr>"]
    parts += [f"<tr><td>{esc(r['layer'])}</td><td>{r['shape']}</td><td>{r['small']:.1%}</td></tr>" for r in rows]
    parts += ["</table><p>Numbers: " + ", ".join(f"<a href='{n}'>{n}</a>" for n in report.numbers) + "</p>",
              "</body></html>\n"]
    return "\n".join(parts)


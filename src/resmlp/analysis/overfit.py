"""Paper Fig. 4, the control of overfitting: ImageNet-V2 top-1 against ImageNet-val top-1 of several checkpoints,
from their `resmlp eval --output DIR` summaries, with a least-squares line per model family and y = x.

The paper (section 3.4) plots one curve per family (EfficientNet, DeiT, RegNet, ResMLP) through its models' points
and reads overfitting to ImageNet-val from "the relative offsets between curves"; it does not say how its curves
were drawn. Here each family with two or more models gets its least-squares line v2 = slope * val + intercept (the
linear fit of Recht et al. 2019, the ImageNet-V2 paper), and each point its gap to y = x (val - v2). Written:
fig4.png, fig4.csv (one row per checkpoint), fig4_fits.csv (one row per family) and index.html.
"""

from __future__ import annotations

import csv
import html
import io
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from resmlp.errors import ConfigError
from resmlp.fileio import atomic_write, read_json_object

V2_KIND = "imagenetv2"
DEFAULT_FAMILY = "ResMLP"
# paper Table 3 (top-1 %, ImageNet-val and ImageNet-V2), the ResMLP points Fig. 4 labels
PAPER_POINTS = (("S12", 76.6, 64.4), ("S24", 79.4, 67.9), ("B24", 81.0, 69.0), ("B24/8 distil", 83.6, 73.4),
                ("B24/8 Imnet21k", 84.4, 74.2))
PAPER_FAMILY = "ResMLP (paper Table 3)"


@dataclass
class Point:
    family: str
    label: str
    checkpoint: str
    val_top1: float
    v2_top1: float


@dataclass
class Fit:
    family: str
    points: int
    slope: float
    intercept: float


def read_points(arguments: list[str]) -> list[Point]:
    """One point per checkpoint from `[FAMILY=]SUMMARY.json` arguments: each checkpoint needs one summary on
    ImageNet-V2 (dataset imagenetv2) and one on ImageNet-val (any other dataset); one line otherwise."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for argument in arguments:
        family, sep, path = argument.partition("=")
        if not sep or not path:
            family, path = DEFAULT_FAMILY, argument
        summary = read_json_object(path, "evaluation summary")
        checkpoint, dataset, top1 = summary.get("checkpoint"), summary.get("dataset"), summary.get("top1")
        if not isinstance(checkpoint, str) or not isinstance(dataset, str) or type(top1) not in (int, float) \
                or not (math.isfinite(top1) and 0 <= top1 <= 100):
            raise ConfigError(f"{path} is not a `resmlp eval --output DIR` summary: expected its checkpoint, dataset "
                              "and top1 (a percentage)")
        which = "v2" if dataset == V2_KIND else "val"
        scores = found.setdefault((family, checkpoint), {})
        if which in scores:
            raise ConfigError(f"{path}: {checkpoint} has a second {'ImageNet-V2' if which == 'v2' else 'val'} "
                              "summary; give one of each per checkpoint")
        scores[which] = float(top1)
    points = []
    for (family, checkpoint), scores in found.items():
        missing = {"v2": "ImageNet-V2 (resmlp eval CKPT --data imagenetv2:DIR)",
                   "val": "ImageNet-val (resmlp eval CKPT --data folder:DIR)"}
        lacking = [text for key, text in missing.items() if key not in scores]
        if lacking:
            raise ConfigError(f"{checkpoint} has no {lacking[0]} summary among the files given; each checkpoint "
                              "needs both")
        points.append(Point(family, label_of(checkpoint), checkpoint, scores["val"], scores["v2"]))
    return points


def label_of(checkpoint: str) -> str:
    """A point's label: the run folder of a run's best.safetensors, else the file's stem."""
    path = Path(checkpoint)
    return path.parent.name if path.name == "best.safetensors" and path.parent.name else path.stem


def paper_points() -> list[Point]:
    return [Point(PAPER_FAMILY, label, "paper Table 3", val, v2) for label, val, v2 in PAPER_POINTS]


def fit_families(points: list[Point]) -> list[Fit]:
    """The least-squares line of each family with two or more distinct val scores."""
    fits = []
    for family in dict.fromkeys(p.family for p in points):
        mine = [p for p in points if p.family == family]
        if len({p.val_top1 for p in mine}) < 2:
            continue
        slope, intercept = np.polyfit([p.val_top1 for p in mine], [p.v2_top1 for p in mine], 1)
        fits.append(Fit(family, len(mine), float(slope), float(intercept)))
    return fits


def write_fig4(points: list[Point], out_dir: str | Path) -> list[Path]:
    """fig4.png, fig4.csv, fig4_fits.csv and index.html in `out_dir`; the files written."""
    from matplotlib import pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fits = fit_families(points)
    fig, ax = plt.subplots(figsize=(6, 5))
    low = min(min(p.v2_top1 for p in points), min(p.val_top1 for p in points)) - 2
    high = max(p.val_top1 for p in points) + 2
    ax.plot([low, high], [low, high], color="0.6", linestyle=":", label="y = x")
    for number, family in enumerate(dict.fromkeys(p.family for p in points)):
        color = f"C{number % 10}"
        mine = [p for p in points if p.family == family]
        ax.scatter([p.val_top1 for p in mine], [p.v2_top1 for p in mine], color=color, label=family, zorder=3)
        for p in mine:
            ax.annotate(p.label, (p.val_top1, p.v2_top1), textcoords="offset points", xytext=(4, -10), fontsize=7)
        for fit in (f for f in fits if f.family == family):
            xs = np.asarray([min(p.val_top1 for p in mine) - 1, max(p.val_top1 for p in mine) + 1])
            ax.plot(xs, fit.slope * xs + fit.intercept, color=color, linewidth=1)
    ax.set_xlabel("ImageNet-val top-1 acc. (%)")
    ax.set_ylabel("ImageNet-V2 top-1 acc. (%)")
    ax.set_title("Top-1 on ImageNet-V2 vs ImageNet-val (paper Fig. 4)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    written = [atomic_write(out / "fig4.png", lambda tmp: tmp.write_bytes(buffer.getvalue()))]
    rows = [{"family": p.family, "label": p.label, "checkpoint": p.checkpoint, "val_top1": p.val_top1,
             "v2_top1": p.v2_top1, "gap": round(p.val_top1 - p.v2_top1, 4)} for p in points]
    written.append(_write_csv(out / "fig4.csv", rows, ["family", "label", "checkpoint", "val_top1", "v2_top1", "gap"]))
    written.append(_write_csv(out / "fig4_fits.csv", [vars(f) for f in fits],
                              ["family", "points", "slope", "intercept"]))
    written.append(atomic_write(out / "index.html", lambda tmp: tmp.write_text(_html(rows, fits))))
    return written


def _write_csv(path: Path, rows: list[dict], fields: list[str]) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)

    return atomic_write(path, write)


def _html(rows: list[dict], fits: list[Fit]) -> str:
    esc = html.escape
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>resmlp analyze-fig4</title>",
             "<style>body{font-family:sans-serif;max-width:900px;margin:2em auto}td,th{border:1px solid #ccc;"
             "padding:2px 8px}table{border-collapse:collapse}</style></head><body>",
             "<h1>ImageNet-V2 vs ImageNet-val (paper Fig. 4)</h1><img src='fig4.png' alt='fig4'>",
             "<p>Points below the dotted y = x line lose accuracy on V2; a family's line lower than another's at the "
             "same val accuracy is the paper's reading of more overfitting to ImageNet-val.</p>",
             "<table><tr><th>family</th><th>model</th><th>val top-1</th><th>V2 top-1</th><th>gap</th></tr>"]
    parts += [f"<tr><td>{esc(r['family'])}</td><td>{esc(r['label'])}</td><td>{r['val_top1']:.2f}</td>"
              f"<td>{r['v2_top1']:.2f}</td><td>{r['gap']:.2f}</td></tr>" for r in rows]
    parts.append("</table><h2>Least-squares lines (v2 = slope &middot; val + intercept)</h2><table>"
                 "<tr><th>family</th><th>models</th><th>slope</th><th>intercept</th></tr>")
    parts += [f"<tr><td>{esc(f.family)}</td><td>{f.points}</td><td>{f.slope:.3f}</td><td>{f.intercept:.2f}</td></tr>"
              for f in fits]
    parts.append("</table><p>Numbers: <a href='fig4.csv'>fig4.csv</a>, <a href='fig4_fits.csv'>fig4_fits.csv</a>"
                 "</p></body></html>\n")
    return "\n".join(parts)

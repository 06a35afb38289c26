"""`resmlp models`: every preset and every Table 3 row with parameters and GMACs (the paper's Table 3)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="list presets and Table 3 ablation rows with params and GMACs")
    p.add_argument("pattern", nargs="?", default="*",
                   help="shell-style filter on the names, e.g. 'resmlp_s*' or '*cmlp*' (default: all)")
    p.add_argument("--format", choices=("table", "json", "csv"), default="table",
                   help="table for reading, json or csv for scripts (default table)")
    p.set_defaults(run=run)


def rows() -> list[dict]:
    """Presets first, then the Table 3 rows; params and GMACs at the preset's resolution, counted from the sizes
    (resmlp.models.counts: no model is built or run, torch is not even loaded; tests/test_model_counts.py checks
    each count against the built model's)."""
    from resmlp.models.counts import params_and_macs
    from resmlp.models.registry import PRESETS, PUBLISHED, TABLE3_ROWS, model_config

    def complexity(config) -> tuple[int, float]:
        params, macs = params_and_macs(config)
        return params, macs / 1e9

    out = []
    for name in PRESETS:
        params, gmacs = complexity(model_config(name))
        out.append(dict(name=name, kind="preset", params=params, params_m=round(params / 1e6, 2),
                        gmacs=round(gmacs, 2), weights=list(PUBLISHED.get(name, {}))))
    for row in TABLE3_ROWS:
        params, gmacs = complexity(model_config(row.preset, **row.overrides))
        out.append(dict(name=row.label, kind="table3", preset=row.preset, overrides=row.overrides,
                        params=params, params_m=round(params / 1e6, 2), gmacs=round(gmacs, 2),
                        paper_params_m=row.paper_params_m, paper_gmacs=row.paper_gmacs))
    return out


CSV_COLUMNS = ("name", "kind", "preset", "params", "params_m", "gmacs", "paper_params_m", "paper_gmacs", "weights")


def run(args: argparse.Namespace) -> int:
    from fnmatch import fnmatch

    # a Table 3 row also matches by its preset; a preset has none (not "", which the pattern '' would match)
    data = [r for r in rows() if fnmatch(r["name"], args.pattern) or ("preset" in r and fnmatch(r["preset"],
                                                                                            args.pattern))]
    if not data:
        raise ValueError(f"no preset or Table 3 row matches {args.pattern!r}; `resmlp models` lists them all")
    if args.format == "json":
        print(json.dumps(data, indent=2))
        return 0
    if args.format == "csv":
        import csv
        import sys

        writer = csv.DictWriter(sys.stdout, CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows({**r, "weights": " ".join(r.get("weights", []))} for r in data)
        return 0
    from rich.table import Table

    from resmlp.commands.common import pipe_console

    presets = Table(title="Presets (224x224, 1000 classes)")
    for col in ("name", "params (M)", "GMACs", "published weights"):
        presets.add_column(col, justify="left" if col in ("name", "published weights") else "right")
    for r in data:
        if r["kind"] == "preset":
            presets.add_row(r["name"], f"{r['params_m']:.2f}", f"{r['gmacs']:.2f}", ", ".join(r["weights"]))
    table3 = Table(title="Paper Table 3: measured vs printed")
    for col in ("row", "params (M)", "paper", "GMACs", "paper"):
        table3.add_column(col, justify="left" if col == "row" else "right")
    for r in data:
        if r["kind"] == "table3":
            table3.add_row(r["name"], f"{r['params_m']:.2f}", f"{r['paper_params_m']:.1f}",
                           f"{r['gmacs']:.2f}", f"{r['paper_gmacs']:.1f}")
    console = pipe_console()
    for table in (presets, table3):
        if table.row_count:  # a pattern that matches no row of a table prints no empty table
            console.print(table)
    return 0

"""Permutation invariance (MLP-Mixer notes, seed 004): how much accuracy a patch-based MLP and a convnet lose
when the pixels of every Fashion-MNIST image are permuted by one fixed permutation.

    nice -n 19 .venv/bin/python benchmarks/permutation.py --epochs 5 --seeds 0         # about an hour on a CPU
    nice -n 19 .venv/bin/python benchmarks/permutation.py --synthetic --epochs 1 --out /tmp/perm   # smoke test

Modes (resmlp.data.permute, applied to train and test images alike through data.permute):
identity; patch (the 7x7 grid of 4x4 patches shuffled, and the pixels inside every patch permuted by one
shared permutation); global (one permutation of all 784 pixels). The ResMLP (the quickstart trunk: patch 4,
width 64, depth 4) sees whole 4x4 patches, so `patch` only relabels its inputs; the convnet (a timm model with
in_chans=1) relies on local structure. Both train with the `fashion-mnist-quick` recipe (AdamW, cosine, flips;
the flip happens before the permutation) for the same budget. Runs go to OUT/<model>-<mode>/seed<k>/, are
skipped when their summary.json exists and resumed when interrupted.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from resmlp.fileio import atomic_write
from resmlp.hostinfo import host_line
from resmlp.train import train

MODES = ("none", "patch", "global")
MODE_NAMES = {"none": "identity", "patch": "patch shuffle + shared in-patch permutation",
              "global": "global pixel permutation"}
PATCH = 4  # the ResMLP's patch size, and so the patch the `patch` mode keeps whole
FASHION = "Fashion-MNIST (55k train, 5k validation carved from train, 10k test)"


def recipe_for(model: str, convnet: str) -> dict[str, Any]:
    """The quickstart recipe, with its model replaced by the timm convnet for `convnet` rows."""
    raw = yaml.safe_load((resources.files("resmlp") / "recipes" / "fashion-mnist-quick.yaml").read_text())
    raw["recipe"] = "fashion-mnist-quick"
    if model == "convnet":
        name = convnet if ":" in convnet else f"timm:{convnet}"  # the model grammar's timm:NAME
        raw["model"] = {"name": name, "in_chans": 1, "img_size": 28}
    return raw


def run_one(model: str, mode: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out) / f"{model}-{mode}" / f"seed{seed}"
    done = out / "summary.json"
    if done.exists():
        print(f"[skip] {model} {mode} seed {seed}: {done} exists", flush=True)
        return json.loads(done.read_text())
    overrides: dict[str, Any] = {"schedule.epochs": args.epochs, "train.seed": seed, "train.progress": False,
                                 "data.permute": mode, "data.permute_patch": PATCH, "data.permute_seed": 0}
    if args.synthetic:
        overrides.update({"data.kind": "synthetic", "data.synthetic_size": [512, 128],
                          "data.synthetic_classes": 10, "data.num_workers": 0, "train.compile": False})
    resume = (out / "last.pth").exists()
    print(f"[run] {model} {mode} seed {seed}{' (resuming)' if resume else ''} -> {out}", flush=True)
    return train(recipe_for(model, args.convnet), out, overrides=overrides, resume=resume)


def report(results: dict[tuple[str, str], list[float] | str], args: argparse.Namespace, seconds: float,
           models: list[str]) -> str:
    names = {"resmlp": "ResMLP (patch 4, width 64, depth 4)", "convnet": f"{args.convnet} (timm, in_chans=1)"}
    lines = [
        "# Permutation invariance on Fashion-MNIST",
        "",
        "Command:",
        "",
        "```",
        "nice -n 19 .venv/bin/python " + shlex.join(sys.argv),
        "```",
        "",
        f"Budget: {args.epochs} epoch(s) per run (recipe fashion-mnist-quick), seeds {args.seeds}, data: "
        f"{'synthetic (smoke test, NOT Fashion-MNIST)' if args.synthetic else FASHION}; "
        f"permutation seed 0, patch {PATCH}. Training time summed over the runs: {seconds / 60:.1f} min (shared "
        f"2-core CPU, nice 19); {host_line()}; precision: the recipe's amp: auto (bf16 where native).",
        "",
        "Top-1: test accuracy (%) of the checkpoint selected on the validation split (with one epoch: the only "
        "one), mean over seeds (± half the range with 2+ seeds). "
        "Drop: identity minus the mode (positive = the permutation hurts).",
        "",
        "| model | mode | top-1 (%) | drop vs identity |",
        "|---|---|---|---|",
    ]
    for model in models:
        ident = results.get((model, "none"))
        for mode in MODES:
            vals = results.get((model, mode))
            if isinstance(vals, str):
                lines.append(f"| {names[model]} | {MODE_NAMES[mode]} | not run: {vals} | — |")
                continue
            spread = f" ± {(max(vals) - min(vals)) / 2:.2f}" if len(vals) > 1 else ""
            mean = statistics.mean(vals)
            drop = ("—" if mode == "none" or not isinstance(ident, list)
                    else f"{statistics.mean(ident) - mean:+.2f}")
            lines.append(f"| {names[model]} | {MODE_NAMES[mode]} | {mean:.2f}{spread} | {drop} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=5, help="training budget of every run (default 5)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--models", default="resmlp,convnet", help="resmlp and/or convnet (default both)")
    parser.add_argument("--convnet", default="resnet10t", help="timm convnet for the convnet rows")
    parser.add_argument("--out", default="runs/permutation", help="run folders (default runs/permutation)")
    parser.add_argument("--report", default="benchmarks/results/permutation.md", help="markdown table to write")
    parser.add_argument("--synthetic", action="store_true", help="synthetic data instead of Fashion-MNIST (smoke test)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    models = args.models.split(",")
    if any(m not in ("resmlp", "convnet") for m in models):
        parser.error(f"--models takes resmlp and/or convnet, got {args.models}")
    results: dict[tuple[str, str], list[float] | str] = {}
    seconds = 0.0
    for model in models:
        for mode in MODES:
            try:
                runs = [run_one(model, mode, seed, args) for seed in seeds]
                results[model, mode] = [r["test_top1"] for r in runs]
                seconds += sum(r["wall_seconds"] for r in runs)
            except (ValueError, RuntimeError) as e:  # e.g. an engine without timm-model support: say so, go on
                print(f"[error] {model} {mode}: {e}", flush=True)
                results[model, mode] = str(e).splitlines()[0]
    text = report(results, args, seconds, models)
    atomic_write(args.report, lambda tmp: tmp.write_text(text))
    print(text)
    print(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

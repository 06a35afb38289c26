"""Distilled ResMLP vs the same ResMLP without distillation, at an equal budget, on Fashion-MNIST.

    nice -n 19 .venv/bin/python benchmarks/distill_fashion_mnist.py --output runs/bench-distill
    nice -n 19 .venv/bin/python benchmarks/distill_fashion_mnist.py --tiny   # smoke run on synthetic data

1. trains the convnet teacher with this project's engine (recipe fashion-mnist-teacher),
2. trains the quickstart-size ResMLP with recipe fashion-mnist-distill without a teacher, and
3. the same with hard distillation from the teacher (same epochs, batch, schedule, seed),
then prints the three accuracies side by side and the gain. Numbers go to OUTPUT/comparison.json.
`--teacher SPEC` skips step 1 (a checkpoint, or timm:NAME for a timing run with random weights);
`--cache` runs step 3 with the teacher-output cache (distill.cache), which changes the wall time only.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from resmlp.fileio import write_json
from resmlp.train import train

TINY = {"data.kind": "synthetic", "data.synthetic_size": [256, 64], "schedule.epochs": 1,
        "schedule.warmup_epochs": 0, "model.img_size": 28, "train.progress": False}


def given_teacher(spec: str) -> dict:
    """--teacher SPEC with its own test top-1 when it is a run's checkpoint (summary.json beside it)."""
    summary = Path(spec).with_name("summary.json")
    top1 = json.loads(summary.read_text())["test_top1"] if summary.is_file() else float("nan")
    return {"checkpoint": spec, "test_top1": top1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=f"runs/bench-distill-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--epochs", type=int, help="student and teacher epochs (default: the recipes')")
    parser.add_argument("--distill-type", default="hard", choices=("hard", "soft"))
    parser.add_argument("--teacher", help="use this teacher instead of training one (checkpoint or timm:NAME)")
    parser.add_argument("--cache", action="store_true", help="distil with the teacher-output cache")
    parser.add_argument("--skip-plain", action="store_true", help="train only the distilled student")
    parser.add_argument("--tiny", action="store_true", help="one epoch on synthetic data: checks the pipeline only")
    args = parser.parse_args()
    out = Path(args.output)
    common = dict(TINY) if args.tiny else {}
    if args.epochs:
        common["schedule.epochs"] = args.epochs
    teacher = given_teacher(args.teacher) if args.teacher else train("fashion-mnist-teacher", out / "teacher", common)
    nan = {"test_top1": float("nan"), "wall_seconds": float("nan")}
    plain = nan if args.skip_plain else train("fashion-mnist-distill", out / "no-distill",
                                              {**common, "distill.teacher": None})
    distilled = train("fashion-mnist-distill", out / "distill", {**common, "distill.teacher": teacher["checkpoint"],
                                                               "distill.type": args.distill_type,
                                                               "distill.cache": args.cache,
                                                               # --teacher timm:NAME is a timing run: random weights
                                                               "distill.allow_random_teacher": bool(args.teacher)})
    result = {"teacher": teacher["checkpoint"], "teacher_top1": teacher["test_top1"],
              "student_top1": plain["test_top1"], "distilled_top1": distilled["test_top1"],
              "gain": distilled["test_top1"] - plain["test_top1"], "student_seconds": plain["wall_seconds"],
              "distilled_seconds": distilled["wall_seconds"], "epochs": distilled["epochs"],
              "distill_type": args.distill_type, "cache": args.cache, "tiny": args.tiny}
    write_json(out / "comparison.json", result)
    print(f"teacher ({teacher['checkpoint']}) top-1 {result['teacher_top1']:.2f}%\n"
          f"ResMLP, no distillation  top-1 {result['student_top1']:.2f}%  ({plain['wall_seconds']:.0f}s)\n"
          f"ResMLP, {args.distill_type} distillation{' (cached teacher)' if args.cache else ''} top-1 "
          f"{result['distilled_top1']:.2f}%  ({distilled['wall_seconds']:.0f}s)\n"
          f"gain {result['gain']:+.2f} points at an equal budget of {result['epochs']} epochs -> {out}/comparison.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

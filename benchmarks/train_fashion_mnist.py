"""Train a Fashion-MNIST recipe end to end and report accuracy and wall-clock time against its target.

    .venv/bin/python benchmarks/train_fashion_mnist.py --recipe fashion-mnist-quick   # target >= 89%, <= 10 min
    .venv/bin/python benchmarks/train_fashion_mnist.py --recipe fashion-mnist-full    # target >= 92.5%

Runs `resmlp train` exactly as a user would (a fresh output folder), then prints the summary, the machine
(CPU model, cores, load average at start and end) and whether the targets were met, so numbers copied into
the README come with their conditions.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from resmlp.fileio import write_json

TARGETS = {"fashion-mnist-quick": (89.0, 600.0), "fashion-mnist-full": (92.5, None)}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="fashion-mnist-quick", choices=sorted(TARGETS))
    parser.add_argument("--output", default=None, help="run folder (default runs/bench-RECIPE-TIMESTAMP)")
    parser.add_argument("extra", nargs="*", help="extra arguments for resmlp train, e.g. --set train.threads=2")
    args = parser.parse_args()
    out = args.output or f"runs/bench-{args.recipe}-{time.strftime('%Y%m%d-%H%M%S')}"
    load_before = os.getloadavg()
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "resmlp", "train", "--recipe", args.recipe, "--output", out, *args.extra]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    wall = time.perf_counter() - start
    if rc != 0:
        print(f"training failed with exit code {rc}")
        return rc
    summary = json.loads(Path(out, "summary.json").read_text())
    min_top1, max_seconds = TARGETS[args.recipe]
    report = dict(recipe=args.recipe, val_top1=summary["val_top1"], test_top1=summary["test_top1"],
                  final_test_top1=summary["final_test_top1"], selected_epoch=summary["selected_epoch"],
                  epochs=summary["epochs"], train_wall_seconds=summary["wall_seconds"],
                  command_wall_seconds=round(wall, 1), cpu=cpu_model(), cores=os.cpu_count(),
                  load_avg_before=[round(x, 2) for x in load_before],
                  load_avg_after=[round(x, 2) for x in os.getloadavg()], amp=summary.get("amp"),
                  accuracy_target_met=summary["test_top1"] >= min_top1,
                  time_target_met=None if max_seconds is None else wall <= max_seconds)
    print(json.dumps(report, indent=2))
    write_json(Path(out, "benchmark.json"), report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

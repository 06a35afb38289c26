"""What resmlp's allocator setting (resmlp.runtime.keep_freed_memory) is worth to a training step.

    .venv/bin/python benchmarks/allocator.py [--pairs 3] [--json out.json] -- [train_throughput.py flags]

A process's allocator setting can't be switched back and forth fairly inside one process (memory freed
under one setting is page-faulted again, or not, under the other), so this runs benchmarks/train_throughput.py
in separate processes, alternating `--malloc glibc` and `--malloc resmlp` (the order swaps every pair), and
reports per variant and precision the median throughput under each setting and the median of the per-pair
ratios resmlp / glibc. Where both `ours` and `timm` ran, it also gives ours / timm per pair under each setting
and across them (ours under resmlp's setting / timm under glibc's: each as its own training runs by default).
Flags after `--` go to train_throughput.py (e.g. `--variants ours timm --rounds 3`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from resmlp.fileio import write_json

THROUGHPUT = Path(__file__).with_name("train_throughput.py")
SETTINGS = ("glibc", "resmlp")


def run_once(setting: str, extra: list[str], folder: Path, index: int) -> dict:
    out = folder / f"{setting}_{index}.json"
    subprocess.run([sys.executable, str(THROUGHPUT), *extra, "--malloc", setting, "--json", str(out)], check=True)
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3, help="processes per setting, run alternately")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="-- then flags for train_throughput.py")
    args = parser.parse_args()
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for setting in SETTINGS if i % 2 == 0 else SETTINGS[::-1]:
                runs[setting].append(run_once(setting, extra, Path(tmp), i))
    summary: dict[str, object] = {"host": runs["resmlp"][0]["host"], "pairs": args.pairs, "flags": extra,
                                  "results": {}}
    print(f"\nallocator setting, {args.pairs} alternating processes each:")
    for p, result in enumerate(runs["resmlp"][0]["results"]):
        for variant in result["variants"]:
            rate = {s: [r["results"][p]["variants"][variant]["median_img_s"] for r in runs[s]] for s in SETTINGS}
            ratios = [a / b for a, b in zip(rate["resmlp"], rate["glibc"], strict=True)]
            key = f"{result['precision']} {variant}"
            summary["results"][key] = {"img_s": rate, "resmlp_over_glibc": ratios}
            print(f"  {key:<28} glibc {statistics.median(rate['glibc']):6.2f} img/s, resmlp "
                  f"{statistics.median(rate['resmlp']):6.2f} img/s; resmlp / glibc median of pairs "
                  f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
        if {"ours", "timm"} <= set(result["variants"]):
            for ours_setting, timm_setting in (("glibc", "glibc"), ("resmlp", "resmlp"), ("resmlp", "glibc")):
                key = f"{result['precision']} ours ({ours_setting}) / timm ({timm_setting})"
                ratios = [r1["results"][p]["variants"]["ours"]["median_img_s"]
                          / r2["results"][p]["variants"]["timm"]["median_img_s"]
                          for r1, r2 in zip(runs[ours_setting], runs[timm_setting], strict=True)]
                summary["results"][key] = {"per_pair": ratios}
                print(f"  {key:<44} median of pairs {statistics.median(ratios):.3f} "
                      f"(min {min(ratios):.3f}, max {max(ratios):.3f})")
    if args.json:
        write_json(args.json, summary)  # atomic, through no planted link


if __name__ == "__main__":
    main()

"""Where a training step's system time goes: page faults per step under glibc's malloc and resmlp's setting.

    .venv/bin/python benchmarks/page_faults.py [--malloc resmlp|glibc] [--steps 5] [--precision fp32]
        [--variants ours timm] [--threads N] [--json out.json]

For each variant (resmlp_s12's fused step `ours`, timm's ResMLP `timm`; same models, batch and steps as
benchmarks/train_throughput.py) it runs one untimed step, then --steps steps, and prints for each step its
wall time, minor page faults, user and system CPU time (getrusage), and the process's peak resident set.
Run it once per setting (a process-wide
allocator setting can't be compared fairly inside one process; benchmarks/allocator.py compares the
resulting throughput in alternating processes). torch's `THP_MEM_ALLOC_ENABLE=1` (2 MB pages for large
blocks) is an environment variable read at start-up: set it for the whole command to measure it.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

import torch
from train_throughput import CONFIGS, build, host_info, make_step

from resmlp.fileio import write_json
from resmlp.runtime import keep_freed_memory


def step_costs(step, steps: int) -> list[dict[str, float]]:
    step()  # untimed: kernels, first allocations
    costs = []
    for _ in range(steps):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step()
        wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        costs.append({"wall_s": wall, "minor_faults": after.ru_minflt - before.ru_minflt,
                      "user_s": after.ru_utime - before.ru_utime, "system_s": after.ru_stime - before.ru_stime,
                      "peak_rss_gb": after.ru_maxrss * 1024 / 1e9})  # ru_maxrss is in KiB on Linux
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--malloc", choices=("resmlp", "glibc"), default="resmlp",
                        help="resmlp: the allocator setting resmlp's training uses; glibc: malloc left as it starts")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--variants", nargs="+", choices=("ours", "timm"), default=["ours", "timm"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.malloc == "resmlp":
        keep_freed_memory(True)
    config = CONFIGS["s12"]
    images = torch.randn(args.batch, config["in_chans"], args.img_size, args.img_size)
    targets = torch.randint(0, config["num_classes"], (args.batch,))
    host = host_info()
    thp = os.environ.get("THP_MEM_ALLOC_ENABLE", "0")
    print(f"host: {host['cpu']}, capability {host['cpu_capability']}, native bf16 {host['native_bf16']}, "
          f"{host['threads']} threads; {args.precision}, {args.malloc} malloc setting, THP_MEM_ALLOC_ENABLE={thp}")
    results: dict[str, object] = {}
    for variant in args.variants:
        costs = step_costs(make_step(build(variant, config, args.img_size), images, targets, args.precision),
                           args.steps)
        results[variant] = costs
        for i, c in enumerate(costs):
            print(f"  {variant} step {i + 1}: {c['wall_s']:.2f} s, {c['minor_faults']} minor faults, user "
                  f"{c['user_s']:.2f} s, system {c['system_s']:.2f} s, peak RSS {c['peak_rss_gb']:.2f} GB")
    if args.json:
        settings = {"malloc": args.malloc, "precision": args.precision, "batch": args.batch,
                    "img_size": args.img_size, "steps": args.steps, "THP_MEM_ALLOC_ENABLE": thp}
        write_json(args.json, {"host": host, "settings": settings, "results": results})  # atomic, through no link


if __name__ == "__main__":
    main()

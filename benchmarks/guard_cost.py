"""What the trainer's UpdateGuard (resmlp.train.step) costs a training step: time and memory.

    .venv/bin/python benchmarks/guard_cost.py [--device cpu|cuda] [--config s12|quickstart] [--batch 32]
        [--optimizer adamw lamb] [--rounds 7] [--steps 3] [--json out.json]

The guard copies every parameter and optimizer-state tensor before the optimizer step and puts them back with
a `torch.where` per tensor where the step's verdict says non-finite; no host read. Its memory is that copy:
parameters + moments (AdamW: 3x the parameter bytes). Per optimizer, the same model and batch run one step
with the guard and one without, alternating in interleaved rounds (load on a shared machine hits both);
reported: the median step time of each, the median of the per-round ratios (guarded / plain), the guard's
copy in MiB, and on a GPU the peak memory of each. The model is benchmarks/train_throughput.py's (resmlp_s12,
fused blocks) in bf16 autocast on a GPU or a CPU with native bf16, else fp32.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from timm.optim import create_optimizer_v2
from train_throughput import CONFIGS, autocast, build, host_info, synchronize

from resmlp.fileio import write_json
from resmlp.hostinfo import native_bf16
from resmlp.train.step import UpdateGuard, all_finite, optimizer_options, total_grad_norm


def make_step(optimizer_name: str, guarded: bool, args: argparse.Namespace, precision: str):
    device, config = torch.device(args.device), CONFIGS[args.config]
    model = build("ours", config, args.img_size, device)
    optimizer = create_optimizer_v2(model, opt=optimizer_name, lr=1e-4, weight_decay=0.05,
                                    **optimizer_options(optimizer_name, device))
    guard = UpdateGuard(model, optimizer, device) if guarded else None
    images = torch.randn(args.batch, config["in_chans"], args.img_size, args.img_size, device=device)
    targets = torch.randint(0, config["num_classes"], (args.batch,), device=device)

    def step() -> None:
        with autocast(precision, device):
            loss = torch.nn.functional.cross_entropy(model(images), targets)
        loss.backward()
        ok = all_finite(loss.detach(), total_grad_norm(model, None))
        before = guard.before_step() if guard else None
        optimizer.step()
        if guard:
            guard.after_step(before, ok)
        optimizer.zero_grad(set_to_none=True)

    return step, guard, sum(p.numel() * p.element_size() for p in model.parameters())


def peak_memory(step, device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def measure(optimizer_name: str, args: argparse.Namespace, precision: str) -> dict[str, object]:
    device = torch.device(args.device)
    plain, _, param_bytes = make_step(optimizer_name, False, args, precision)
    guarded, guard, _ = make_step(optimizer_name, True, args, precision)
    for step in (plain, guarded):  # warm-up: the optimizer's state, kernels, the guard's copy
        for _ in range(2):
            step()
    peaks = {"plain": peak_memory(plain, device), "guarded": peak_memory(guarded, device)}
    times: dict[str, list[float]] = {"plain": [], "guarded": []}
    for r in range(args.rounds):
        for name in (("plain", "guarded") if r % 2 == 0 else ("guarded", "plain")):
            step = plain if name == "plain" else guarded
            synchronize(device)
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            synchronize(device)
            times[name].append((time.perf_counter() - start) / args.steps)
    ratios = [g / p for g, p in zip(times["guarded"], times["plain"], strict=True)]
    copy_bytes = sum(t.numel() * t.element_size() for t in guard.backup)
    return {"optimizer": optimizer_name, "precision": precision,
            "plain_ms": 1000 * statistics.median(times["plain"]),
            "guarded_ms": 1000 * statistics.median(times["guarded"]),
            "guarded_over_plain": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "parameter_mib": param_bytes / 2**20, "guard_copy_mib": copy_bytes / 2**20,
            "peak_mib_plain": peaks["plain"], "peak_mib_guarded": peaks["guarded"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    parser.add_argument("--config", choices=tuple(CONFIGS), default="s12")
    parser.add_argument("--img-size", type=int, default=None, help="default: 224 for s12, 28 for quickstart")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--optimizer", nargs="+", choices=("adamw", "lamb", "sgd"), default=["adamw", "lamb"])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.img_size = args.img_size or (28 if args.config == "quickstart" else 224)
    if min(args.rounds, args.steps, args.batch) < 1:
        parser.error("--rounds, --steps and --batch must be >= 1")
    precision = "bf16" if args.device != "cpu" or native_bf16() else "fp32"
    host = host_info()
    print(f"host: {host['cpu']}, {host['cpu_capability']}, native bf16 {host['native_bf16']}, "
          f"{host['threads']} threads, torch {host['torch']}, device {args.device}, {precision}")
    results = [measure(name, args, precision) for name in args.optimizer]
    for r in results:
        print(f"{r['optimizer']:>6}: plain {r['plain_ms']:.2f} ms, guarded {r['guarded_ms']:.2f} ms per step, "
              f"guarded/plain {r['guarded_over_plain']:.3f} (rounds {r['ratio_min']:.3f}-{r['ratio_max']:.3f}); "
              f"guard copy {r['guard_copy_mib']:.1f} MiB for {r['parameter_mib']:.1f} MiB of parameters"
              + (f"; peak {r['peak_mib_plain']:.0f} -> {r['peak_mib_guarded']:.0f} MiB"
                 if r["peak_mib_plain"] is not None else ""))
    if args.json:
        settings = {k: getattr(args, k) for k in ("device", "config", "img_size", "batch", "rounds", "steps")}
        write_json(args.json, {"host": host, "settings": settings, "results": results})


if __name__ == "__main__":
    main()

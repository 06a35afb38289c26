"""Training throughput (images/s) of resmlp_s12 vs timm's resmlp_12_224, measured interleaved in one process.

    .venv/bin/python benchmarks/train_throughput.py [--batch 32] [--rounds 5] [--steps 3] [--threads N]

Same settings for both: 224x224 RGB, random data, AdamW, fp32 (or --amp bf16), forward + backward +
optimizer step. Rounds alternate between the two models so load changes on a shared machine hit both;
the median round is reported, with the ratio ours / timm (>= 1 means ours is at least as fast).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import timm
import torch

import resmlp


def make(name: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = resmlp.create_model(name) if name.startswith("resmlp_s") else timm.create_model(name)
    return model.train(), torch.optim.AdamW(model.parameters(), lr=1e-4)


def step(model, optimizer, images, targets, amp: str) -> None:
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if amp == "bf16" else contextlib.nullcontext()
    with ctx:
        loss = torch.nn.functional.cross_entropy(model(images), targets)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--amp", choices=("none", "bf16"), default="none")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    images, targets = torch.randn(args.batch, 3, 224, 224), torch.randint(0, 1000, (args.batch,))
    runs = {"resmlp_s12 (ours)": make("resmlp_s12"), "resmlp_12_224 (timm)": make("resmlp_12_224")}
    for model, optimizer in runs.values():  # warm-up: allocator, kernels
        step(model, optimizer, images, targets, args.amp)
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, (model, optimizer) in runs.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step(model, optimizer, images, targets, args.amp)
            rates[name].append(args.batch * args.steps / (time.perf_counter() - start))
    print(f"batch {args.batch}, 224x224, amp {args.amp}, threads {torch.get_num_threads()}, "
          f"{args.rounds} rounds x {args.steps} steps")
    medians = {name: statistics.median(r) for name, r in rates.items()}
    for name, median in medians.items():
        print(f"  {name:<22} {median:7.2f} img/s (rounds: {', '.join(f'{r:.1f}' for r in rates[name])})")
    ours, theirs = medians.values()
    print(f"ratio ours / timm: {ours / theirs:.3f}")


if __name__ == "__main__":
    main()

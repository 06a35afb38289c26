"""Training throughput (images/s) of resmlp_s12 vs timm's resmlp_12_224: a benchmark that can rank close numbers.

    .venv/bin/python benchmarks/train_throughput.py [--rounds 7] [--steps 2] [--batch 32] [--img-size 224]
        [--precision fp32 bf16] [--compile] [--threads N] [--json results.json] [--config s12|quickstart]
        [--device cpu|cuda]

On a GPU (`--device cuda --precision bf16 --compile --batch 128`, then 256) every timed block ends with a device
synchronisation, the GEMM peak is the same product on the GPU, and AdamW is torch's fused one.

One training step = forward + cross-entropy + backward + AdamW step on random 3-channel images. Variants:
`ours` (the default training path, fused blocks), `ours-plain` (the unfused blocks, for reference),
`timm` (timm's resmlp_12_224), and with --compile `ours-compiled` and `timm-compiled` (torch.compile of
the whole model). Each round runs every variant for --steps steps, in an order that rotates from round
to round, so load changes on a shared machine hit all of them; per variant the median and the spread
(min-max) over rounds are reported, and for ours the ratio to timm per round and the median of those
ratios (>= 1: ours faster). The GEMM peak is measured in the same rounds on the model's largest product
(B*N x C @ C x 4C); the training-step GEMM limit is peak / (matrix-product FLOPs of one step, counted by
torch's FlopCounterMode), and every variant's throughput is given as a percentage of it.
Precisions: fp32, and bf16 autocast (the default adds it where the CPU has native bf16).
`--malloc resmlp` (default) runs the process with the allocator setting resmlp's training uses
(resmlp.runtime.keep_freed_memory; process-wide, so timm's model gets it too), `--malloc glibc` with glibc's
own; benchmarks/allocator.py compares the two in alternating processes.
The host (CPU, its capability, native bf16, threads) and torch/timm versions go into the output and JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import resmlp
from resmlp import hostinfo
from resmlp.fileio import write_json
from resmlp.models.fused_block import set_fused_training
from resmlp.runtime import keep_freed_memory

EAGER = ("ours", "ours-plain", "timm")
# --config: ours = resmlp_s12 with these overrides; timm = an MlpMixer of ResBlocks (timm's ResMLP) of the
# same shape. "quickstart" is the fashion-mnist-quick recipe's model (28x28 grayscale, 10 classes).
CONFIGS: dict[str, dict[str, object]] = {
    "s12": dict(patch_size=16, in_chans=3, dim=384, depth=12, num_classes=1000, layerscale_init=0.1),
    "quickstart": dict(patch_size=4, in_chans=1, dim=64, depth=4, num_classes=10, layerscale_init=1.0),
}
COMPILED = ("ours-compiled", "timm-compiled")


def host_info() -> dict[str, object]:
    # resmlp's own host facts (native bf16 says no where the kernels are restricted to AVX2), plus its version
    return {**hostinfo.host_info(), "resmlp": getattr(resmlp, "__version__", "dev")}


def build(variant: str, config: dict[str, object], img_size: int, device: str | torch.device = "cpu") -> nn.Module:
    torch.manual_seed(0)
    if variant.startswith("timm"):
        model = MlpMixer(
            num_classes=config["num_classes"], img_size=img_size, in_chans=config["in_chans"],
            patch_size=config["patch_size"], num_blocks=config["depth"], embed_dim=config["dim"], mlp_ratio=4,
            block_layer=partial(ResBlock, init_values=config["layerscale_init"]), norm_layer=Affine,
        )
    else:
        model = resmlp.create_model("resmlp_s12", img_size=img_size, **config)
        set_fused_training(model, variant != "ours-plain")
    model.to(device).train()
    return torch.compile(model) if variant.endswith("compiled") else model


def autocast(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_step(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor,
              precision: str) -> Callable[[], None]:
    device = images.device
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda" or None)

    def step() -> None:
        with autocast(precision, device):
            loss = torch.nn.functional.cross_entropy(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def step_matmul_flops(config: dict[str, object], images: torch.Tensor, targets: torch.Tensor) -> int:
    """Matrix-product FLOPs (mm, addmm, bmm, convolution) of one forward + backward of the plain model."""
    model = build("ours-plain", config, images.shape[-1], images.device)
    with FlopCounterMode(display=False) as counter:
        torch.nn.functional.cross_entropy(model(images), targets).backward()
    return counter.get_total_flops()


def make_gemm(config: dict[str, object], batch: int, img_size: int,
              precision: str, device: torch.device) -> tuple[Callable[[], None], int]:
    """The model's largest product (tokens x C @ C x 4C) in the step's precision, and its FLOPs."""
    rows, dim = batch * (img_size // config["patch_size"]) ** 2, config["dim"]
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(rows, dim, dtype=dtype, device=device), torch.randn(dim, 4 * dim, dtype=dtype, device=device)
    return (lambda: torch.mm(a, b)), 2 * rows * dim * 4 * dim


def measure(precision: str, variants: list[str], args: argparse.Namespace) -> dict[str, object]:
    config, device = CONFIGS[args.config], torch.device(args.device)
    images = torch.randn(args.batch, config["in_chans"], args.img_size, args.img_size, device=device)
    targets = torch.randint(0, config["num_classes"], (args.batch,), device=device)
    steps = {v: make_step(build(v, config, args.img_size, device), images, targets, precision) for v in variants}
    gemm, gemm_flops = make_gemm(config, args.batch, args.img_size, precision, device)
    for step in steps.values():  # warm-up: allocator, kernels, compilation
        for _ in range(args.warmup):
            step()
    synchronize(device)
    rates: dict[str, list[float]] = {v: [] for v in variants}
    peaks: list[float] = []
    for r in range(args.rounds):
        order = variants[r % len(variants):] + variants[: r % len(variants)]
        for variant in order:
            start = time.perf_counter()
            for _ in range(args.steps):
                steps[variant]()
            synchronize(device)
            rates[variant].append(args.batch * args.steps / (time.perf_counter() - start))
        start = time.perf_counter()
        for _ in range(3):
            gemm()
        synchronize(device)
        peaks.append(3 * gemm_flops / (time.perf_counter() - start))
    peak = max(peaks)  # the machine's best: the limit a step could reach
    limit = args.batch * peak / step_matmul_flops(config, images, targets)
    result: dict[str, object] = {
        "precision": "fp32" if precision == "fp32" else "bf16 autocast",
        "gemm_peak_gflops": peak / 1e9,
        "gemm_limit_img_s": limit,
        "variants": {
            v: {"median_img_s": statistics.median(r), "min_img_s": min(r), "max_img_s": max(r),
                "rounds_img_s": r, "percent_of_gemm_limit": 100 * statistics.median(r) / limit}
            for v, r in rates.items()
        },
        "ratios": {},
    }
    for ours in (v for v in variants if v.startswith("ours")):
        for base in (v for v in variants if v.startswith("timm")):
            per_round = [a / b for a, b in zip(rates[ours], rates[base], strict=True)]
            result["ratios"][f"{ours} / {base}"] = {
                "median": statistics.median(per_round), "min": min(per_round), "max": max(per_round),
                "rounds": per_round,
            }
    return result


def report(result: dict[str, object]) -> None:
    print(f"\n{result['precision']}: GEMM peak {result['gemm_peak_gflops']:.0f} GFLOP/s -> training-step "
          f"GEMM limit {result['gemm_limit_img_s']:.2f} img/s")
    for name, v in result["variants"].items():
        print(f"  {name:<14} median {v['median_img_s']:7.2f} img/s  (min {v['min_img_s']:.2f}, max "
              f"{v['max_img_s']:.2f})  {v['percent_of_gemm_limit']:5.1f} % of the GEMM limit")
    for name, r in result["ratios"].items():
        print(f"  {name:<30} median of per-round ratios {r['median']:.3f}  (min {r['min']:.3f}, "
              f"max {r['max']:.3f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", choices=tuple(CONFIGS), default="s12",
                        help="s12: resmlp_s12 vs timm's resmlp_12_224; quickstart: the fashion-mnist-quick model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--img-size", type=int, default=None,
                        help="a multiple of the patch size (default: 224 for s12, 28 for quickstart)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per variant first")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--precision", nargs="+", choices=("fp32", "bf16"), default=None,
                        help="default: fp32, plus bf16 autocast where the CPU has native bf16")
    parser.add_argument("--variants", nargs="+", choices=EAGER + COMPILED, default=None,
                        help=f"default: {' '.join(EAGER)} (plus the compiled ones with --compile)")
    parser.add_argument("--compile", action="store_true", help="add ours-compiled and timm-compiled")
    parser.add_argument("--malloc", choices=("resmlp", "glibc"), default="resmlp",
                        help="resmlp: the allocator setting resmlp's training uses; glibc: malloc left as it starts")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    args = parser.parse_args()
    patch = CONFIGS[args.config]["patch_size"]
    args.img_size = args.img_size or (28 if args.config == "quickstart" else 224)
    if args.img_size % patch or args.img_size < patch:
        parser.error(f"--img-size must be a positive multiple of {patch} (the patch size), got {args.img_size}")
    if min(args.rounds, args.steps, args.batch) < 1 or args.warmup < 0:
        parser.error("--rounds, --steps and --batch must be >= 1, --warmup >= 0")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.malloc == "resmlp":
        keep_freed_memory(True)
    host = host_info()
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA GPU is visible")
        host["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
        print(f"device: {host['gpu']}")
    precisions = args.precision or (["fp32", "bf16"] if host["native_bf16"] or args.device != "cpu" else ["fp32"])
    variants = args.variants or list(EAGER + (COMPILED if args.compile else ()))
    print(f"host: {host['cpu']}, capability {host['cpu_capability']}, native bf16 {host['native_bf16']}, "
          f"{host['threads']} threads; torch {host['torch']}, timm {host['timm']}")
    print(f"config {args.config}: resmlp vs timm ResMLP, {args.img_size}x{args.img_size}, batch {args.batch}, AdamW, "
          f"{args.rounds} interleaved rounds x {args.steps} steps, {args.malloc} malloc setting")
    results = []
    for precision in precisions:
        results.append(measure(precision, variants, args))
        report(results[-1])
    if args.json:
        settings = {k: getattr(args, k) for k in ("config", "batch", "img_size", "rounds", "steps", "warmup",
                                                  "malloc", "device")}
        write_json(args.json, {"host": host, "settings": settings, "results": results})  # atomic, through no link


if __name__ == "__main__":
    main()

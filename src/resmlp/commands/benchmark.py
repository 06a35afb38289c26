"""`resmlp benchmark`: the paper's Table 1 (params, GMACs, throughput, peak memory, top-1) on this machine."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from resmlp.commands.common import add_threads_argument

if TYPE_CHECKING:
    from resmlp.analysis.benchmark import RunMode

# the benchmark's default models (kept here so that --help imports no torch)
DEFAULT_MODELS = "resmlp_s12,resmlp_s24,mixer_s16,timm:deit_small_patch16_224,timm:resnet50,timm:resmlp_12_224"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "benchmark",
        help="Table 1 for this machine: params, GMACs, throughput at batch N, a large batch and 1, peak memory, top-1",
        description="Measure all models in one run (interleaved rounds after warm-up, median reported). "
        "Models are named as everywhere in resmlp: a preset, timm:NAME, torchvision:NAME (random weights) or a "
        "checkpoint file, each with optional constructor overrides in brackets, values read as YAML, e.g. "
        "resmlp_s12[dim=64,depth=2,img_size=32,patch_size=8],timm:resnet50,runs/x/best.safetensors. The "
        "table, its CSV/JSON and the plot record the host (CPU, capability, native bf16, GPU, threads, versions), "
        "the device, the inference path, precision and compilation. When resmlp_s12 and "
        "timm:deit_small_patch16_224 are both listed, their throughput and memory ratios are printed beside the "
        "paper's.",
    )
    p.add_argument(
        "--models", default=DEFAULT_MODELS,
        help=f"comma-separated models, NAME[key=value,...] (default: {DEFAULT_MODELS})",
    )
    p.add_argument(
        "--path", default="optimized",
        help="how our ResMLP/Mixer models run: optimized (default; what `resmlp predict` runs: "
        "resmlp.inference.optimize) or plain (the model as built, as the paper timed it); timm and torchvision "
        "models always run as built",
    )
    p.add_argument(
        "--precision", default="fp32",
        help="fp32 (default), tf32 (fp32 with CUDA's TF32 matrix products; plain fp32 on a CPU) or bf16 (our "
        "optimized models in bf16, the others in bf16 autocast)",
    )
    p.add_argument(
        "--compile", nargs="?", const="default", default=None, metavar="MODE",
        help="torch.compile every model (static shapes); MODE default (if omitted), max-autotune, or "
        "reduce-overhead (CUDA graphs, GPU only)",
    )
    p.add_argument(
        "--batch-size", type=_positive_int, default=32,
        help="batch for throughput and memory (default 32, the paper's Table 1 batch)",
    )
    p.add_argument(
        "--large-batch", type=int, default=256,
        help="a second, large batch for throughput (default 256; 0: none)",
    )
    p.add_argument(
        "--repeats", type=_positive_int, default=5, help="timed rounds per model; median reported (5)"
    )
    p.add_argument(
        "--warmup", type=_positive_int, default=2, help="untimed forward passes per model first (2)"
    )
    p.add_argument(
        "--min-time",
        type=float,
        default=0.3,
        help="seconds one timed measurement should last; sets the passes per measurement (0.3)",
    )
    p.add_argument(
        "--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available, else cpu"
    )
    add_threads_argument(p)
    p.add_argument(
        "--img-size",
        type=_positive_int,
        default=None,
        help="input resolution for every model (default: each model's own, 224 for the defaults)",
    )
    p.add_argument(
        "--accuracy",
        default=None,
        help="known top-1 per model for the table and plot, e.g. resmlp_s12=76.6,timm:resnet50=80.4",
    )
    p.add_argument(
        "--val-data",
        default=None,
        help="measure the top-1 of every checkpoint-file model on this dataset: a kind (fashion-mnist, cifar10, "
        "...) or an ImageNet-layout folder (its val/ split); other models take theirs from --accuracy",
    )
    p.add_argument("--val-dir", default=None, help="folder of a --val-data kind (default: the kind's location)")
    p.add_argument("--output", default=None,
                   help="write the table here: FILE.json (rows and the S12/DeiT-S ratios) or CSV (any other name)")
    p.add_argument("--plot", default=None,
                   help="write a throughput-vs-accuracy PNG here (with --accuracy or --val-data; without them, "
                        "throughput alone)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    p.add_argument("--pipeline", action="store_true",
                   help="instead of Table 1: each data path of --recipe (the device path, timm's transform in workers) "
                   "on this machine, images/s, host ms and ops per batch, against the raw training step, and the "
                   "path data.pipeline auto would choose (at --batch-size, on --device)")
    p.add_argument("--recipe", default="deit", help="with --pipeline: the recipe whose data paths are measured (deit)")
    p.add_argument("--data-dir", default=None, help="with --pipeline: the recipe's data.dir (an image folder)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with --pipeline: a recipe override, as resmlp train's (repeatable)")
    p.add_argument("--batches", type=_positive_int, default=10,
                   help="with --pipeline: batches timed per path, at most (10; each path stops after 30 s too)")
    p.set_defaults(run=run)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def run(args: argparse.Namespace) -> int:
    if args.pipeline:
        return run_pipeline(args)
    from resmlp.analysis import benchmark
    from resmlp.hostinfo import host_line
    from resmlp.runtime import process_settings, resolve_device

    specs = benchmark.parse_models(args.models)
    mode = benchmark.RunMode(args.path, args.precision, args.compile)
    if args.large_batch < 0:
        raise ValueError(f"--large-batch must be a batch size, or 0 for none; got {args.large_batch}")
    accuracies = benchmark.parse_accuracies(args.accuracy) if args.accuracy else {}
    device = str(resolve_device(args.device or "auto"))
    with process_settings(args.threads):  # run() may be called in-process (tests, notebooks): restored after
        if args.val_data:
            accuracies.update(benchmark.measure_accuracies(specs, args.val_data, args.val_dir, device))
        rows = benchmark.run_benchmark(
            specs,
            batch_size=args.batch_size,
            repeats=args.repeats,
            warmup=args.warmup,
            min_time=args.min_time,
            device=device,
            img_size=args.img_size,
            accuracies=accuracies,
            progress=args.progress,
            mode=mode,
            large_batch_size=args.large_batch or None,
        )
        host = host_line()
    print_table(args, rows, device)
    print(host)
    for note in _precision_notes(mode, device):
        print(note)
    ratios = benchmark.paper_ratios(rows)
    if ratios:
        print(benchmark.ratio_line(ratios))
    if args.output:
        path = (benchmark.write_json(rows, ratios, args.output) if str(args.output).lower().endswith(".json")
                else benchmark.write_csv(rows, args.output))
        print(f"wrote {path}")
    if args.plot:
        print(f"wrote {benchmark.plot_tradeoff(rows, args.plot)}")
    return 0


def run_pipeline(args: argparse.Namespace) -> int:
    """`--pipeline`: the recipe's data paths against the raw step (resmlp.analysis.pipeline_report)."""
    from resmlp.analysis.pipeline_report import pipeline_report, report_lines
    from resmlp.fileio import write_json
    from resmlp.runtime import process_settings

    overrides = list(args.overrides) + ([f"data.dir={args.data_dir}"] if args.data_dir else [])
    with process_settings(args.threads):
        report = pipeline_report(args.recipe, overrides, args.batch_size, args.device or "auto", args.batches)
    print("\n".join(report_lines(report)))
    if args.output:
        print(f"wrote {write_json(args.output, report)}")
    return 0


def _precision_notes(mode: RunMode, device: str) -> list[str]:
    """What the precision meant on this device, where it is not what the flag says."""
    from resmlp.inference import native_bf16_available

    notes = []
    if mode.precision == "tf32" and not device.startswith("cuda"):
        notes.append("tf32 is a CUDA matrix mode: on the CPU these rows ran (and record) fp32")
    if mode.precision == "bf16" and not native_bf16_available(device):
        notes.append(f"this {device} has no native bf16 matrix units: bf16 products were emulated (slow)")
    return notes


def print_table(args: argparse.Namespace, rows: list[dict[str, Any]], device: str) -> None:
    """The rows as a rich table (wide when piped to a file)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    memory_note = (
        "growth of torch.cuda.max_memory_allocated"
        if device.startswith("cuda")
        else "growth of peak RSS, each model in its own process"
    )
    how = f"compiled ({args.compile})" if args.compile else "eager"
    table = Table(
        title=f"Table 1 on this machine: {device}, {rows[0]['threads']} threads, {rows[0]['precision']}, {how}, "
        f"ours {args.path}, median of {args.repeats} interleaved rounds",
        caption=f"peak MB: memory one forward pass at batch {args.batch_size} adds to the loaded "
        f"model ({memory_note}); weights MB: parameter storage",
    )
    columns = [
        ("model", "model"),
        ("img", "img_size"),
        ("params (M)", "params_m"),
        ("GMACs", "gmacs"),
        (f"im/s @{args.batch_size}", "throughput_img_s"),
        *([(f"im/s @{args.large_batch}", "throughput_large_img_s")] if args.large_batch else []),
        ("im/s @1", "throughput_b1_img_s"),
        ("path", "path"),
        ("peak MB", "peak_memory_mb"),
        ("weights MB", "weights_mb"),
    ]
    if any(row["top1"] is not None for row in rows):
        columns.append(("top-1", "top1"))
    for title, _ in columns:
        table.add_column(title, justify="left" if title == "model" else "right")
    for row in rows:
        # escaped: a model's bracketed overrides (resmlp_s12[dim=64]) are not rich markup
        table.add_row(*("" if row[key] is None else escape(str(row[key])) for _, key in columns))
    console = Console()
    if not console.is_terminal:  # piped to a file: don't squeeze the table into 80 columns
        console = Console(width=160)
    console.print(table)

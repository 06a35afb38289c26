"""`resmlp analyze CHECKPOINT --out DIR`: the paper's weight figures and sparsity numbers for a checkpoint;
`resmlp analyze-fig4 SUMMARY.json... --out DIR`: the paper's Fig. 4 (ImageNet-V2 vs ImageNet-val) from evaluations."""

from __future__ import annotations

import argparse

from resmlp.commands.common import add_output_argument, add_threads_argument


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="weight figures (paper Fig. 2, 3; Mixer Fig. 5, 7) and sparsity numbers for a checkpoint",
        description="Write DIR/index.html with the cross-patch matrices (ResMLP), token-mixing units "
        "(Mixer), patch-embedding units and per-layer sparsity, plus the numbers as JSON/CSV/NPZ.",
    )
    p.add_argument("checkpoint", help="a checkpoint of any model resmlp train trains (.safetensors, or a run folder "
                   "for its best.safetensors), or timm's or DeiT's ResMLP/Mixer file (.pth); the paper's figures "
                   "are for ResMLP and Mixer, other models get their weights' sparsity and first filters")
    add_output_argument(p, required=True, help="output directory (created if missing)")
    p.add_argument(
        "--layers",
        type=_layer_list,
        default=None,
        help="comma-separated 1-based layers to draw, e.g. 1,5,12 (default: all)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.05,
        help="a weight counts as 'small' below this fraction of its matrix's max |w| (default 0.05)",
    )
    add_threads_argument(p)
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")
    p.set_defaults(run=run)

    f = sub.add_parser(
        "analyze-fig4",
        help="paper Fig. 4: ImageNet-V2 vs ImageNet-val top-1 of several checkpoints, with linear fits and y = x",
        description="Plot each checkpoint's ImageNet-V2 top-1 against its ImageNet-val top-1 from the summaries of "
        "`resmlp eval CKPT --data folder:IMAGENET --output A` and `resmlp eval CKPT --data imagenetv2:DIR --output "
        "B` (A/summary.json and B/summary.json for every checkpoint), with a least-squares line per family and "
        "y = x; writes fig4.png, fig4.csv, fig4_fits.csv and index.html.",
    )
    f.add_argument("summaries", nargs="+", metavar="[FAMILY=]SUMMARY.json",
                   help="evaluation summaries, two per checkpoint (val and V2); FAMILY= groups checkpoints into a "
                   "family with its own line (default family: ResMLP)")
    add_output_argument(f, required=True, help="output directory (created if missing)")
    f.add_argument("--paper", action="store_true",
                   help="add the paper's ResMLP points (Table 3: S12, S24, B24, B24/8 distil, B24/8 Imnet21k) as "
                   "their own family")
    f.set_defaults(run=run_fig4)


def run_fig4(args: argparse.Namespace) -> int:
    from resmlp.analysis.overfit import paper_points, read_points, write_fig4
    from resmlp.fileio import output_lock

    points = read_points(args.summaries) + (paper_points() if args.paper else [])
    with output_lock(args.output):
        written = write_fig4(points, args.output)
    for point in points:
        print(f"{point.family:<24} {point.label:<20} val {point.val_top1:6.2f}%  V2 {point.v2_top1:6.2f}%  "
              f"gap {point.val_top1 - point.v2_top1:5.2f}")
    print(f"wrote {', '.join(str(path) for path in written)}")
    return 0


def _layer_list(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        message = f"expected comma-separated layer numbers like 1,5,12, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def run(args: argparse.Namespace) -> int:
    from resmlp.analysis.report import write_report
    from resmlp.checkpoint import load
    from resmlp.evaluation import resolve_checkpoint
    from resmlp.fileio import output_lock
    from resmlp.models.resmlp import ResMLP
    from resmlp.runtime import process_settings

    path = resolve_checkpoint(args.checkpoint)
    model = load(path).eval()  # the weights only: no preprocessing needed
    if not isinstance(model, ResMLP) and args.layers:
        raise ValueError(f"--layers counts ResMLP/Mixer blocks; {path} holds a {type(model).__name__}: leave it out")
    with process_settings(args.threads), output_lock(args.output):
        if isinstance(model, ResMLP):
            report = write_report(model, args.output, layers=args.layers, threshold=args.threshold, source=str(path),
                                  progress=args.progress)
        else:
            from resmlp.analysis.any_model import write_any_model_report

            report = write_any_model_report(model, args.output, args.threshold, str(path))
    for name in report.figures:
        print(f"wrote {report.out_dir / name}")
    for note in report.not_applicable:
        print(f"skipped: {note}")
    if getattr(report, "sparsity_sentence", ""):  # the comparison, beside its random-init baseline
        print(f"sparsity: {report.sparsity_sentence}{report.baseline_sentence}".rstrip())
    print(f"numbers: {', '.join(str(report.out_dir / n) for n in report.numbers)}")
    print(f"open {report.index}")
    return 0

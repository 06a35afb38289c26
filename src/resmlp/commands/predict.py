"""`resmlp predict CHECKPOINT IMAGES...`: top-k classes of images, folders or globs, as a table or a file."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

from resmlp.commands.common import add_crop_argument, output_file

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predict", help="classify images with a checkpoint (top-k classes and probabilities)")
    p.add_argument("checkpoint", help="a .safetensors checkpoint of this project, a timm / DeiT weight file, or a "
                                      "run folder")
    p.add_argument("images", nargs="+", help="image files, folders (searched recursively) or glob patterns")
    p.add_argument("--top-k", type=int, default=5, help="classes to report per image (default 5)")
    p.add_argument("--output", type=output_file, help="also write the predictions to FILE.json or FILE.csv")
    p.add_argument("--precision", choices=("fp32", "bf16", "int8"), default="fp32",
                   help="inference precision; int8: dynamic quantisation of the linear layers (default fp32)")
    p.add_argument("--batch-size", type=int, default=32, metavar="N", help="images per batch (default 32)")
    add_crop_argument(p)
    p.set_defaults(run=run)


def expand_inputs(items: list[str]) -> tuple[list[Path], list[dict[str, str]]]:
    """Image paths from files, folders and globs (in the order given) and an error per input matching none.

    Regular files only, folders walked without following folder symlinks, every walk bounded
    (`resmlp.data.sources.walk`): no FIFO is opened, no symlink loop walked."""
    from resmlp.data.sources.walk import expand_pattern, is_regular_file, regular_files

    paths: list[Path] = []
    errors: list[dict[str, str]] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = list(regular_files(p, lambda name: Path(name).suffix.lower() in IMAGE_SUFFIXES))
        elif is_regular_file(p):
            found = [p]  # named explicitly: tried whatever its suffix, and reported if unreadable
        elif p.exists():
            errors.append(dict(file=item, error="not a regular file (a FIFO, socket or device?)"))
            continue
        else:
            found = expand_pattern(item)
        if not found:
            errors.append(dict(file=item, error="no such file, or no image files in that folder / pattern"))
        paths += found
    return list(dict.fromkeys(paths)), errors


def classify(args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[dict[str, str]], str]:
    """Predictions per readable image, errors per unreadable input, and where preprocessing came from."""
    import torch

    from resmlp.evaluation import resolve_checkpoint
    from resmlp.inference import load_for_inference, optimize, predict

    if args.top_k < 1 or args.batch_size < 1:
        raise ValueError("--top-k and --batch-size must be at least 1")
    loaded = load_for_inference(resolve_checkpoint(args.checkpoint), crop_pct=args.crop_pct)
    if loaded.num_classes == 0:
        raise ValueError(f"{args.checkpoint} has no classifier head (num_classes=0): nothing to predict")
    top_k = min(args.top_k, loaded.num_classes)  # a 10-class model has no 11th guess
    names, transform = loaded.names(), loaded.preprocess.eval_transform()
    fast = optimize(loaded.model, args.precision)
    paths, errors = expand_inputs(args.images)
    results: list[dict[str, Any]] = []
    batches = range(0, len(paths), args.batch_size)
    if len(paths) > args.batch_size:
        from tqdm.auto import tqdm

        batches = tqdm(batches, desc="predict", unit="batch", dynamic_ncols=True, file=sys.stderr)
    for start in batches:
        batch, kept = [], []
        for path in paths[start:start + args.batch_size]:
            try:
                batch.append(loaded.preprocess.load(path, transform))
                kept.append(path)
            except ValueError as e:
                errors.append(dict(file=str(path), error=str(e)))
        if not batch:
            continue
        probs, indices = predict(fast, torch.stack(batch), top_k)
        for path, p, i in zip(kept, probs.tolist(), indices.tolist(), strict=True):
            results.append(dict(file=str(path), top_k=[dict(class_id=c, class_name=names[c], probability=q)
                                                        for c, q in zip(i, p, strict=True)]))
    return results, errors, loaded.preprocess


def write_output(path: Path, results: list[dict[str, Any]], errors: list[dict[str, str]]) -> None:
    """JSON {"predictions": [...], "errors": [...]} or CSV with one row per (file, rank)."""
    from resmlp.fileio import atomic_write

    if path.suffix.lower() == ".json":
        text = json.dumps(dict(predictions=results, errors=errors), indent=2)
    else:  # .csv (run() checked the suffix before any work)
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["file", "rank", "class_id", "class_name", "probability", "error"])
        for r in results:
            for rank, t in enumerate(r["top_k"], 1):
                writer.writerow([r["file"], rank, t["class_id"], t["class_name"], f"{t['probability']:.6f}", ""])
        for e in errors:
            writer.writerow([e["file"], "", "", "", "", e["error"]])
        text = buf.getvalue()
    atomic_write(path, lambda tmp: tmp.write_text(text))


def _common_folder(files: list[str]) -> str | None:
    """The folder every file is in (None for fewer than two files, or none shared but the root)."""
    if len(files) < 2:
        return None
    base = os.path.commonpath([os.path.dirname(os.path.abspath(f)) for f in files])
    return base if base not in ("", os.sep) else None


NO_TERMINAL_WIDTH = 100_000  # columns of the table written to a file or a pipe: wider than any row


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from resmlp.commands.common import pipe_console

    if args.output is not None and args.output.suffix.lower() not in (".json", ".csv"):
        raise ValueError(f"--output must end in .json or .csv, got {args.output.name}")
    results, errors, pre = classify(args)
    if args.output is not None:  # before printing anything: a failed write leaves no table behind its error
        write_output(args.output, results, errors)
    # messages stay one line each, whatever the terminal width; redirected (no terminal), the table is as wide as
    # its longest row, not rich's 80 columns: a name is never wrapped onto a second line of a file or a pipe
    console = pipe_console(soft_wrap=True, **({} if sys.stdout.isatty() else {"width": NO_TERMINAL_WIDTH}))
    if pre.note:  # what was assumed (a file without metadata) or overridden (--crop-pct), in one line
        console.print(f"[yellow]{pre.note}[/yellow]", highlight=False)
    base = _common_folder([r["file"] for r in results])
    table = Table(title=f"Predictions ({args.precision})" + (f" of images in {base}" if base else ""))
    # the part of each path that tells the files apart, whole (folded rather than cut when it is long)
    table.add_column("file", overflow="fold")
    for rank in range(1, min(args.top_k, max((len(r["top_k"]) for r in results), default=0)) + 1):
        table.add_column(f"#{rank}")
    for r in results:
        name = os.path.relpath(r["file"], base) if base else r["file"]
        table.add_row(name, *(f"{t['class_name']} {t['probability']:.1%}" for t in r["top_k"]))
    console.print(table)
    err_console = Console(stderr=True, soft_wrap=True)  # one line per failed file, whatever the terminal width
    for e in errors:
        err_console.print(f"[red]skipped[/red] {e['file']}: {e['error']}", highlight=False)
    if args.output is not None:
        console.print(f"wrote {args.output}")
    console.print(f"{len(results)} image(s) classified, {len(errors)} failed")
    return 0 if not errors and results else 1

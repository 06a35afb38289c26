"""Does the device pipeline train as well as timm's? The same small model on the same JPEG folder, the recipe's
augmentation run by timm's per-image transform (data.pipeline=timm) and by the device pipeline (device), 3 seeds
each; the top-1 means must agree within the seed spread.

    .venv/bin/python benchmarks/device_pipeline_accuracy.py --out /tmp/acc [--epochs 10] [--seeds 0 1 2]

The data: scikit-learn's digits (1,797 8x8 grey scans of handwritten digits, a real dataset shipped with
scikit-learn), upscaled to 64 px (bicubic) and written as JPEGs (quality 90) in DIR/train/<digit>/ (1,197
images) and DIR/val/<digit>/ (600, a fixed stratified split). The model: ResMLP at 32 px (the 64-px JPEGs are
cropped and resized to it, as ImageNet's ~400-px photos are to 224), patch 4, dim 64, depth 2, 1 channel, AdamW.
The augmentation: the deit recipe's (RandAugment rand-m9-mstd0.5-inc1, erasing 0.25, Mixup 0.8, CutMix 1.0,
smoothing 0.1; flips off: a flipped digit is another symbol) with a random-resized-crop scale of [0.35, 1] (0.08
of a 64-px digit is a blot). Each run is `resmlp train` in this process, one after the other.
Output: a markdown table (per seed, mean, spread) and the verdict, to stdout and OUT/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from PIL import Image

from resmlp.cli import main as resmlp_main
from resmlp.fileio import atomic_write


def digits_folder(root: Path, size: int = 64, val_per_class: int = 60, train_per_class: int | None = None) -> Path:
    """scikit-learn's digits as JPEGs in root/{train,val}/<digit>/ (idempotent); `train_per_class` caps the
    training images (the tiny form)."""
    if (root / "val").is_dir():
        return root
    from sklearn.datasets import load_digits

    digits = load_digits()
    rng = np.random.default_rng(0)
    for label in range(10):
        members = rng.permutation(np.nonzero(digits.target == label)[0])
        if train_per_class is not None:
            members = members[:val_per_class + train_per_class]
        for rank, index in enumerate(members):
            split = "val" if rank < val_per_class else "train"
            folder = root / split / str(label)
            folder.mkdir(parents=True, exist_ok=True)
            pixels = (digits.images[index] * (255 / 16)).round().astype(np.uint8)
            Image.fromarray(pixels).resize((size, size), Image.BICUBIC).save(folder / f"{index}.jpg", quality=90)
    return root


def train(data: Path, out: Path, pipeline: str, seed: int, epochs: int, batch: int, threads: int) -> dict:
    """One `resmlp train` run; its summary.json."""
    sets = {"data.kind": "folder", "data.pipeline": pipeline, "data.num_workers": 0, "data.val_size": 0,
            "data.auto_augment": "rand-m9-mstd0.5-inc1", "data.reprob": 0.25, "data.mixup": 0.8, "data.cutmix": 1.0,
            "data.hflip": 0.0, "data.scale": [0.35, 1.0], "data.crop_pct": 1.0, "data.mean": [0.5], "data.std": [0.5],
            "loss.label_smoothing": 0.1, "model.img_size": 32, "model.patch_size": 4, "model.in_chans": 1,
            "model.dim": 64, "model.depth": 2, "optim.name": "adamw", "optim.lr": 2e-3, "optim.weight_decay": 0.05,
            "schedule.epochs": epochs, "schedule.warmup_epochs": min(1, epochs - 1), "train.batch_size": batch,
            "train.seed": seed, "train.progress": False, "train.compile": False, "train.threads": threads,
            "train.amp": "fp32"}
    argv = ["train", "--data-dir", str(data), "--output", str(out)] + [
        f"--set={key}={json.dumps(value)}" for key, value in sets.items()]
    if resmlp_main(argv) != 0:
        raise SystemExit(f"the {pipeline} run with seed {seed} failed")
    return json.loads((out / "summary.json").read_text())


def table(results: dict[str, list[float]], seeds: list[int]) -> tuple[str, bool]:
    """The markdown table and whether the two means agree within the seed spread."""
    lines = ["| pipeline | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | spread (max - min) |",
             "|---|" + "---|" * (len(seeds) + 2)]
    for name, tops in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{t:.2f}" for t in tops)
                     + f" | {statistics.mean(tops):.2f} | {max(tops) - min(tops):.2f} |")
    gap = abs(statistics.mean(results["device"]) - statistics.mean(results["timm"]))
    spread = max(max(t) - min(t) for t in results.values())
    agree = gap <= spread
    lines.append("")
    lines.append(f"Difference of the means: {gap:.2f} points; largest seed spread: {spread:.2f} points: "
                 + ("they agree within the seed spread." if agree else "they do NOT agree within the seed spread."))
    return "\n".join(lines), agree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="4 training and 2 validation images per digit (a test)")
    args = parser.parse_args()
    data = digits_folder(args.out / "digits", *((64, 2, 4) if args.tiny else ()))
    results: dict[str, list[float]] = {"timm": [], "device": []}
    start = time.perf_counter()
    for seed in args.seeds:  # alternate the pipelines so a load change hits both
        for pipeline in results:
            summary = train(data, args.out / f"{pipeline}-{seed}", pipeline, seed, args.epochs, args.batch,
                            args.threads)
            results[pipeline].append(summary["val_top1"] if "val_top1" in summary else summary["top1"])
    text, agree = table(results, args.seeds)
    text += f"\n\n{args.epochs} epochs per run, {time.perf_counter() - start:.0f} s in all."
    print(text)
    atomic_write(args.out / "accuracy.md", lambda tmp: tmp.write_text(text + "\n"))


if __name__ == "__main__":
    main()

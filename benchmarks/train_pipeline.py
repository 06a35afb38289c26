"""The authors' recipe on an ImageNet-layout JPEG folder, end to end: `resmlp train --recipe deit` against a baseline
built from timm's own parts, and where the input pipeline's time goes.

    .venv/bin/python benchmarks/train_pipeline.py --folder DIR [--device cuda] [--epochs 3] [--batch 256]
        [--workers 14] [--precision auto] [--json out.json]
    .venv/bin/python benchmarks/train_pipeline.py --make-folder DIR --images 2000   # a folder of random JPEGs

Baseline ("timm parts"): timm.data.create_dataset + create_loader with the recipe's arguments (RandAugment
rand-m9-mstd0.5-inc1, bicubic random-resized crop, flip, erasing 0.25, pinned memory; timm's loader repeats
augmentations only under torch.distributed, so a one-process baseline runs without the recipe's 3 repeats: they
change which images an epoch holds, not what an image costs),
timm's Mixup/CutMix (0.8 / 1.0, smoothing 0.1) and SoftTargetCrossEntropy, timm's resmlp_12_224, LAMB, autocast.
Precision: `auto` (the default) is `amp: auto` on the device: bf16 on a GPU, on a CPU bf16 only where it is native
(else fp32: emulated bf16 is ~60x slower), both sides in the same one.
Ours: the `resmlp train` command itself, in a subprocess, with the same batch, workers, precision and epochs,
once per `--pipelines` (data.pipeline device: decoding and augmentation on the device; timm: timm's transform in
the workers).
Both report images per second per epoch; the ratio is over the epochs after the first (the first pays for
start-up and compilation). `--profile` first times, on one core, what one training image costs in the input
pipeline: JPEG decode (PIL), the recipe's augmentation (timm's training transform), collation of a batch, and the
host-to-device copy. Output: the device, CPU cores, torch / timm / resmlp versions and every number, to --json.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

import resmlp
from resmlp.fileio import write_json
from resmlp.hostinfo import host_info
from resmlp.preprocess import _with_zero_bit_posterize
from resmlp.runtime import precision_name, resolve_amp

RECIPE_AUGMENT = dict(auto_augment="rand-m9-mstd0.5-inc1", re_prob=0.25, interpolation="bicubic", hflip=0.5,
                      scale=(0.08, 1.0), color_jitter=None)  # = src/resmlp/recipes/deit.yaml's data section


def make_folder(root: Path, images: int, classes: int = 10, size: tuple[int, int] = (320, 280)) -> None:
    """DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg of smooth random images (JPEG quality 90)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", images), ("val", max(images // 10, classes))):
        for i in range(count):
            folder = root / split / f"class_{i % classes:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            small = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
            Image.fromarray(small).resize(size, Image.BICUBIC).save(folder / f"{i:06d}.jpg", quality=90)


def profile(folder: Path, device: torch.device, images: int = 128, batch: int = 256) -> dict[str, float]:
    """Milliseconds per image on one core: decode, augment, collate, copy to the device."""
    from timm.data import create_transform

    torch.set_num_threads(1)
    files = sorted((folder / "train").rglob("*.jpg"))[:images]
    transform = _with_zero_bit_posterize(create_transform(224, is_training=True, **RECIPE_AUGMENT))
    start = time.perf_counter()
    decoded = [Image.open(f).convert("RGB") for f in files]
    decode = (time.perf_counter() - start) / len(files)
    start, tensors = time.perf_counter(), []
    for img in decoded:
        tensors.append(transform(img))
    augment = (time.perf_counter() - start) / len(files)
    repeat = [tensors[i % len(tensors)] for i in range(batch)]
    start = time.perf_counter()
    stacked = torch.stack(repeat).pin_memory() if device.type == "cuda" else torch.stack(repeat)
    collate = (time.perf_counter() - start) / batch
    start = time.perf_counter()
    stacked.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    copy = (time.perf_counter() - start) / batch
    per_image = {"decode_ms": 1e3 * decode, "augment_ms": 1e3 * augment, "collate_ms": 1e3 * collate,
                 "copy_ms": 1e3 * copy}
    per_image["images_per_s_per_core"] = 1e3 / sum(per_image.values())
    torch.set_num_threads(os.cpu_count() or 1)
    return per_image


def run_ours(folder: Path, args: argparse.Namespace, pipeline: str = "device") -> list[float]:
    """`resmlp train --recipe deit` (data.pipeline `pipeline`) for --epochs epochs; images/s of each epoch from
    its metrics.csv."""
    out = Path(tempfile.mkdtemp(prefix="resmlp-pipeline-")) / "run"
    amp = {"fp32": "none"}.get(args.precision, args.precision)
    cmd = [sys.executable, "-m", "resmlp", "train", "--recipe", "deit", "--data-dir", str(folder), "--output",
           str(out), "--epochs", str(args.epochs), "--batch-size", str(args.batch), "--workers", str(args.workers),
           "--amp", amp, "--device", args.device, "--set", "schedule.warmup_epochs=0",
           "--set", "train.progress=false", "--set", f"train.compile={args.compile}", "--set",
           f"data.pipeline={pipeline}"]
    subprocess.run(cmd, check=True, timeout=args.timeout)
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    return [float(r["train_images_per_s"]) for r in rows]


def run_timm(folder: Path, args: argparse.Namespace) -> list[float]:
    """The same recipe from timm's parts; images/s of each epoch (a device synchronisation ends each)."""
    import timm
    from timm.data import Mixup, create_dataset, create_loader
    from timm.loss import SoftTargetCrossEntropy
    from timm.optim import create_optimizer_v2

    device = torch.device(args.device)
    dataset = create_dataset("", root=str(folder), split="train", is_training=True)
    loader = create_loader(dataset, input_size=(3, 224, 224), batch_size=args.batch, is_training=True,
                           num_workers=args.workers, pin_memory=device.type == "cuda",
                           persistent_workers=True, device=device, use_prefetcher=device.type == "cuda",
                           **{k: v for k, v in RECIPE_AUGMENT.items() if k != "color_jitter"})
    # timm's posterize asks Pillow 13 for 0 bits now and then, which Pillow refuses: the same op as resmlp's
    # pipeline (0 bits = black, as Pillow < 13 gave), so both sides run the same augmentation
    dataset.transform = _with_zero_bit_posterize(dataset.transform)
    classes = len(dataset.reader.class_to_idx)
    mixup = Mixup(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=classes)
    model = timm.create_model("resmlp_12_224", num_classes=classes, drop_path_rate=0.05).to(device)
    optimizer = create_optimizer_v2(model, opt="lamb", lr=5e-3 * args.batch / 2048, weight_decay=0.2)
    if args.compile == "true":
        model = torch.compile(model)
    loss_fn = SoftTargetCrossEntropy()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    rates = []
    for _ in range(args.epochs):
        start, seen = time.perf_counter(), 0
        for images, targets in loader:
            if len(targets) % 2:  # Mixup pairs images: timm's train.py drops the odd last batch too
                continue
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            images, targets = mixup(images, targets)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                loss = loss_fn(model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(targets)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rates.append(seen / (time.perf_counter() - start))
        print(f"timm parts: epoch {len(rates)} {rates[-1]:.1f} img/s", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, help="ImageNet-layout folder (train/ and val/)")
    parser.add_argument("--make-folder", type=Path, help="write a folder of random JPEGs here and stop")
    parser.add_argument("--images", type=int, default=2000, help="with --make-folder: training images")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", type=int, default=max((os.cpu_count() or 2) - 2, 1))
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                        help="auto (default): bf16 on a GPU and on a CPU with native bf16, else fp32 (amp: auto)")
    parser.add_argument("--compile", choices=("auto", "true", "false"), default="auto")
    parser.add_argument("--profile", action="store_true", help="time the pipeline's parts on one core first")
    parser.add_argument("--only", choices=("ours", "timm"), help="run one side only")
    parser.add_argument("--pipelines", nargs="+", choices=("device", "timm"), default=["device"],
                        help="data.pipeline of our runs: device (the recipe's default) and/or timm")
    parser.add_argument("--timeout", type=int, default=7200, help="seconds allowed for our training command")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.make_folder:
        make_folder(args.make_folder, args.images)
        print(f"wrote {args.images} training JPEGs under {args.make_folder}")
        return
    if args.folder is None or not (args.folder / "train").is_dir():
        parser.error("--folder DIR needs DIR/train/<class>/ images (or make one with --make-folder)")
    try:  # auto: the host's amp: auto, so both sides and the JSON name the precision that ran
        args.precision = precision_name(resolve_amp(args.precision, torch.device(args.device)))
    except ValueError as err:  # fp16 on the CPU
        parser.error(str(err))
    host = {**host_info(args.precision), "resmlp": getattr(resmlp, "__version__", "dev"), "device": args.device,
            "cpu_cores": os.cpu_count()}
    if args.device.startswith("cuda"):
        host["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    print(json.dumps(host))
    result: dict[str, object] = {"host": host, "settings": {k: str(v) for k, v in vars(args).items()}}
    if args.profile:
        result["profile_per_image"] = profile(args.folder, torch.device(args.device))
        print("one core, per image:", json.dumps(result["profile_per_image"]))
    if args.only != "timm":
        for pipeline in args.pipelines:  # the first is ours_img_s; the others ours_<pipeline>_pipeline_img_s
            key = "ours_img_s" if pipeline == args.pipelines[0] else f"ours_{pipeline}_pipeline_img_s"
            result[key] = run_ours(args.folder, args, pipeline)
            print(f"resmlp train, data.pipeline={pipeline}:", result[key])
    if args.only != "ours":
        result["timm_img_s"] = run_timm(args.folder, args)
    if "ours_img_s" in result and "timm_img_s" in result and args.epochs > 1:
        ours, timm_rates = result["ours_img_s"][1:], result["timm_img_s"][1:]
        result["ours_over_timm_after_first_epoch"] = (sum(ours) / len(ours)) / (sum(timm_rates) / len(timm_rates))
        print(f"ours / timm parts, epochs 2..{args.epochs}: {result['ours_over_timm_after_first_epoch']:.3f}")
        for key in [k for k in result if k.endswith("_pipeline_img_s")]:
            other = result[key][1:]
            result[key.replace("_img_s", "_over_timm_after_first_epoch")] = (sum(other) / len(other)) / (
                sum(timm_rates) / len(timm_rates))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()

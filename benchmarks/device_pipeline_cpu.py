"""The recipe's training input pipeline on one CPU core: timm's per-image transform against the device pipeline
run on the CPU, side by side in one run, on photo-like JPEGs at ImageNet sizes.

    .venv/bin/python benchmarks/device_pipeline_cpu.py [--images 64] [--batch 32] [--rounds 3] [--memory]
        [--json out.json]

The images: crops of scikit-learn's two sample photos (load_sample_images: 427x640), resized to sizes around
ImageNet's typical 500x375 and saved as JPEG quality 90, held in memory as bytes (no disk in the timing).
- timm: per image, resmlp.data.images.decode_image (PIL) + the deit recipe's timm training transform
  (random-resized crop 224 bicubic, flip, RandAugment rand-m9-mstd0.5-inc1, ToTensor, Normalize, erasing 0.25),
  then the batch stacked: what a loader worker does.
- device (on the CPU): per image the header check a worker does (EncodedDataset), then per batch collation,
  decode_jpeg of the whole batch and DeviceAugment: what data.pipeline=device does on a CPU host.
- in-process: the same device-pipeline batch while a model step competes for the core is not measured here: one
  core, one thing at a time; images/s per core is the figure.
`--memory`: also each path's peak resident memory (a fresh process each, ru_maxrss), a worker's footprint, and
that of a process that only makes the photos ("none"), the part both share.
Rounds alternate timm, device, timm, device... and each figure is the median over rounds, so a load change
between the two hits both. torch runs one thread. Output: a host line (CPU, its kernels' capability, native bf16),
then images/s per core of each and the ratio, with the host (`host`: cpu_capability, native_bf16, precision: fp32,
the pipelines' own arithmetic; `amp_auto`: what `amp: auto` trains in on this host).

Both host types (issue 53): run it once on an AVX-512 host as it is, and once on an AVX2-only host; an AVX-512
host rehearses an AVX2 one with its kernels restricted (the figure is then the rehearsal's, and says so):

    ATEN_CPU_CAPABILITY=avx2 .venv/bin/python benchmarks/device_pipeline_cpu.py --images 64 --rounds 5
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from resmlp.data.device.augment import DeviceAugment
from resmlp.data.device.decode import EncodedDataset, collate_encoded
from resmlp.data.device.pipeline import DevicePipeline
from resmlp.data.images import decode_image
from resmlp.data.records import MapRecords
from resmlp.fileio import write_json
from resmlp.hostinfo import host_info, host_line
from resmlp.preprocess import Preprocess
from resmlp.runtime import precision_name, resolve_amp

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RECIPE = dict(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)


def photo_jpegs(count: int, seed: int = 0, size: tuple[int, int] = (500, 375)) -> list[bytes]:
    """`count` JPEGs (quality 90) of random crops of scikit-learn's sample photos, resized near `size` (w, h)."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        photo = photos[i % len(photos)]
        h, w = photo.shape[:2]
        ch, cw = int(rng.integers(h // 2, h)), int(rng.integers(w // 2, w))
        top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
        target = (int(size[0] * rng.uniform(0.85, 1.15)), int(size[1] * rng.uniform(0.85, 1.15)))
        crop = Image.fromarray(photo[top:top + ch, left:left + cw]).resize(target, Image.BICUBIC)
        buffer = io.BytesIO()
        crop.save(buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


class _Records(MapRecords):
    def __init__(self, payloads: list[bytes]) -> None:
        super().__init__(np.zeros(len(payloads), np.int64), ["photo"])
        self.payloads = payloads

    def payload(self, index: int) -> bytes:
        return self.payloads[index]


def timm_path(payloads: list[bytes], batch: int, img_size: int) -> float:
    """Seconds for timm's per-image decode + transform + stacking of every image."""
    transform = Preprocess(img_size, 3, MEAN, STD).train_transform(
        RECIPE["scale"], RECIPE["ratio"], RECIPE["hflip"], 0.0, RECIPE["auto_augment"], RECIPE["reprob"])
    start = time.perf_counter()
    for at in range(0, len(payloads), batch):
        torch.stack([transform(decode_image(p)) for p in payloads[at:at + batch]])
    return time.perf_counter() - start


def device_path(payloads: list[bytes], batch: int, img_size: int, epoch: int) -> float:
    """Seconds for the device pipeline on the CPU: header checks, collation, decode_jpeg, DeviceAugment."""
    dataset = EncodedDataset(_Records(payloads), 3)
    pipeline = DevicePipeline(DeviceAugment(img_size, 3, MEAN, STD, **RECIPE), dataset, 3)
    start = time.perf_counter()
    for at in range(0, len(payloads), batch):
        items = [dataset[(0, epoch, i, i)] for i in range(at, min(at + batch, len(payloads)))]
        pipeline(collate_encoded(items))
    return time.perf_counter() - start


def measure(images: int, batch: int, rounds: int, img_size: int = 224) -> dict:
    torch.set_num_threads(1)
    payloads = photo_jpegs(images)
    timm_s, device_s = [], []
    for r in range(rounds):
        timm_s.append(timm_path(payloads, batch, img_size))
        device_s.append(device_path(payloads, batch, img_size, r))
    timm_rate = images / statistics.median(timm_s)
    device_rate = images / statistics.median(device_s)
    return {"images": images, "batch": batch, "rounds": rounds, "img_size": img_size,
            "mean_jpeg_kb": round(sum(map(len, payloads)) / len(payloads) / 1024, 1),
            "timm_images_per_s_per_core": round(timm_rate, 1), "device_images_per_s_per_core": round(device_rate, 1),
            "device_over_timm": round(device_rate / timm_rate, 2), "load_average": _load(), **host_fields()}


def host_fields() -> dict:
    """The host beside the figure: its CPU kernels' capability (AVX2 under ATEN_CPU_CAPABILITY=avx2), native bf16,
    the precision measured (fp32: uint8 images to float32, no autocast) and what `amp: auto` trains in here."""
    return {"host": host_info("fp32"), "amp_auto": precision_name(resolve_amp("auto", torch.device("cpu"))),
            "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY")}


def peak_rss_mb(path: str, images: int, batch: int, img_size: int = 224) -> float:
    """Peak resident memory (MB) of a fresh process that imports this script, makes `images` photos and runs one
    `path` ("timm" or "device"; "none": only the photos, the baseline) over them: a loader worker's footprint,
    each in its own process so none inherits another's peak."""
    run = {"timm": f"b.timm_path(p, {batch}, {img_size})", "device": f"b.device_path(p, {batch}, {img_size}, 0)",
           "none": "None"}[path]
    code = (f"import resource, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import torch; "
            f"torch.set_num_threads(1); import device_pipeline_cpu as b; p = b.photo_jpegs({images}); {run}; "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(int(out.stdout.split()[-1]) / 1024, 1)  # ru_maxrss is in KiB on Linux


def _load() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--memory", action="store_true", help="also the peak memory of each path, in its own process")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(host_line(), flush=True)
    result = measure(args.images, args.batch, args.rounds, args.img_size)
    if args.memory:
        result["peak_rss_mb"] = {path: peak_rss_mb(path, args.images, args.batch, args.img_size)
                                 for path in ("none", "timm", "device")}
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()

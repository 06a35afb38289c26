"""DINO's multi-crop: the batched device path (resmlp.data.device.multi_crop) against DINO's PIL transform in
DataLoader workers (resmlp.train.dino.MultiCropTransform), on decoded images of ImageNet-like sizes.

    PYTHONPATH=src python benchmarks/dino_multi_crop.py --device cuda --batch 64 --workers 14 --json OUT.json \
        [--raw-json RAW.json]
    PYTHONPATH=src python benchmarks/dino_multi_crop.py --device cpu --tiny      # proves it runs (a test runs it)

Per batch of the device path: the aten ops dispatched (counted by a TorchDispatchMode: on a GPU each is at most
one kernel launch, views none), the host's time to issue them (no synchronisation: what the training process
spends per batch), and images/s with the device synchronised at the end. The PIL path: the same images as PIL
images in `--workers` loader workers, the views collated, images/s after the first batch (worker start-up out).
Decoding is out of both (decoded images in memory). On a CPU torch gets as many threads as the PIL path has
workers, so the two are compared on the same cores. With --raw-json (benchmarks/train_throughput.py's json of
the raw compiled step, e.g. gpu_report.py's trainer-vs-raw), the views/s each path makes are set against the
images/s the step takes: every view is a 224 px image to the step (local views are resized to the global size).
Defaults are dino-imagenet's: 224 px global views, 8 local views at 96 px.

    PYTHONPATH=src python benchmarks/dino_multi_crop.py --memory --batch 256     # no GPU needed (~10 GB RAM)

Per CPU core (issue 53, both host types): `--device cpu --workers 1` gives each path one core (torch one thread,
the PIL path one worker); on an AVX-512 host, `ATEN_CPU_CAPABILITY=avx2` rehearses an AVX2-only one:

    PYTHONPATH=src python benchmarks/dino_multi_crop.py --device cpu --workers 1 --batch 32 --rounds 5
    ATEN_CPU_CAPABILITY=avx2 PYTHONPATH=src python benchmarks/dino_multi_crop.py --device cpu --workers 1 \
        --batch 32 --rounds 5

The output starts with a host line (CPU, its kernels' capability, native bf16); the json's `host` has them with
the precision measured (fp32: no autocast in either path), `amp_auto` what `amp: auto` trains in on this device.

--memory: the peak of the tensors one batch holds at once (ImageNet-sized 500x375 images) in the GPU's form of
the pipeline (the batched resize: per_crop_on_cpu off), counted on CPU tensors: every tensor an op creates, from
its creation until it is freed; views and in-place results are not new memory. The caching allocator's rounding
and the input images themselves are not in it. (Fake CUDA tensors would need no compute, but the fake mode
keeps some alive longer: it counted 26 % more at batch 16.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import weakref
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, Dataset

from resmlp.data.device.multi_crop import MultiCropAugment
from resmlp.fileio import write_json
from resmlp.hostinfo import host_info, host_line
from resmlp.runtime import precision_name, resolve_amp
from resmlp.train.dino import MultiCropTransform

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class OpCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def photos(count: int, low: int, high: int, seed: int = 0) -> list[np.ndarray]:
    """Smooth random RGB images (H, W, 3) of sizes in [low, high]: coarse noise upsampled, photo-like spectra."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(low, high + 1, 2))
        coarse = Image.fromarray(rng.integers(0, 256, (max(h // 16, 2), max(w // 16, 2), 3), dtype=np.uint8))
        out.append(np.array(coarse.resize((w, h), Image.BICUBIC)))
    return out


class PilImages(Dataset):
    def __init__(self, images: list[np.ndarray], transform: MultiCropTransform) -> None:
        self.images, self.transform = images, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> list[torch.Tensor]:
        return self.transform(Image.fromarray(self.images[index]))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_path(images: list[np.ndarray], args, device: torch.device) -> dict[str, float]:
    aug = MultiCropAugment(args.img_size, 3, MEAN, STD, args.num_local, local_size=args.local_size)
    tensors = [torch.from_numpy(image).permute(2, 0, 1).contiguous().to(device) for image in images]
    batches = [tensors[i:i + args.batch] for i in range(0, len(tensors) - args.batch + 1, args.batch)]
    seeds = [list(range(i * args.batch, (i + 1) * args.batch)) for i in range(len(batches))]
    aug(batches[0], seeds[0])  # warm-up: kernels chosen, statistics moved to the device
    sync(device)
    with OpCount() as counter:
        aug(batches[0], seeds[0])
    host, start = [], time.perf_counter()
    for round_ in range(args.rounds):
        for batch, batch_seeds in zip(batches, seeds, strict=True):
            issued = time.perf_counter()
            aug(batch, [s + round_ * len(images) for s in batch_seeds])
            host.append(time.perf_counter() - issued)
    sync(device)
    seconds = time.perf_counter() - start
    count = args.rounds * len(batches) * args.batch
    return {"ops_per_batch": counter.count, "host_ms_per_batch": 1000 * statistics.median(host),
            "img_s": count / seconds, "views_s": count * (2 + args.num_local) / seconds}


def pil_path(images: list[np.ndarray], args) -> dict[str, float]:
    transform = MultiCropTransform(args.img_size, MEAN, STD, args.num_local, local_size=args.local_size)
    loader = DataLoader(PilImages(images * args.rounds, transform), batch_size=args.batch,
                        num_workers=args.workers, drop_last=True)
    count, start = 0, None
    for views in loader:
        if start is None:  # the first batch carries the workers' start-up
            start = time.perf_counter()
            continue
        count += len(views[0])
    seconds = time.perf_counter() - start if start is not None else float("nan")
    return {"workers": args.workers, "img_s": count / seconds if count else None,
            "views_s": count * (2 + args.num_local) / seconds if count else None}


def raw_step_img_s(path: Path | None) -> float | None:
    """The first variant's median images/s of a benchmarks/train_throughput.py json, if there is one."""
    if path is None or not path.is_file():
        return None
    results = json.loads(path.read_text()).get("results") or [{}]
    return next((v["median_img_s"] for v in results[0].get("variants", {}).values()), None)


class LiveBytes(TorchDispatchMode):
    """The bytes of the tensors created inside it that are still alive, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0

    def _free(self, size: int) -> None:
        self.live -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(a) for a in args if isinstance(a, torch.Tensor)}
        for tensor in out if isinstance(out, (list, tuple)) else [out]:
            if isinstance(tensor, torch.Tensor) and id(tensor) not in inputs and not tensor._is_view():
                size = tensor.numel() * tensor.element_size()
                self.live += size
                self.peak = max(self.peak, self.live)
                weakref.finalize(tensor, self._free, size)
        return out


def peak_memory(args) -> dict[str, float]:
    """--memory: the peak MiB one batch of 500x375 images holds in the GPU's form, and the views' own MiB."""
    pixels = [torch.zeros((3, 375, 500), dtype=torch.uint8) for _ in range(args.batch)]
    aug = MultiCropAugment(args.img_size, 3, MEAN, STD, args.num_local, local_size=args.local_size,
                           per_crop_on_cpu=False)
    with LiveBytes() as counter:
        views = aug(pixels, list(range(args.batch)))
    return {"batch": args.batch, "peak_mib": counter.peak / 2 ** 20,
            "views_mib": sum(v.numel() * v.element_size() for v in views) / 2 ** 20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=4, help="distinct batches of images in memory")
    parser.add_argument("--rounds", type=int, default=3, help="passes over them")
    parser.add_argument("--workers", type=int, default=8, help="loader workers of the PIL path")
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--local-size", type=int, default=96)
    parser.add_argument("--num-local", type=int, default=8)
    parser.add_argument("--sizes", type=int, nargs=2, default=(300, 500), help="image sides, low and high")
    parser.add_argument("--raw-json", type=Path, default=None, help="train_throughput.py json of the raw step")
    parser.add_argument("--tiny", action="store_true", help="a few small images: proves the script runs")
    parser.add_argument("--memory", action="store_true", help="only the peak GPU memory of a batch (fake CUDA)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.memory:
        result = peak_memory(args)
        print(json.dumps(result))
        if args.json:
            write_json(args.json, result)
        return
    if args.tiny:
        args.batch, args.batches, args.rounds, args.workers = 4, 2, 2, 1
        args.img_size, args.local_size, args.num_local, args.sizes = 32, 16, 2, (40, 60)
    device = torch.device(args.device)
    if device.type == "cpu":  # the same cores for both: torch's threads = the PIL path's workers
        torch.set_num_threads(max(args.workers, 1))
    print(host_line(), flush=True)
    images = photos(args.batch * args.batches, *args.sizes)
    ours, pil = device_path(images, args, device), pil_path(images, args)
    raw = raw_step_img_s(args.raw_json)
    result = {"host": host_info("fp32"), "amp_auto": precision_name(resolve_amp("auto", device)),
              "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"), "device": str(device),
              "batch": args.batch, "views": 2 + args.num_local,
              "img_size": args.img_size, "local_size": args.local_size, "device_path": ours, "pil_workers": pil,
              "device_over_pil": ours["img_s"] / pil["img_s"] if pil["img_s"] else None,
              "raw_step_img_s": raw,
              "device_views_over_raw_step": ours["views_s"] / raw if raw else None,
              "pil_views_over_raw_step": pil["views_s"] / raw if raw and pil["views_s"] else None}
    print(json.dumps(result, indent=1))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()

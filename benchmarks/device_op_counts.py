"""Ops dispatched per batch by each device augmentation path, at two batch sizes: whether they grow with the batch.

    .venv/bin/python benchmarks/device_op_counts.py [--batches 16 256] [--device cpu|fake-cuda] [--memory]
        [--json out.json]

On a GPU every aten op is a kernel launch costing the host ~5-20 us in eager mode, so a path whose op count grows
with the batch makes the card wait for Python. A TorchDispatchMode counts every aten op (views included) that one
batch dispatches, after one warm-up batch (which makes the per-device constants). The images: random uint8 images
of 48-96 px a side (each a different size; the count depends on the batch's ops, not on the pixels), cropped to
32 px. Counted: the batch ops (DeviceAugment(batched=True), what a GPU runs; on CPU tensors DeviceAugment's
default takes faster per-image forms of three steps, docs/training.md). Counts are deterministic (the same seeds).
`--device fake-cuda` runs the same code on fake CUDA tensors (tests/fakecuda.py: shapes without data), as a GPU
would dispatch it.

`--memory`: the deit batch ops' peak memory at batch 256 of ImageNet-sized images, counted on fake CUDA tensors
(PeakBytes: every storage an op makes, from then until it is freed).

PATHS maps each path's name to a builder: (batch size, device) -> a function that runs one batch. Add a path there.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from timm.data import Mixup
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from resmlp.analysis.op_counts import OpCounter
from resmlp.data.device.augment import DeviceAugment
from resmlp.data.device.multi_crop import MultiCropAugment
from resmlp.fileio import write_json

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# the deit recipe's device augmentation (resmlp/configs: deit): RandAugment rand-m9-mstd0.5-inc1, erasing 0.25
DEIT = dict(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)
# the paper's Mixup 0.8 / CutMix 1.0 (DeiT's recipe), applied by the loss (resmlp.train.losses) to the batch
MIXUP = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
IMG_SIZE = 32


class PeakBytes(TorchDispatchMode):
    """The most bytes of tensor storage that ops made inside it held at once (each storage counted from the op
    that made it until it is freed): a device's peak above what the inputs already hold. Works on fake tensors
    (no data, real sizes), so a GPU batch's memory is computed without a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage()._cdata not in self.live:
                key = tensor.untyped_storage()._cdata
                self.live[key] = tensor.untyped_storage().nbytes()
                self.now += self.live[key]
                self.peak = max(self.peak, self.now)
                weakref.finalize(tensor.untyped_storage(), self._free, key)
        return out

    def _free(self, key: int) -> None:
        self.now -= self.live.pop(key, 0)


def imagenet_peak_mb(batch: int = 256, img_size: int = 224, seed: int = 0) -> dict[str, float]:
    """The deit batch ops on fake CUDA (run from the repository root): `batch` decoded images of 333-500 px a
    side (ImageNet's typical sizes), the MB they hold and the peak MB DeviceAugment adds while cropping them
    to img_size, RandAugment and erasing them."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(333, 501, (batch, 2))
    with on("fake-cuda") as device:
        pixels = [torch.empty((3, int(h), int(w)), dtype=torch.uint8, device=device) for h, w in sizes]
        augment = DeviceAugment(img_size, 3, MEAN, STD, batched=True, **DEIT)
        augment(pixels[:2], [0, 1])
        with PeakBytes() as peak:
            augment(pixels, list(range(batch)))
    return {"decoded_images_mb": round(int((3 * sizes.prod(1)).sum()) / 2 ** 20),
            "augment_peak_mb": round(peak.peak / 2 ** 20)}


def images(batch: int, device: str, seed: int = 0) -> list[torch.Tensor]:
    """`batch` uint8 RGB images of 48-96 px a side, each its own size, on `device`."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(48, 97, (batch, 2))
    return [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)).to(device) for h, w in sizes]


def deit(batch: int, device: str) -> Callable[[], object]:
    """The deit recipe's DeviceAugment on one batch of decoded images."""
    augment = DeviceAugment(IMG_SIZE, 3, MEAN, STD, batched=True, **DEIT)
    pixels, seeds = images(batch, device), list(range(batch))
    return lambda: augment(pixels, seeds)


def deit_mixup(batch: int, device: str) -> Callable[[], object]:
    """The deit path and then timm's Mixup/CutMix (batch mode, as resmlp.train.losses runs it)."""
    augment, mixup = DeviceAugment(IMG_SIZE, 3, MEAN, STD, batched=True, **DEIT), Mixup(**MIXUP)
    pixels, seeds = images(batch, device), list(range(batch))
    targets = torch.arange(batch, device=device) % MIXUP["num_classes"]
    return lambda: mixup(augment(pixels, seeds), targets)


def dino(batch: int, device: str) -> Callable[[], object]:
    """DINO's multi-crop as batch ops (resmlp.data.device.multi_crop): 2 global views at IMG_SIZE and 10 local
    ones at half of it, the 12 views of issue 47; the batched resize also on CPU tensors (as on a GPU)."""
    augment = MultiCropAugment(IMG_SIZE, 3, MEAN, STD, num_local=10, local_size=IMG_SIZE // 2,
                               per_crop_on_cpu=False)
    pixels, seeds = images(batch, device), list(range(batch))
    return lambda: augment(pixels, seeds)


PATHS: dict[str, Callable[[int, str], Callable[[], object]]] = {"deit": deit, "deit + mixup/cutmix": deit_mixup,
                                                                "dino multi-crop (12 views)": dino}


def count(path: str, batch: int, device: str = "cpu") -> Counter:
    """The ops one batch of `path` dispatches (after one warm-up batch)."""
    run = PATHS[path](batch, device)
    run()
    with OpCounter() as counter:
        run()
    return counter.ops


def counts(batches: list[int], device: str) -> dict[str, dict[int, int]]:
    return {path: {batch: sum(count(path, batch, device).values()) for batch in batches} for path in PATHS}


@contextlib.contextmanager
def on(device: str):
    """Nothing for the CPU; tests/fakecuda.py's fake CUDA for fake-cuda (run from the repository root)."""
    if device == "cpu":
        yield "cpu"
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from fakecuda import fake_cuda

    with fake_cuda():
        yield "cuda"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--device", choices=("cpu", "fake-cuda"), default="cpu")
    parser.add_argument("--memory", action="store_true",
                        help="also the deit batch ops' peak memory at batch 256 of ImageNet-sized images")
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    with on(args.device) as device:
        result = counts(args.batches, device)
    print(f"aten ops per batch ({args.device}; images 48-96 px, crops {IMG_SIZE} px)")
    for path, by_batch in result.items():
        row = ", ".join(f"{n} at {batch}" for batch, n in by_batch.items())
        growth = by_batch[max(by_batch)] / by_batch[min(by_batch)]
        print(f"  {path}: {row} (growth {growth:.2f}x)")
    memory = imagenet_peak_mb() if args.memory else None
    if memory:
        print(f"deit batch ops, 256 images of 333-500 px to 224 px: the images {memory['decoded_images_mb']} MB, "
              f"the augmentation's peak {memory['augment_peak_mb']} MB above them (fake CUDA, counted)")
    if args.json:
        write_json(args.json, {"device": args.device, "counts": result, "memory": memory})


if __name__ == "__main__":
    main()

"""Ops dispatched per batch by each device augmentation path, at two batch sizes: whether they grow with the batch.

    .venv/bin/python benchmarks/device_op_counts.py [--batches 16 256] [--device cpu|fake-cuda] [--json out.json]

On a GPU every aten op is a kernel launch costing the host ~5-20 us in eager mode, so a path whose op count grows
with the batch makes the card wait for Python. A TorchDispatchMode counts every aten op (views included) that one
batch dispatches, after one warm-up batch (which makes the per-device constants). The images: random uint8 images
of 48-96 px a side (each a different size; the count depends on the batch's ops, not on the pixels), cropped to
32 px. Counts are deterministic (the same seeds every run). `--device fake-cuda` runs the same code on fake CUDA
tensors (tests/fakecuda.py: shapes without data), as a GPU would dispatch it.

PATHS maps each path's name to a builder: (batch size, device) -> a function that runs one batch. Add a path there.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from timm.data import Mixup
from torch.utils._python_dispatch import TorchDispatchMode

from resmlp.data.device.augment import DeviceAugment
from resmlp.data.device.multi_crop import MultiCropAugment
from resmlp.fileio import write_json

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# the deit recipe's device augmentation (resmlp/configs: deit): RandAugment rand-m9-mstd0.5-inc1, erasing 0.25
DEIT = dict(scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.5, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.25)
# the paper's Mixup 0.8 / CutMix 1.0 (DeiT's recipe), applied by the loss (resmlp.train.losses) to the batch
MIXUP = dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=10)
IMG_SIZE = 32


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched inside it, by name; not prim ops (prim.device: a metadata query that fake
    tensors route through the dispatcher and real ones answer from the tensor, never a kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "prim":
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def images(batch: int, device: str, seed: int = 0) -> list[torch.Tensor]:
    """`batch` uint8 RGB images of 48-96 px a side, each its own size, on `device`."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(48, 97, (batch, 2))
    return [torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)).to(device) for h, w in sizes]


def deit(batch: int, device: str) -> Callable[[], object]:
    """The deit recipe's DeviceAugment on one batch of decoded images."""
    augment = DeviceAugment(IMG_SIZE, 3, MEAN, STD, **DEIT)
    pixels, seeds = images(batch, device), list(range(batch))
    return lambda: augment(pixels, seeds)


def deit_mixup(batch: int, device: str) -> Callable[[], object]:
    """The deit path and then timm's Mixup/CutMix (batch mode, as resmlp.train.losses runs it)."""
    augment, mixup = DeviceAugment(IMG_SIZE, 3, MEAN, STD, **DEIT), Mixup(**MIXUP)
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
    parser.add_argument("--json", help="also write the counts here")
    args = parser.parse_args()
    with on(args.device) as device:
        result = counts(args.batches, device)
    print(f"aten ops per batch ({args.device}; images 48-96 px, crops {IMG_SIZE} px)")
    for path, by_batch in result.items():
        row = ", ".join(f"{n} at {batch}" for batch, n in by_batch.items())
        growth = by_batch[max(by_batch)] / by_batch[min(by_batch)]
        print(f"  {path}: {row} (growth {growth:.2f}x)")
    if args.json:
        write_json(args.json, {"device": args.device, "counts": result})


if __name__ == "__main__":
    main()

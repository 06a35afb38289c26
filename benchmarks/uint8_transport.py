"""The timm path's transport, per core: float32 out of the workers (before), uint8 out of the workers finished on
the device (resmlp.data.loading.finish, now), and timm's own prefetcher loader (create_loader(use_prefetcher=True)),
side by side on the same JPEG folder with the recipe's augmentation (RandAugment rand-m9-mstd0.5-inc1, bicubic
random-resized crop, flip, erasing 0.25; the deit recipe's values, configs/deit.yaml).

    .venv/bin/python benchmarks/uint8_transport.py --make-folder DIR --images 512   # random JPEGs, 10 classes
    .venv/bin/python benchmarks/uint8_transport.py --folder DIR [--device cuda] [--batch 64] [--batches 8]
        [--img-size 224] [--json out.json]

Each loader runs in this process (num_workers=0) on one thread, so images/s is what one worker core delivers,
the finishing (normalise, erase) on --device included. Bytes per image is what crosses the worker queue, pinned
memory and the host-to-device copy: deterministic, the only number here that is final on a loaded host.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from timm.data import create_dataset, create_loader
from torch.utils.data import DataLoader

from resmlp.data.loading.finish import DeviceFinish
from resmlp.data.loading.samplers import ResumableSampler, SeededDataset, collate_skipping
from resmlp.data.per_image.decoded import DecodedDataset
from resmlp.data.per_image.folder import class_folder_records
from resmlp.fileio import write_json
from resmlp.preprocess import Preprocess, _with_zero_bit_posterize

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's, as timm's IMAGENET_DEFAULT_MEAN/STD
RECIPE = {"auto_augment": "rand-m9-mstd0.5-inc1", "reprob": 0.25}  # configs/deit.yaml (DeiT's main.py defaults)


def make_folder(root: Path, images: int, size: tuple[int, int] = (375, 500)) -> None:
    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / f"class{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)


def _timed(batches: Iterable, finish: Callable, count: int, device: torch.device) -> dict:
    """Images per second and bytes per image sent over `count` batches (after one warm-up batch)."""
    iterator, images, sent, start = iter(batches), 0, 0, 0.0
    for step in range(count + 1):
        if step == 1:
            images, sent, start = 0, 0, time.perf_counter()
        batch = next(iterator)
        sent += batch[0].element_size() * batch[0].numel()
        out = finish(batch[0].to(device, non_blocking=True))
        images += len(out)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    return {"images_per_s": images / seconds, "bytes_per_image": sent / images}


def ours(folder: Path, img_size: int, batch: int, uint8: bool) -> tuple[DataLoader, Callable]:
    pre = Preprocess(img_size, 3, MEAN, STD, 1.0, "bicubic")
    transform = pre.train_transform(auto_augment=RECIPE["auto_augment"], reprob=RECIPE["reprob"], uint8=uint8)
    dataset = DecodedDataset(class_folder_records(folder), 3, transform)
    loader = DataLoader(SeededDataset(dataset), batch_size=batch, sampler=ResumableSampler(dataset, 0),
                        collate_fn=collate_skipping, drop_last=True)
    return loader, DeviceFinish(MEAN, STD, RECIPE["reprob"]) if uint8 else (lambda images: images)


def timm_prefetcher(folder: Path, img_size: int, batch: int, device: torch.device) -> DataLoader:
    dataset = create_dataset("", root=str(folder), split="", is_training=True)
    loader = create_loader(dataset, (3, img_size, img_size), batch, is_training=True, use_prefetcher=True,
                           auto_augment=RECIPE["auto_augment"], re_prob=RECIPE["reprob"], re_mode="pixel",
                           interpolation="bicubic", mean=MEAN, std=STD, num_workers=0, device=device,
                           pin_memory=device.type == "cuda")
    # timm's posterize asks Pillow 13 for 0 bits now and then, which Pillow refuses: resmlp's op, as in ours
    dataset.transform = _with_zero_bit_posterize(dataset.transform)
    return loader


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--make-folder", type=Path)
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.make_folder:
        make_folder(args.make_folder, args.images)
        return
    torch.set_num_threads(1)  # one core: the per-worker cost
    device = torch.device(args.device)
    results = {}
    for name, uint8 in (("float32 from the workers", False), ("uint8 from the workers", True)):
        loader, finish = ours(args.folder, args.img_size, args.batch, uint8)
        results[name] = _timed(loader, finish, args.batches, device)
    prefetcher = timm_prefetcher(args.folder, args.img_size, args.batch, device)
    results["timm prefetcher loader"] = _timed(prefetcher, lambda images: images, args.batches, device)
    sent = next(iter(prefetcher.loader))[0]  # what its workers send (the prefetcher hands out float32)
    results["timm prefetcher loader"]["bytes_per_image"] = sent.element_size() * sent[0].numel()
    report = {"device": str(device), "batch": args.batch, "img_size": args.img_size, "results": results}
    print(json.dumps(report, indent=2))
    if args.json:
        write_json(args.json, report)


if __name__ == "__main__":
    main()

"""data.pipeline: device -- encoded batches decoded and augmented where the model runs (docs/training.md).

`DevicePipeline` turns the workers' EncodedBatch (resmlp.data.device.decode) into the trainer's (images, targets,
skipped): decode_batch on the device, then DeviceAugment (timm's training transform as a batch op), counting
how each image was decoded for summary.json.

Where it runs: on a GPU, in the training process (the GPU decodes and augments; the workers only read files).
On a CPU host the "device" is the CPU the model also runs on: there the same code runs inside the DataLoader
workers' collate, so decoding and augmentation overlap the model's step on other cores as timm's transform
does; in the training process they would add to every step. benchmarks/device_pipeline_cpu.py measures both
places (images/s per core, side by side); with no workers (data.num_workers 0) it runs in the training process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from resmlp.data.device.augment import DeviceAugment
from resmlp.data.device.decode import (
    DEVICE_BATCH_PIXELS,
    EncodedBatch,
    EncodedDataset,
    EncodedStream,
    collate_encoded,
    decode_batch,
)
from resmlp.runtime import copy_to, worker_ignores_stop_signals

PIPELINES = ("auto", "device", "timm")  # data.pipeline's values (auto: resmlp.data.loading.choice)


class DevicePipeline:
    """EncodedBatch -> (normalised augmented images, targets, skipped) on `device`; `counts` says how images
    were decoded: on the device (decode_jpeg) or by PIL (the fallback)."""

    def __init__(self, augment: DeviceAugment, dataset: EncodedDataset | EncodedStream, in_chans: int,
                 device: torch.device | str = "cpu") -> None:
        self.augment, self.dataset, self.in_chans, self.device = augment, dataset, in_chans, torch.device(device)
        self.counts: Counter = Counter(decoded_on_device=0, pil_fallback=0)

    def loader(self, sampler, batch_size: int, num_workers: int, device: torch.device) -> DataLoader:
        """The DataLoader of the pipeline for a model on `device`: workers read (and, on a CPU host, decode and
        augment: in_workers); the last partial batch dropped, as on the timm path."""
        self.device = device
        # each image's share of the pixels a batch may decode on the device (issue 48: 256 huge headers asked
        # ~60 GB); larger JPEGs are decoded by the workers at a reduced DCT scale (resmlp.data.device.decode)
        self.dataset.share = DEVICE_BATCH_PIXELS // batch_size
        collate = self.collate if in_workers(device, num_workers) else collate_encoded
        if isinstance(self.dataset, EncodedStream):  # it orders itself; fresh workers read each epoch's plan
            return DataLoader(self.dataset, batch_size=batch_size, num_workers=num_workers, collate_fn=collate,
                              drop_last=True, pin_memory=device.type == "cuda",
                              worker_init_fn=worker_ignores_stop_signals)
        return DataLoader(self.dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                          collate_fn=collate, drop_last=True, pin_memory=device.type == "cuda",
                          persistent_workers=num_workers > 0, worker_init_fn=worker_ignores_stop_signals)

    def __call__(self, batch: EncodedBatch) -> tuple[torch.Tensor, torch.Tensor, int, Counter]:
        images, kept, fallbacks = decode_batch(batch, self.device, self.in_chans)
        jpegs = sum(length >= 0 for length in batch.lengths)
        lost = len(batch.lengths) - len(kept)
        counts = Counter(decoded_on_device=jpegs - fallbacks - lost,
                         pil_fallback=len(batch.lengths) - jpegs + fallbacks)
        # the labels came pinned with the batch; a batch that lost an image sends a new (pinned) copy
        labels = (batch.labels.to(self.device, non_blocking=True) if not lost
                  else copy_to(batch.labels[kept], self.device))
        x = self.augment(images, [batch.seeds[i] for i in kept])
        return x, labels, batch.skipped + lost, counts

    def collate(self, items: list) -> tuple[torch.Tensor, torch.Tensor, int, Counter]:
        """The DataLoader collate of the in-worker placement (CPU hosts): read, decode and augment."""
        return self(collate_encoded(items))

    def batches(self, loader: Iterable) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
        """(images, targets, skipped) of a loader of EncodedBatch (or of in-worker results), counting."""
        for item in loader:
            x, targets, skipped, counts = self(item) if isinstance(item, EncodedBatch) else item
            self.counts.update(counts)
            yield x, targets, skipped

    def summary(self) -> dict[str, int | str]:
        return {"name": "device", **self.counts}


def in_workers(device: torch.device, num_workers: int) -> bool:
    """Whether decoding and augmentation run in the loader workers (a CPU model with workers; module doc)."""
    return device.type == "cpu" and num_workers > 0



def device_refusal(d: Any) -> str | None:
    """Why the device path can't run a data section's training ops (None: it can): data.pipeline=device is
    refused with it, auto takes timm's path."""
    if d.color_jitter > 0 and not d.auto_augment:  # timm turns colour jitter off under RandAugment
        return (f"data.pipeline=device does not run data.color_jitter={d.color_jitter}; set data.pipeline=timm "
                "(timm's per-image transform) or auto")
    if (getattr(d, "remode", "pixel"), getattr(d, "recount", 1)) != ("pixel", 1):
        return (f"data.pipeline=device erases one box of pixel noise, not data.remode={d.remode} / data.recount="
                f"{d.recount}; set data.pipeline=timm (timm's per-image transform) or auto")
    if d.auto_augment:
        from resmlp.data.device.rand_augment import parse_rand_augment

        try:
            parse_rand_augment(d.auto_augment)
        except ValueError as e:
            return f"data.auto_augment: {e}"
    return None

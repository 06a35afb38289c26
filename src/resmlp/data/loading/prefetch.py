"""Batches on their way to the device while the current step runs.

A DataLoader with pinned memory hands over batches in page-locked host memory; `DevicePrefetcher` starts the
copy of the next batch on a side CUDA stream as soon as the current one is handed out, so the copy overlaps the
step. On the CPU (or a batch already on the device) it only moves tensors, in order. torch's DataLoader pins but
does not copy ahead to the device, and timm's PrefetchLoader also normalises and erases (our datasets do
that already), hence this small class.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from resmlp.runtime import to_device


class DevicePrefetcher:
    """(images, targets, skipped) batches of `batches`, on `device`, the next one copied ahead on CUDA."""

    def __init__(self, batches: Iterable[tuple[Any, torch.Tensor, int]], device: torch.device,
                 channels_last: bool = False) -> None:
        self.batches, self.device, self.channels_last = iter(batches), device, channels_last
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.ahead = self._copy_next() if self.stream is not None else None

    def _move(self, batch: tuple[Any, torch.Tensor, int]) -> tuple[Any, torch.Tensor, int]:
        images, targets, skipped = batch
        return to_device(images, self.device, self.channels_last), targets.to(self.device, non_blocking=True), skipped

    def _copy_next(self) -> tuple[Any, torch.Tensor, int] | None:
        try:
            batch = next(self.batches)
        except StopIteration:
            return None
        with torch.cuda.stream(self.stream):
            return self._move(batch)

    def __iter__(self) -> Iterator[tuple[Any, torch.Tensor, int]]:
        return self

    def __next__(self) -> tuple[Any, torch.Tensor, int]:
        if self.stream is None:
            return self._move(next(self.batches))
        batch = self.ahead
        if batch is None:
            raise StopIteration
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)  # the copy is done before the step reads it
        for tensor in _tensors(batch):
            tensor.record_stream(current)  # its memory is not reused while the step may still read it
        self.ahead = self._copy_next()
        return batch


def _tensors(batch: tuple[Any, torch.Tensor, int]) -> list[torch.Tensor]:
    images, targets, _ = batch
    return [*(images if isinstance(images, (list, tuple)) else [images]), targets]

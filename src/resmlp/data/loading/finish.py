"""The per-image path's last steps, where the model runs: uint8 batches normalised and randomly erased.

The workers send uint8 images (timm's `create_transform(..., use_prefetcher=True)`: a quarter of float32's bytes
through the worker queues, pinned memory and the host-to-device copy) and the training process finishes them as
timm's PrefetchLoader does: (x - 255 mean) / (255 std) in float32, then timm's RandomErasing on the device.
PrefetchLoader itself is not used: it owns the iteration and the side-stream copy, which DevicePrefetcher does
for every data path (with the skipped-image counts timm's loader does not carry).

Erasing draws from the global RNGs (Python's `random` for the boxes, the device's generator for the noise), as
timm's does. The trainer seeds them per step (resmlp.train.state.seed_step) before it asks for the step's batch,
so a resumed run erases the same images the same way; the crop, flip and RandAugment stay in the workers,
seeded by each sample's key.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from timm.data.random_erasing import RandomErasing


class DeviceFinish:
    """uint8 (B, C, H, W) batches -> normalised float32, erased with probability `reprob` per image (timm's
    RandomErasing with the per-image transform's settings: mode `remode`, at most `recount` boxes)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], reprob: float, remode: str = "pixel",
                 recount: int = 1) -> None:
        self.mean, self.std, self.reprob = tuple(mean), tuple(std), reprob
        self.remode, self.recount = remode, recount
        self._constants: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = self._on(images.device)
        finished = images.float().sub_(mean).div_(std)
        if self.reprob > 0:
            RandomErasing(self.reprob, mode=self.remode, max_count=self.recount, device=images.device)(finished)
        return finished

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """255 mean and 255 std on `device`, copied there in one copy, once (not per batch)."""
        if device not in self._constants:
            both = torch.tensor([[255 * m for m in self.mean], [255 * s for s in self.std]], device=device)
            shape = (1, len(self.mean), 1, 1)
            self._constants[device] = (both[0].view(shape), both[1].view(shape))
        return self._constants[device]

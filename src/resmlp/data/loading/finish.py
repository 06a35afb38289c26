"""The per-image path's last steps, where the model runs: uint8 batches normalised and randomly erased.

The workers send uint8 images (timm's `create_transform(..., use_prefetcher=True)`: a quarter of float32's bytes
through the worker queues, pinned memory and the host-to-device copy) and the training process finishes them as
timm's PrefetchLoader does: (x - 255 mean) / (255 std) in float32, then timm's RandomErasing on the device.
PrefetchLoader itself is not used: it owns the iteration and the side-stream copy, which DevicePrefetcher does
for every data path (with the skipped-image counts timm's loader does not carry).

Erasing draws from the global RNGs (Python's `random` for the boxes, the device's generator for the noise), as
timm's does. The trainer seeds them per step (resmlp.train.state.seed_step) before it asks for the step's batch,
so a resumed run erases the same images the same way; the crop, flip and RandAugment stay in the workers,
seeded by each sample's key. timm's RandomErasing is a loop over the batch's images with a noise draw and a
write per box: on a GPU its kernel launches grow with the batch. `erase_boxes` draws the boxes as timm's `_erase`
does (the same `random` calls in the same order, on the host) and `paint_boxes` writes them all in a dozen ops
with one upload of the boxes, whatever the batch (ours because timm has no batched form).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import torch

from resmlp.runtime import copy_to

ERASE_AREA, ERASE_ASPECT = (0.02, 1 / 3), (0.3, 1 / 0.3)  # timm RandomErasing's defaults (min/max area, aspect)


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
            n, _, h, w = finished.shape
            boxes = erase_boxes(n, h, w, self.reprob, self.recount)
            if boxes:  # known on the host: no erasing, no op
                finished = paint_boxes(finished, copy_to(torch.tensor(boxes), finished.device), self.remode)
        return finished

    def _on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """255 mean and 255 std on `device`, copied there in one copy, once (not per batch)."""
        if device not in self._constants:
            both = torch.tensor([[255 * m for m in self.mean], [255 * s for s in self.std]], device=device)
            shape = (1, len(self.mean), 1, 1)
            self._constants[device] = (both[0].view(shape), both[1].view(shape))
        return self._constants[device]


def erase_boxes(count: int, h: int, w: int, probability: float, max_count: int) -> list[tuple[int, int, int, int, int]]:
    """(image, top, left, height, width) of every box timm's RandomErasing(probability, max_count=max_count) would
    erase in a batch of `count` (h x w) images, drawn with Python's `random` exactly as its `_erase` draws them."""
    boxes = []
    log_aspect = (math.log(ERASE_ASPECT[0]), math.log(ERASE_ASPECT[1]))
    for image in range(count):
        if random.random() > probability:
            continue
        boxes_here = 1 if max_count == 1 else random.randint(1, max_count)
        for _ in range(boxes_here):
            for _attempt in range(10):
                target = random.uniform(*ERASE_AREA) * h * w / boxes_here
                aspect = math.exp(random.uniform(*log_aspect))
                bh, bw = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
                if bw < w and bh < h:
                    boxes.append((image, random.randint(0, h - bh), random.randint(0, w - bw), bh, bw))
                    break
    return boxes


def paint_boxes(x: torch.Tensor, boxes: torch.Tensor, mode: str) -> torch.Tensor:
    """x (N, C, H, W) with each box of `boxes` ((K, 5) on x's device: image, top, left, height, width) filled as
    timm's modes fill it: `pixel` per-pixel normal noise, `rand` one normal colour per box, `const` zeros; where
    boxes of one image overlap, the later box's fill wins, as timm's writes in order do."""
    n, c, h, w = x.shape
    image, top, left, height, width = boxes.unbind(1)
    rows = torch.arange(h, device=x.device)
    cols = torch.arange(w, device=x.device)
    inside = (((rows >= top[:, None]) & (rows < (top + height)[:, None]))[:, :, None]
              & ((cols >= left[:, None]) & (cols < (left + width)[:, None]))[:, None, :])  # (K, H, W)
    order = torch.arange(1, len(boxes) + 1, device=x.device).view(-1, 1, 1)
    last = torch.zeros(n, h, w, dtype=torch.long, device=x.device).scatter_reduce_(
        0, image.view(-1, 1, 1).expand(-1, h, w), inside * order, "amax")  # 1 + the last box covering a pixel, or 0
    if mode == "pixel":
        fill = torch.randn_like(x)
    else:
        colours = torch.randn(len(boxes), c, device=x.device, dtype=x.dtype) if mode == "rand" else \
            torch.zeros(len(boxes), c, device=x.device, dtype=x.dtype)
        table = torch.cat([colours.new_zeros(1, c), colours])  # row 0: no box
        fill = table[last].permute(0, 3, 1, 2)
    return torch.where((last > 0).unsqueeze(1), fill, x)

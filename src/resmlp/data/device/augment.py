"""The recipe's training augmentation on whole batches, where the images are: timm's transform as a batch op.

timm's training transform (create_transform, is_training=True) is, per PIL image: RandomResizedCropAndInterpolation
(antialiased resize), RandomHorizontalFlip, RandAugment, ToTensor, Normalize, RandomErasing. `DeviceAugment` does
the same to a batch of decoded uint8 images of any sizes on their device (a GPU, or the CPU), with no PIL and no
loader worker:
- the crop box, flip, RandAugment ops and erased box of every image are drawn on the CPU from the image's own
  uniforms (`uniforms`, from its sampler key), with timm's rules (the box: timm's get_params; the ops:
  resmlp.data.device.rand_augment; the erased box: timm's RandomErasing._erase, count 1, pixel noise);
- those few numbers go to the device in one page-locked copy per batch;
- each image is cropped and resized by F.interpolate(antialias=True) (torch's antialiased kernels were made to
  match PIL's resize), rounded to whole values as PIL's uint8 output is; the rest runs on the whole batch.
Erasing noise is drawn on the device by a generator seeded with the image's seed: it does not depend on the
batch, and only the erased box's pixels are drawn (CPU and CUDA generators differ, so a CPU image's noise is not
a GPU image's, as with timm's own erasing on either).

Every image's numbers come from its sampler key, as in resmlp.data.device.batch_augment, so an image gets the same
augmentation whatever its batch, device, number of processes or restart (equal on the CPU, within float
rounding of the kernels on a GPU, erasing noise aside).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from resmlp.data.device import rand_augment as ra
from resmlp.runtime import copy_to

ATTEMPTS = 10  # timm's RandomResizedCrop and RandomErasing both try 10 boxes
CROP_UNIFORMS = 2 * ATTEMPTS + 3  # areas, aspect ratios, top, left, flip
ERASE_UNIFORMS = 1 + 2 * ATTEMPTS + 2  # apply, areas, aspect ratios, top, left
ERASE_AREA = (0.02, 1 / 3)  # timm's RandomErasing defaults (min_area, max_area, min_aspect 0.3)
ERASE_LOG_ASPECT = (math.log(0.3), math.log(1 / 0.3))
RESIZE_MODES = ("bicubic", "bilinear", "nearest")


def uniforms(seeds: Sequence[int], count: int, stream: int = 0) -> np.ndarray:
    """(N, count) uniforms in [0, 1), a pure function of each seed (splitmix64 over (seed, stream, i)):
    vectorised, so a batch's numbers cost microseconds, and the same for an image in any batch."""
    base = np.asarray(seeds, dtype=np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15)
    counter = (np.arange(count, dtype=np.uint64) + np.uint64(stream * 1_000_003 + 1)) * np.uint64(0xD1B54A32D192ED03)
    z = base + counter[None]
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def crop_boxes(u: np.ndarray, heights: np.ndarray, widths: np.ndarray, scale: Sequence[float],
               ratio: Sequence[float]) -> np.ndarray:
    """timm's RandomResizedCropAndInterpolation.get_params for images of any sizes: (N, 4) top, left, h, w,
    from uniforms u[:, :2 * ATTEMPTS + 2]: the first of 10 (area, log-uniform aspect) tries that fits, else the
    centred whole image narrowed to the allowed aspect ratio."""
    area = (heights * widths)[:, None] * (scale[0] + (scale[1] - scale[0]) * u[:, :ATTEMPTS])
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    aspect = np.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u[:, ATTEMPTS:2 * ATTEMPTS])
    w_try, h_try = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    fits = (w_try <= widths[:, None]) & (h_try <= heights[:, None])
    first = fits.argmax(1)
    rows = np.arange(len(u))
    found = fits.any(1)
    in_ratio = widths / heights
    fall_w = np.where(in_ratio > max(ratio), np.round(heights * max(ratio)), widths)
    fall_h = np.where(in_ratio < min(ratio), np.round(widths / min(ratio)), heights)
    w = np.where(found, w_try[rows, first], fall_w)
    h = np.where(found, h_try[rows, first], fall_h)
    top = np.where(found, np.floor(u[:, 2 * ATTEMPTS] * (heights - h + 1)), (heights - h) // 2)
    left = np.where(found, np.floor(u[:, 2 * ATTEMPTS + 1] * (widths - w + 1)), (widths - w) // 2)
    return np.stack([top, left, h, w], 1).astype(np.int64)


def erase_boxes(u: np.ndarray, size: int, probability: float) -> np.ndarray:
    """timm's RandomErasing._erase (count 1) boxes for (size x size) images: (N, 4) top, left, h, w; h = 0 where
    the image is not erased (not drawn, or no try fitted)."""
    skip = u[:, 0] > probability
    area = size * size * (ERASE_AREA[0] + (ERASE_AREA[1] - ERASE_AREA[0]) * u[:, 1:1 + ATTEMPTS])
    aspect = np.exp(ERASE_LOG_ASPECT[0] + (ERASE_LOG_ASPECT[1] - ERASE_LOG_ASPECT[0])
                    * u[:, 1 + ATTEMPTS:1 + 2 * ATTEMPTS])
    h_try, w_try = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))
    fits = (w_try < size) & (h_try < size)
    rows, first = np.arange(len(u)), fits.argmax(1)
    keep = fits.any(1) & ~skip
    h = np.where(keep, h_try[rows, first], 0)
    w = np.where(keep, w_try[rows, first], 0)
    top = np.floor(u[:, -2] * (size - h + 1))
    left = np.floor(u[:, -1] * (size - w + 1))
    return np.stack([top, left, h, w], 1).astype(np.int64)


class DeviceAugment:
    """Decoded uint8 images (a list of (C, H, W) tensors, or an (N, H, W[, C]) batch) + one seed per image ->
    normalised float (N, in_chans, S, S) on the images' device: timm's training transform (module doc), then
    `after`."""

    def __init__(self, img_size: int, in_chans: int, mean: Sequence[float], std: Sequence[float],
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3), hflip: float = 0.5,
                 auto_augment: str | None = None, reprob: float = 0.0, interpolation: str = "bicubic",
                 after: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        if interpolation not in RESIZE_MODES:
            raise ValueError(f"the device pipeline resizes with {', '.join(RESIZE_MODES)}, not {interpolation!r}")
        self.img_size, self.in_chans, self.interpolation = img_size, in_chans, interpolation
        self.scale, self.ratio, self.hflip, self.reprob = tuple(scale), tuple(ratio), hflip, reprob
        self.after = after  # e.g. the run's fixed pixel permutation, on the normalised batch
        self.spec = ra.parse_rand_augment(auto_augment) if auto_augment else None
        # timm's create_transform hands RandAugment the run's interpolation (aa_params['interpolation'])
        self.resample = (interpolation,)
        self.stats = torch.tensor([list(mean), list(std)], dtype=torch.float32).view(2, 1, -1, 1, 1)
        self.fill = torch.tensor(ra.fill_colour(tuple(mean)), dtype=torch.float32)
        layers = self.spec.num_layers if self.spec else 0
        self.counts = (CROP_UNIFORMS, layers * ra.UNIFORMS_PER_LAYER, ERASE_UNIFORMS)

    def draw(self, seeds: Sequence[int], sizes: np.ndarray) -> dict[str, object]:
        """Every image's random choices, on the host: crop boxes, flips, RandAugment steps, erased boxes."""
        u = uniforms(seeds, sum(self.counts))
        crop, augment, erase = np.split(u, np.cumsum(self.counts)[:2], axis=1)
        plan: dict[str, object] = {
            "boxes": crop_boxes(crop, sizes[:, 0].astype(np.float64), sizes[:, 1].astype(np.float64), self.scale,
                                self.ratio),
            "flip": crop[:, -1] < self.hflip,
            "steps": [], "erase": None}
        if self.spec is not None:
            drawn = ra.draw_rand_augment(self.spec, augment, len(self.resample))
            plan["steps"] = ra.plan_rand_augment(self.spec, drawn, (self.img_size, self.img_size), self.resample)
        if self.reprob > 0:
            plan["erase"] = erase_boxes(erase, self.img_size, self.reprob)
        return plan

    def __call__(self, images: list[torch.Tensor] | torch.Tensor, seeds: Sequence[int]) -> torch.Tensor:
        images = _as_list(images)
        if len(images) != len(seeds):
            raise ValueError(f"{len(images)} images but {len(seeds)} seeds")
        device = images[0].device
        sizes = np.array([image.shape[-2:] for image in images], dtype=np.int64)  # shapes: host metadata
        plan = self.draw(seeds, sizes)
        if self.stats.device != device:  # once: the statistics and the fill then live where the images are
            self.stats, self.fill = copy_to(self.stats, device), copy_to(self.fill, device)
        x = torch.cat([self._resized_crop(image, *box) for image, box in zip(images, plan["boxes"], strict=True)])
        parts = self._upload(plan, device)
        x = torch.where(parts["flip"].view(-1, 1, 1, 1) > 0, x.flip(-1), x)
        for step, (index, values) in zip(plan["steps"], parts["steps"], strict=True):
            ra.run_step(x, step, index, values, self.fill)
        x = (x / 255 - self.stats[0]) / self.stats[1]
        if plan["erase"] is not None:
            self._erase(x, plan["erase"], seeds)
        return self.after(x) if self.after is not None else x

    def _resized_crop(self, image: torch.Tensor, top: int, left: int, h: int, w: int) -> torch.Tensor:
        """One image's crop resized to img_size: (1, in_chans, S, S) float whole values in [0, 255], as PIL's
        uint8. On the CPU torch resizes uint8 with fixed-point kernels made to match PIL's (within 1 level on
        99.5 % of pixels, and 3x faster than in float); CUDA has float kernels only, rounded here."""
        crop = _channels(image[:, top:top + h, left:left + w].unsqueeze(0), self.in_chans)
        size = (self.img_size, self.img_size)
        if self.interpolation == "nearest":
            return F.interpolate(crop, size=size, mode="nearest").float()
        if crop.device.type == "cpu":
            return F.interpolate(crop, size=size, mode=self.interpolation, antialias=True, align_corners=False).float()
        out = F.interpolate(crop.float(), size=size, mode=self.interpolation, antialias=True, align_corners=False)
        return torch.floor(out + 0.5).clamp(0, 255)

    def _upload(self, plan: dict, device: torch.device) -> dict[str, object]:
        """The batch's numbers in one float64 tensor, copied to the device once (page-locked, not waited for),
        then cut into views: flips, each step's image indices and arguments."""
        arrays = [plan["flip"].astype(np.float64)]
        for step in plan["steps"]:
            arrays += [step.index.astype(np.float64), np.asarray(step.values, np.float64).ravel()]
        packed = copy_to(torch.from_numpy(np.concatenate(arrays)), device)
        views, at = [], 0
        for array in arrays:
            views.append(packed[at:at + array.size])
            at += array.size
        steps = [(views[1 + 2 * i].long(), views[2 + 2 * i].float()) for i in range(len(plan["steps"]))]
        return {"flip": views[0], "steps": steps}

    def _erase(self, x: torch.Tensor, boxes: np.ndarray, seeds: Sequence[int]) -> None:
        """timm's pixel-mode erasing, in place: each drawn box (host numbers) filled with N(0, 1) noise from a
        generator on the images' device seeded by the image's seed; only erased images (a quarter, in the recipe)
        cost a kernel, and only their box's pixels are drawn."""
        for i in np.nonzero(boxes[:, 2])[0]:
            top, left, h, w = (int(v) for v in boxes[i])
            generator = torch.Generator(device=x.device).manual_seed(int(seeds[i]))
            noise = torch.randn((x.shape[1], h, w), generator=generator, device=x.device, dtype=x.dtype)
            x[i, :, top:top + h, left:left + w] = noise


def _as_list(images: list[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    """(C, H, W) uint8 tensors from a list, or from an in-memory batch (N, H, W) or (N, H, W, C)."""
    if isinstance(images, torch.Tensor):
        batch = images.unsqueeze(1) if images.dim() == 3 else images.permute(0, 3, 1, 2)
        return list(batch)
    return [image.unsqueeze(0) if image.dim() == 2 else image for image in images]


def _channels(x: torch.Tensor, in_chans: int) -> torch.Tensor:
    """(1, C, H, W) uint8 with the model's channel count: RGB -> 'L' by PIL's weights, grey -> RGB."""
    if x.shape[1] == 3 and in_chans == 1:
        return ra.luminance(x.float()).to(torch.uint8)
    if x.shape[1] == 1 and in_chans == 3:
        return x.expand(-1, 3, -1, -1)
    return x

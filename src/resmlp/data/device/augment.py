"""The recipe's training augmentation on whole batches, where the images are: timm's transform as a batch op.

timm's training transform (create_transform, is_training=True) is, per PIL image: RandomResizedCropAndInterpolation
(antialiased resize), RandomHorizontalFlip, RandAugment, ToTensor, Normalize, RandomErasing. `DeviceAugment` does
the same to a batch of decoded uint8 images of any sizes on their device (a GPU, or the CPU), with no PIL and no
loader worker, as a fixed sequence of batch ops (~580 aten ops a batch whatever its size:
benchmarks/device_op_counts.py):
- the crop box, flip, RandAugment ops and erased box of every image are drawn on the CPU from the image's own
  uniforms (`uniforms`, from its sampler key), with timm's rules (the box: timm's get_params; the ops:
  resmlp.data.device.rand_augment; the erased box: timm's RandomErasing._erase, count 1, pixel noise);
- those few numbers go to the device in one page-locked copy per batch;
- every image's crop is resized in one batched resample (resmlp.data.device.resample: PIL's antialiased weights as
  two matrices per image, the images padded per group of like sizes), rounded to whole values as PIL's uint8
  output is; flips, RandAugment's steps and normalisation run on the whole batch;
- erasing fills each box, by a mask, with N(0, 1) noise that is a pure function of the image's key and the pixel
  (`keyed_normal`, a counter-based hash in int32 torch ops): the same noise for an image in any batch, worker,
  process or device.
On CPU tensors, where an op costs no kernel launch, three steps take faster per-image forms (`batched` None):
the crop by torch's uint8 resize, the geometric ops by PIL itself (rand_augment.pil_warp), the noise drawn for
the box's pixels only (the same noise). `batched=True` runs the batch ops there too (the op-count test).

Every image's numbers come from its sampler key, as in resmlp.data.device.batch_augment, so an image gets the same
augmentation whatever its batch, device, number of processes or restart (equal on the CPU; within 1 level of the
resize and the kernels' float rounding between the CPU forms and the batch ops).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from resmlp.data.device import rand_augment as ra
from resmlp.data.device.resample import pad_batch, resized_crop, size_groups
from resmlp.runtime import copy_to

ATTEMPTS = 10  # timm's RandomResizedCrop and RandomErasing both try 10 boxes
CROP_UNIFORMS = 2 * ATTEMPTS + 3  # areas, aspect ratios, top, left, flip
ERASE_UNIFORMS = 1 + 2 * ATTEMPTS + 2  # apply, areas, aspect ratios, top, left
ERASE_AREA = (0.02, 1 / 3)  # timm's RandomErasing defaults (min_area, max_area, min_aspect 0.3)
ERASE_LOG_ASPECT = (math.log(0.3), math.log(1 / 0.3))
RESIZE_MODES = ("bicubic", "bilinear", "nearest")
ERASE_NOISE_STREAM = 7  # the uniforms() stream of each image's erasing-noise key


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
    # at least 1x1: timm's rounding gives a 0-pixel box on a 1-pixel side (area * 0.08 rounds to 0), which no
    # resize can take; the image's own side bounds it (a side of 1 stays 1)
    w = np.maximum(np.where(found, w_try[rows, first], fall_w), 1)
    h = np.maximum(np.where(found, h_try[rows, first], fall_h), 1)
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
                 after: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 batched: bool | None = None) -> None:
        if interpolation not in RESIZE_MODES:
            raise ValueError(f"the device pipeline resizes with {', '.join(RESIZE_MODES)}, not {interpolation!r}")
        self.img_size, self.in_chans, self.interpolation = img_size, in_chans, interpolation
        self.scale, self.ratio, self.hflip, self.reprob = tuple(scale), tuple(ratio), hflip, reprob
        self.after = after  # e.g. the run's fixed pixel permutation, on the normalised batch
        # None: batch ops on a GPU; on the CPU, where an op costs no kernel launch, the faster per-image forms of
        # the crops, the geometric ops and erasing (module doc)
        self.batched = batched
        self.spec = ra.parse_rand_augment(auto_augment) if auto_augment else None
        # timm's create_transform hands RandAugment the run's interpolation (aa_params['interpolation'])
        self.resample = (interpolation,)
        mean_, std_ = np.array(mean, np.float64), np.array(std, np.float64)
        self.normalise = torch.tensor(np.stack([1 / (255 * std_), -mean_ / std_]), dtype=torch.float32).view(
            2, 1, -1, 1, 1)
        self.fill = torch.tensor(ra.fill_colour(tuple(mean)), dtype=torch.float32)
        layers = self.spec.num_layers if self.spec else 0
        self.counts = (CROP_UNIFORMS, layers * ra.UNIFORMS_PER_LAYER, ERASE_UNIFORMS)
        self.noise_counters: torch.Tensor | None = None  # hashed pixel counters of the erasing noise, made once

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
        images = _as_chw(images)
        shapes = _shapes(images)  # host metadata: no device read
        if len(shapes) != len(seeds):
            raise ValueError(f"{len(shapes)} images but {len(seeds)} seeds")
        device = images.device if isinstance(images, torch.Tensor) else images[0].device
        plan = self.draw(seeds, shapes[:, 1:])
        if self.normalise.device != device:  # once: the statistics and the fill then live where the images are
            self.normalise, self.fill = copy_to(self.normalise, device), copy_to(self.fill, device)
        parts = self._upload(plan, shapes, seeds, device)
        batched = self.batched if self.batched is not None else device.type != "cpu"
        x = self._resized_crops(images, shapes, parts) if batched else self._crops_one_by_one(images, plan["boxes"])
        x.index_copy_(0, parts["flip"], x.index_select(0, parts["flip"]).flip(-1))
        for step, (index, values) in zip(plan["steps"], parts["steps"], strict=True):
            ra.run_step(x, step, index, values, self.fill, batched)
        x = x.mul_(self.normalise[0]).add_(self.normalise[1])  # (x / 255 - mean) / std, in place
        if plan["erase"] is not None and not batched:
            self._erase_boxes(x, plan["erase"], parts["erase"][2])
        elif plan["erase"] is not None:
            x = self._erase(x, *parts["erase"])
        return self.after(x) if self.after is not None else x

    def _resized_crops(self, images: list[torch.Tensor] | torch.Tensor, shapes: np.ndarray,
                       parts: dict) -> torch.Tensor:
        """Every image's crop resized to img_size, a batched resample per group of like sizes (one group for
        images of one size, as a rule for ImageNet's; resmlp.data.device.resample): (N, in_chans, S, S) float
        whole values in [0, 255], rounded as PIL's uint8 output is, in the batch's order."""
        channels = 1 if self.in_chans == 1 and shapes[:, 0].max() == 1 else 3
        out = []
        for (start, stop), group_shapes, boxes in zip(parts["groups"], parts["shapes"], parts["boxes"],
                                                      strict=True):
            if isinstance(images, torch.Tensor):  # one size: size_groups keeps the order, so a group is a slice
                batch = images[start:stop]
                batch = batch if channels == batch.shape[1] else batch.expand(-1, channels, -1, -1)
            else:
                members = [images[i] for i in parts["order"][start:stop]]
                tallest, widest = (int(v) for v in shapes[parts["order"][start:stop], 1:].max(0))
                batch = pad_batch(members, group_shapes, (channels, tallest, widest))
            if self.in_chans == 1 and channels == 3:
                batch = ra.luminance(batch.float()).to(torch.uint8)
            out.append(resized_crop(batch, group_shapes[:, 1:], boxes, (self.img_size,) * 2, self.interpolation))
        crops = torch.cat(out).index_select(0, parts["unsort"])
        return torch.floor(crops + 0.5).clamp(0, 255)

    def _crops_one_by_one(self, images: list[torch.Tensor] | torch.Tensor, boxes: np.ndarray) -> torch.Tensor:
        """The CPU form of _resized_crops: each image's crop resized by F.interpolate(antialias=True) on uint8,
        torch's fixed-point kernels made to match PIL's (within 1 level on 99.5 % of pixels). On one core it is
        ~15x faster than the batched resample's dense matmuls over padded images (about 1 against 16 ms an
        image at ImageNet sizes, profiled under load), and on the CPU an op costs no kernel launch."""
        size = (self.img_size, self.img_size)
        crops = []
        for image, (top, left, h, w) in zip(images, boxes, strict=True):
            crop = model_channels(image[:, top:top + h, left:left + w].unsqueeze(0), self.in_chans)
            if self.interpolation == "nearest":
                crops.append(F.interpolate(crop, size=size, mode="nearest-exact"))
            else:
                crops.append(F.interpolate(crop, size=size, mode=self.interpolation, antialias=True,
                                           align_corners=False))
        return torch.cat(crops).float()

    def _upload(self, plan: dict, shapes: np.ndarray, seeds: Sequence[int], device: torch.device) -> dict:
        """The batch's numbers in one float64 tensor (whole numbers below 2**53 exactly), copied to the device
        once (page-locked, not waited for), then cut into views with one split each: flips, shapes and crop
        boxes in size-group order (resample.size_groups) and the order back, every step's image indices and
        arguments, the erased images, their boxes and noise keys."""
        steps = plan["steps"]
        indices = [step.index.astype(np.float64) for step in steps]
        values = [np.asarray(step.values, np.float64).ravel() for step in steps]
        erase = plan["erase"] if plan["erase"] is not None else np.zeros((0, 4), np.int64)
        erased = np.nonzero(erase[:, 2])[0]
        keys = np.floor(uniforms([seeds[i] for i in erased], 1, ERASE_NOISE_STREAM)[:, 0] * 2.0 ** 31)
        order, groups = size_groups(shapes[:, 1:])  # one group for a tensor batch: its images are of one size
        flipped = np.nonzero(plan["flip"])[0]
        arrays = [flipped, shapes[order].ravel(), plan["boxes"][order].ravel(),
                  np.argsort(order), *indices, *values, erased, erase[erased].ravel(), keys]
        packed = copy_to(torch.from_numpy(np.concatenate(arrays).astype(np.float64)), device)
        flip, shape, box, unsort, index, value, erased_at, erased_box, key = torch.split(packed, [
            len(flipped), shapes.size, plan["boxes"].size, len(order), sum(map(len, indices)),
            sum(map(len, values)), len(erased), 4 * len(erased), len(keys)])
        counts = [stop - start for start, stop in groups]
        index_of = torch.split(index.long(), [len(i) for i in indices])
        values_of = torch.split(value.float(), [len(v) for v in values])
        return {"flip": flip.long(), "order": order, "groups": groups, "unsort": unsort.long(),
                "shapes": torch.split(shape.long().view(-1, 3), counts), "boxes": torch.split(box.view(-1, 4), counts),
                "steps": list(zip(index_of, values_of, strict=True)),
                "erase": (erased_at.long(), erased_box.view(-1, 4), key.int())}

    def _erase(self, x: torch.Tensor, index: torch.Tensor, boxes: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """timm's pixel-mode erasing of the images `index`: each box filled with N(0, 1) noise that is a pure
        function of the image's key and the pixel (keyed_normal), so an image gets the same noise in any
        batch, worker, process or device; the boxes applied by masks, the whole batch in a fixed set of ops."""
        size = self.img_size
        if self.noise_counters is None or self.noise_counters.device != x.device:
            self.noise_counters = _lowbias32(torch.arange(x.shape[1] * size * size, dtype=torch.int32,
                                                          device=x.device)).view(1, x.shape[1], size, size)
        pixels = torch.arange(size, device=x.device, dtype=boxes.dtype)
        rows = (pixels >= boxes[:, 0:1]) & (pixels < boxes[:, 0:1] + boxes[:, 2:3])
        cols = (pixels >= boxes[:, 1:2]) & (pixels < boxes[:, 1:2] + boxes[:, 3:4])
        inside = (rows[:, :, None] & cols[:, None, :]).unsqueeze(1)
        noise = keyed_normal(self.noise_counters, keys).to(x.dtype)
        return x.index_copy(0, index, torch.where(inside, noise, x.index_select(0, index)))


    def _erase_boxes(self, x: torch.Tensor, boxes: np.ndarray, keys: torch.Tensor) -> None:
        """The CPU form of _erase, in place: the same noise, drawn for each erased box's pixels only (a sixth
        of the image on average) instead of whole images under masks: on the CPU an op costs no launch, and
        the hashing is most of erasing's time."""
        if self.noise_counters is None or self.noise_counters.device != x.device:
            self.noise_counters = _lowbias32(torch.arange(x[0].numel(), dtype=torch.int32)).view(1, *x.shape[1:])
        for at, i in enumerate(np.nonzero(boxes[:, 2])[0]):
            top, left, h, w = (int(v) for v in boxes[i])
            counters = self.noise_counters[:, :, top:top + h, left:left + w]
            x[i, :, top:top + h, left:left + w] = keyed_normal(counters, keys[at:at + 1])[0]


def keyed_normal(counters: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """(E, *counters.shape[1:]) standard normal floats, a pure function of (key, counter): a counter-based
    generator in int32 torch ops (Wellons' lowbias32 hash of the hashed counter xor the key, its top 23 bits a
    uniform in (0, 1), the normal by the inverse CDF). Its own, not torch.Generator: a generator's stream
    depends on the device and on what it drew before; this gives each image the same noise anywhere."""
    bits = _lowbias32(counters ^ keys.view(-1, *([1] * (counters.dim() - 1))))
    # 23 bits: k + 0.5 is exact in float32 only below 2^23 (24 bits rounded 2^24 - 0.5 up to 1.0: ndtri(1) = inf)
    uniform = (_shift_right(bits, 9).float() + 0.5) * 2.0 ** -23
    return torch.special.ndtri(uniform)


def _lowbias32(z: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' lowbias32 integer hash on int32 tensors (wrapping multiplies)."""
    z = z ^ _shift_right(z, 16)
    z = z * 0x7FEB352D
    z = z ^ _shift_right(z, 15)
    z = z * (0x846CA68B - 2 ** 32)  # the constant as a signed int32
    return z ^ _shift_right(z, 16)


def _shift_right(z: torch.Tensor, bits: int) -> torch.Tensor:
    """The logical right shift of int32 values (torch's >> is arithmetic on signed ints)."""
    return (z >> bits) & ((1 << (32 - bits)) - 1)


def _as_list(images: list[torch.Tensor] | torch.Tensor) -> list[torch.Tensor]:
    """(C, H, W) uint8 tensors from a list, or from an in-memory batch (N, H, W) or (N, H, W, C)."""
    if isinstance(images, torch.Tensor):
        return list(_as_chw(images))
    return [image.unsqueeze(0) if image.dim() == 2 else image for image in images]


def _as_chw(images: list[torch.Tensor] | torch.Tensor) -> list[torch.Tensor] | torch.Tensor:
    """An in-memory batch (N, H, W) or (N, H, W, C) as one (N, C, H, W) view; a list as (C, H, W) images."""
    if isinstance(images, torch.Tensor):
        return images.unsqueeze(1) if images.dim() == 3 else images.permute(0, 3, 1, 2)
    return [image.unsqueeze(0) if image.dim() == 2 else image for image in images]


def _shapes(images: list[torch.Tensor] | torch.Tensor) -> np.ndarray:
    """(N, 3) [c, h, w] of each image, from the tensors' metadata."""
    if isinstance(images, torch.Tensor):
        return np.tile(np.array(images.shape[1:], dtype=np.int64), (len(images), 1))
    return np.array([image.shape for image in images], dtype=np.int64).reshape(-1, 3)


def model_channels(x: torch.Tensor, in_chans: int) -> torch.Tensor:
    """(N, C, H, W) uint8 with the model's channel count: RGB -> 'L' by PIL's weights, grey -> RGB."""
    if x.shape[1] == 3 and in_chans == 1:
        return ra.luminance(x.float()).to(torch.uint8)
    if x.shape[1] == 1 and in_chans == 3:
        return x.expand(-1, 3, -1, -1)
    return x

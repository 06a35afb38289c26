"""DINO's multi-crop on whole batches, where the images are: a fixed sequence of batch ops per batch.

DINO's training transform (main_dino.py, DataAugmentationDINO; resmlp.train.dino.MultiCropTransform is its PIL
form) makes, per image, 2 global views and `num_local` local views, each: RandomResizedCrop (bicubic; global
scale (0.4, 1), local (0.05, 0.4), aspect (3/4, 4/3)), horizontal flip (p 0.5), ColorJitter(0.4, 0.4, 0.2, 0.1)
(p 0.8; grey images: brightness and contrast only), RandomGrayscale (p 0.2; RGB only), Gaussian blur with a radius
uniform in [0.1, 2] (p 1.0 / 0.1 / 0.5 for the first global, the second global and the local views), solarize at
128 (p 0.2, second global view only), Normalize. Local views are augmented at their own size, then resized to
the global size (resmlp.train.dino's module doc, option (a)).

`MultiCropAugment` does the same to a batch of decoded uint8 images of any sizes:
- every random choice of every image and view is drawn on the host from the image's own uniforms
  (resmlp.data.device.augment.uniforms, one stream per view, from its sampler key): crop boxes by
  RandomResizedCrop's rule (torchvision's get_params, the rule of timm's crop_boxes), flips, jitter factors and
  torchvision's per-image random order of the four jitter ops, grey, blur kernels, solarize;
- those numbers go to the device in one page-locked copy per batch;
- the views of one size are cropped and resized together in one batched resample (resmlp.data.device.resample's
  weights; on CPU tensors one torch resize per crop instead, ~30x faster there, where an op costs no launch);
  each photometric op then runs once per size on all of those views: masked (flip, grey, solarize), with a
  neutral kernel for the images it skips (blur), or on the images that have it at that place of their jitter
  order (gathered by host-drawn indices, so each image pays for each jitter op once).
So on a GPU a batch costs the same ~1,300 ops whatever its size (tests/test_multi_crop.py counts them).

Pixels are floats in [0, 1] from the resample on, as torchvision's tensor ops take them (PIL rounds to uint8
after each op and truncates: how far that lands is measured by benchmarks/op_fidelity.py, docs/training.md). The
batched jitter ops are tested against torchvision.transforms.v2's per-image ops, the distributions against
DINO's PIL transform.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF
from torchvision.transforms.v2.functional._color import _rgb_to_hsv

from resmlp.data.device import augment as da
from resmlp.data.device.resample import pad_batch, resample_weights, taps_bound
from resmlp.errors import ConfigError
from resmlp.runtime import copy_to

RATIO = (3 / 4, 4 / 3)  # torchvision's RandomResizedCrop default, which DINO keeps
JITTER = (0.4, 0.4, 0.2, 0.1)  # DINO's ColorJitter: brightness, contrast, saturation, hue
P_JITTER, P_GREY, P_FLIP = 0.8, 0.2, 0.5  # DINO's RandomApply(ColorJitter), RandomGrayscale, RandomHorizontalFlip
BLUR_RADIUS = (0.1, 2.0)  # DINO's utils.GaussianBlur radius range
BLUR_TAPS = 2 * math.ceil(3 * BLUR_RADIUS[1]) + 1  # DINOGaussianBlur's kernel out to 3 sigma, at the widest sigma
SOLARIZE_AT = 128 / 255  # DINO's RandomSolarize(128) on uint8
# per view: crop (areas, aspects, top, left, flip), jitter (apply, 4 factors, 4 order keys), grey, blur (apply,
# radius), solarize
VIEW_UNIFORMS = da.CROP_UNIFORMS + 9 + 1 + 2 + 1
# the columns of a view's row of numbers: flip, 4 jitter factors (neutral where the jitter is off), the 4 ops'
# order, grey, solarize, the blur kernel's taps
FLIP, FACTORS, ORDER, GREY, SOLARIZE, KERNEL = 0, slice(1, 5), slice(5, 9), 9, 10, slice(11, None)
ROW = 11 + BLUR_TAPS
NEUTRAL = np.array([1.0, 1.0, 1.0, 0.0])  # the jitter factors that leave an image as it is


@dataclass(frozen=True)
class View:
    """One of DINO's views: crop scale, the size it is augmented at, and its blur and solarize probabilities."""

    scale: tuple[float, float]
    size: int
    p_blur: float
    p_solarize: float


class MultiCropAugment:
    """Decoded uint8 images (a list of (C, H, W) tensors, or an (N, H, W[, C]) batch) + one seed per image ->
    a list of 2 + num_local normalised float (N, in_chans, S, S) views on the images' device (module doc)."""

    def __init__(self, img_size: int, in_chans: int, mean: Sequence[float], std: Sequence[float], num_local: int = 4,
                 global_scale: Sequence[float] = (0.4, 1.0), local_scale: Sequence[float] = (0.05, 0.4),
                 local_size: int | None = None, per_crop_on_cpu: bool = True) -> None:
        local_size = local_size or max(img_size * 3 // 7, 8)  # MultiCropTransform's default
        if min(img_size, local_size) <= BLUR_TAPS // 2:
            raise ConfigError(f"the device multi-crop blurs with {BLUR_TAPS} taps and needs views over "
                             f"{BLUR_TAPS // 2} pixels; set dino.local_size and model.img_size to at least "
                             f"{BLUR_TAPS // 2 + 1} or data.pipeline=timm")
        self.img_size, self.in_chans, self.num_local = img_size, in_chans, num_local
        self.per_crop_on_cpu = per_crop_on_cpu  # resized_views_cpu on CPU tensors (the faster there; tests count
        # the batch ops on CPU tensors with False)
        # DINO's two global views: blurred always / rarely, the second solarised at 0.2; then the local views
        self.views = [View(tuple(global_scale), img_size, 1.0, 0.0), View(tuple(global_scale), img_size, 0.1, 0.2)]
        self.views += [View(tuple(local_scale), local_size, 0.5, 0.0)] * num_local
        self.stats = torch.tensor([list(mean), list(std)], dtype=torch.float32).view(2, 1, -1, 1, 1)

    def draw(self, seeds: Sequence[int], sizes: np.ndarray) -> dict[str, np.ndarray]:
        """Every image's and view's choices, on the host: `boxes` (V, N, 4) top, left, h, w and `rows`
        (V, N, ROW): flip, jitter factors, jitter order, grey, solarize, blur kernel (see ROW)."""
        heights, widths = sizes[:, 0].astype(np.float64), sizes[:, 1].astype(np.float64)
        boxes, rows = [], []
        for index, view in enumerate(self.views):
            u = da.uniforms(seeds, VIEW_UNIFORMS, stream=100 + index)
            crop, jitter, rest = np.split(u, [da.CROP_UNIFORMS, da.CROP_UNIFORMS + 9], axis=1)
            boxes.append(da.crop_boxes(crop, heights, widths, view.scale, RATIO))
            rows.append(np.concatenate([
                (crop[:, -1:] < P_FLIP), self._jitter(jitter),
                (rest[:, :1] < P_GREY) & (self.in_chans == 3), rest[:, 3:4] < view.p_solarize,
                blur_kernels(rest[:, 1] < view.p_blur,
                             BLUR_RADIUS[0] + (BLUR_RADIUS[1] - BLUR_RADIUS[0]) * rest[:, 2])], axis=1))
        return {"boxes": np.stack(boxes), "rows": np.stack(rows)}

    def _jitter(self, u: np.ndarray) -> np.ndarray:
        """(N, 8): torchvision's ColorJitter.get_params per image, neutral factors where RandomApply skips it:
        brightness and contrast in [0.6, 1.4], saturation in [0.8, 1.2], hue in [-0.1, 0.1] (grey images:
        brightness and contrast only, as MultiCropTransform's ColorJitter(0.4, 0.4)); a uniformly random order
        of the four ops (torch.randperm(4)) as the ranks of four uniforms."""
        spread = np.array(JITTER) * (1.0 if self.in_chans == 3 else np.array([1, 1, 0, 0]))
        factors = NEUTRAL + spread * (2 * u[:, 1:5] - 1)
        factors = np.where(u[:, :1] < P_JITTER, factors, NEUTRAL)
        return np.concatenate([factors, np.argsort(u[:, 5:9], axis=1)], axis=1)

    def __call__(self, images: list[torch.Tensor] | torch.Tensor, seeds: Sequence[int]) -> list[torch.Tensor]:
        images, shapes = _as_images(images)
        if len(shapes) != len(seeds):
            raise ValueError(f"{len(shapes)} images but {len(seeds)} seeds")
        device, n = images[0].device, len(seeds)
        plan = self.draw(seeds, shapes[:, 1:])
        if self.stats.device != device:  # once: the statistics then live where the images are
            self.stats = copy_to(self.stats, device)
        groups = self._groups()
        steps = [jitter_plan(plan["rows"][first:last].reshape(-1, ROW), self.in_chans) for _, first, last in groups]
        rows, boxes, shapes_there, jitter = self._upload(plan, shapes, steps, device)
        batch, sizes_there = da.model_channels(_batch(images, shapes, shapes_there), self.in_chans), shapes_there[:, 1:]
        out = []
        for (size, first, last), group_steps in zip(groups, jitter, strict=True):
            x = (resized_views_cpu(batch, plan["boxes"][first:last], size)
                 if device.type == "cpu" and self.per_crop_on_cpu else
                 resized_views(batch, sizes_there, boxes[first:last], size))
            x = self.augment_views(x / 255, rows[first:last].flatten(0, 1), group_steps)
            if size != self.img_size:  # option (a): local views augmented small, then resized to the global size
                x = F.interpolate(x, size=(self.img_size,) * 2, mode="bicubic", antialias=True,
                                  align_corners=False).clamp_(0, 1)
            x = x.sub_(self.stats[0]).div_(self.stats[1])  # in place: a batch of views is the largest tensor here
            out += list(x.view(last - first, n, *x.shape[1:]).unbind(0))
        return out

    @staticmethod
    def _upload(plan: dict[str, np.ndarray], shapes: np.ndarray, steps: list[list[JitterStep]],
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[list[JitterStep]]]:
        """The batch's numbers in one float64 tensor, copied to the device once (page-locked, not waited for),
        then cut into views: rows (V, N, ROW) float32, boxes (V, N, 4), image shapes (N, 3) and each group's
        jitter steps (their image indices as int64, in one cast)."""
        indices = [step.index for group in steps for step in group]
        factors = [step.factor for group in steps for step in group]
        arrays = [plan["rows"], plan["boxes"], shapes, *factors]
        packed = copy_to(torch.from_numpy(np.concatenate(
            [a.ravel().astype(np.float64) for a in arrays + indices] + [np.zeros(0)])), device)
        floats = _cut(packed, [a.size for a in arrays])
        whole = packed[sum(a.size for a in arrays):].long()  # the indices: exact in float64, one cast
        factors_there, indices_there = iter(floats[3:]), iter(_cut(whole, [a.size for a in indices]))
        jitter = [[JitterStep(step.op, next(indices_there), next(factors_there).float()) for step in group]
                  for group in steps]
        return (floats[0].view(plan["rows"].shape).float(), floats[1].view(plan["boxes"].shape),
                floats[2].view(shapes.shape), jitter)

    def _groups(self) -> list[tuple[int, int, int]]:
        """(size, first view, end view) of each run of views augmented at one size: global, then local."""
        groups = [(self.img_size, 0, 2)]
        return groups + [(self.views[2].size, 2, len(self.views))] if self.num_local else groups

    def augment_views(self, x: torch.Tensor, rows: torch.Tensor, steps: list[JitterStep]) -> torch.Tensor:
        """Flip, colour jitter, grey, blur and solarize of a float [0, 1] batch with one row of numbers per image
        and the batch's jitter steps (jitter_plan)."""
        x = torch.where(rows[:, FLIP].view(-1, 1, 1, 1) > 0, x.flip(-1), x)
        x = color_jitter(x, steps)
        if x.shape[1] == 3:
            x = torch.where(rows[:, GREY].view(-1, 1, 1, 1) > 0, TF.rgb_to_grayscale(x, 3), x)
        x = gaussian_blur(x, rows[:, KERNEL])
        return torch.where((rows[:, SOLARIZE].view(-1, 1, 1, 1) > 0) & (x >= SOLARIZE_AT), 1 - x, x)


class JitterStep(NamedTuple):
    """One op of the colour jitter at one place of the images' orders: which op (0-3: brightness, contrast,
    saturation, hue), the images it runs on at that place, and their factors."""

    op: int
    index: np.ndarray | torch.Tensor
    factor: np.ndarray | torch.Tensor


def jitter_plan(rows: np.ndarray, in_chans: int) -> list[JitterStep]:
    """The colour jitter of a batch as at most 16 steps, on the host: at each of the four places of the images'
    own orders (torchvision's per-image randperm), each op on the images that have it there, so every image
    passes through each op once (the images whose jitter RandomApply skipped, none). Grey images: brightness
    and contrast only."""
    factors, order = rows[:, FACTORS], rows[:, ORDER].astype(np.int64)
    jittered = (factors != NEUTRAL).any(1)
    steps = []
    for place in range(4):
        for op in range(4 if in_chans == 3 else 2):
            index = np.nonzero(jittered & (order[:, place] == op))[0]
            if len(index):
                steps.append(JitterStep(op, index, factors[index, op]))
    return steps


def resized_views(images: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor, size: int) -> torch.Tensor:
    """(V * N, C, size, size) float: V views' boxes (V, N, 4) of the N padded uint8 images (valid regions `sizes`
    (N, 2)) resized in one go, view-major, rounded to uint8 levels as PIL's crop. resmlp.data.device.resample's
    weights in resized_crop's two passes (PIL's bicubic, horizontal first, rounded between the passes as PIL
    does), the views' column weights side by side so that one matmul reads each image once."""
    views, n = boxes.shape[:2]
    _, c, h, w = images.shape
    flat, valid = boxes.reshape(-1, 4), sizes.repeat(views, 1)
    # both axes' weights in one call, as resized_crop does: rows of the first V * N, columns of the rest
    both = resample_weights(torch.cat([flat[:, 0], flat[:, 1]]), torch.cat([flat[:, 2], flat[:, 3]]),
                            torch.cat([valid[:, 0], valid[:, 1]]),
                            torch.full((2 * len(flat),), float(size), dtype=torch.float64, device=flat.device),
                            size, max(h, w), taps_bound(max(h, w), size, "bicubic", True), "bicubic", True)
    rows, cols = both[:len(flat), :, :h], both[len(flat):, :, :w]
    side_by_side = cols.reshape(views, n, size, w).permute(1, 3, 0, 2).reshape(n, w, views * size)
    wide = torch.bmm(images.float().reshape(n, c * h, w), side_by_side)  # (N, C * H, V * size)
    wide = wide.clamp_(0, 255).add_(0.5).floor_()  # in place: the largest tensor of the pipeline
    # each (view, image)'s columns as one (H, C * size) matrix, so the vertical pass is one bmm with no copy of
    # the row weights per channel
    tall = wide.view(n, c, h, views, size).permute(3, 0, 2, 1, 4).reshape(views * n, h, c * size)
    del wide
    out = torch.bmm(rows.reshape(views * n, size, h), tall).view(views * n, size, c, size)
    return out.permute(0, 2, 1, 3).clamp_(0, 255).add_(0.5).floor_().contiguous()


def resized_views_cpu(images: torch.Tensor, boxes: np.ndarray, size: int) -> torch.Tensor:
    """resized_views on the CPU: each crop resized by F.interpolate on uint8 (torch's fixed-point antialiased
    kernels, made to match PIL's: within 1 level), one call per image and view. On the CPU an op costs no
    launch, and the dense matmuls over whole padded images cost several times PIL's per-crop resize (a local
    view's box is 5-40 % of the image), so the CPU takes the per-crop form."""
    crops = [F.interpolate(images[i:i + 1, :, top:top + h, left:left + w], size=(size, size), mode="bicubic",
                           antialias=True, align_corners=False)
             for view in boxes for i, (top, left, h, w) in enumerate(view.tolist())]
    return torch.cat(crops).float()


def blur_kernels(apply: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """(N, BLUR_TAPS) 1-D kernels: torchvision's gaussian_blur kernel (2 * ceil(3 sigma) + 1 taps, exp(-x^2 /
    2 sigma^2) normalised) centred in BLUR_TAPS, the other taps zero; a single tap of 1 where `apply` is off."""
    half = BLUR_TAPS // 2
    x = np.arange(-half, half + 1, dtype=np.float64)[None]
    inside = np.abs(x) <= np.ceil(3 * sigma)[:, None]
    pdf = np.where(inside, np.exp(-0.5 * (x / sigma[:, None]) ** 2), 0.0)
    return np.where(apply[:, None], pdf / pdf.sum(1, keepdims=True), (x == 0).astype(np.float64))


def gaussian_blur(x: torch.Tensor, kernels: torch.Tensor) -> torch.Tensor:
    """Each image blurred with its own separable kernel ((N, taps) rows), reflect-padded as torchvision's
    gaussian_blur: two grouped convolutions, one group per image and channel."""
    n, c, h, w = x.shape
    taps = kernels.shape[1]
    weight = kernels.to(x.dtype).repeat_interleave(c, dim=0)  # (N*C, taps)
    flat = F.pad(x.reshape(1, n * c, h, w), [taps // 2] * 4, mode="reflect")
    flat = F.conv2d(flat, weight.view(n * c, 1, 1, taps), groups=n * c)
    flat = F.conv2d(flat, weight.view(n * c, 1, taps, 1), groups=n * c)
    return flat.view(n, c, h, w)


def color_jitter(x: torch.Tensor, steps: list[JitterStep]) -> torch.Tensor:
    """torchvision's ColorJitter with per-image factors and order (jitter_plan's steps, on x's device): each
    step gathers its images, runs its op on them and writes them back, so each image pays for each op once."""
    ops = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)
    x = x.clone()
    for step in steps:
        x.index_copy_(0, step.index, ops[step.op](x.index_select(0, step.index), step.factor))
    return x


def _blend(a: torch.Tensor, b: torch.Tensor, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's _blend with one ratio per image: ratio * a + (1 - ratio) * b, clamped to [0, 1]."""
    ratio = ratio.view(-1, 1, 1, 1)
    return (ratio * a + (1 - ratio) * b).clamp(0, 1)


def adjust_brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return (x * factor.view(-1, 1, 1, 1)).clamp(0, 1)


def adjust_contrast(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    grey = TF.rgb_to_grayscale(x) if x.shape[1] == 3 else x
    return _blend(x, grey.mean(dim=(-3, -2, -1), keepdim=True), factor)


def adjust_saturation(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return _blend(x, TF.rgb_to_grayscale(x), factor)


def adjust_hue(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's adjust_hue with one shift per image: torchvision's RGB -> HSV (a private function of
    torchvision.transforms.v2.functional._color, batched already), the hue moved by the image's shift, back to
    RGB by `_hsv_to_rgb`; images with shift 0 keep their pixels (the round trip is not exact in float)."""
    h, s, v = _rgb_to_hsv(x).unbind(dim=-3)
    moved = _hsv_to_rgb((h + factor.view(-1, 1, 1)).remainder(1.0), s, v)
    return torch.where(factor.view(-1, 1, 1, 1) != 0, moved, x)


def _hsv_to_rgb(h: torch.Tensor, s: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(N, 3, H, W) RGB of hue, saturation and value planes, in closed form: channel n (R, G, B: n = 5, 3, 1) is
    v - v s clamp(min(k, 4 - k), 0, 1) with k = (n + 6 h) mod 6, the sector formula torchvision's _hsv_to_rgb
    evaluates with a lookup table. Ours because torchvision's copies that table to the device from pageable
    memory on every call: a host wait per call on a GPU (tested equal to it)."""
    k = (torch.arange(5, 0, -2, device=h.device, dtype=h.dtype).view(1, 3, 1, 1) + 6 * h.unsqueeze(1)).remainder(6)
    ramp = torch.minimum(k, 4 - k).clamp(0, 1)
    value = v.unsqueeze(1)
    return value - value * s.unsqueeze(1) * ramp


def _cut(packed: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Consecutive slices of `packed` of these lengths (views: no copy)."""
    out, at = [], 0
    for length in lengths:
        out.append(packed[at:at + length])
        at += length
    return out


def _as_images(images: list[torch.Tensor] | torch.Tensor) -> tuple[list[torch.Tensor] | torch.Tensor, np.ndarray]:
    """Decoded images as (C, H, W) tensors, or an in-memory (N, H, W[, C]) batch as (N, C, H, W), and their
    (N, 3) shapes [c, h, w] (host metadata: no read of the pixels)."""
    if isinstance(images, torch.Tensor):
        batch = images.unsqueeze(1) if images.dim() == 3 else images.permute(0, 3, 1, 2)
        return batch, np.tile(np.array(batch.shape[1:], dtype=np.int64), (len(batch), 1))
    images = [image.unsqueeze(0) if image.dim() == 2 else image for image in images]
    return images, np.array([image.shape for image in images], dtype=np.int64)


def _batch(images: list[torch.Tensor] | torch.Tensor, shapes: np.ndarray, shapes_there: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) uint8, each image at its top left: a batch as it is, a list of one shape stacked, a list of
    several padded to the largest by resample.pad_batch (a fixed number of ops, the offsets computed on the
    device from the uploaded shapes)."""
    if isinstance(images, torch.Tensor):
        return images
    if (shapes == shapes[0]).all():
        return torch.stack(images)
    return pad_batch(images, shapes_there.long(), tuple(int(v) for v in shapes.max(0)))

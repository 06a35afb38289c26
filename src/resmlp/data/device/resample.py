"""Resized crops of a batch of images of different sizes in a fixed number of batch ops.

PIL's antialiased resize (what timm's and torchvision's crop-then-resize run on PIL images) is separable: each
output row is a weighted sum of input rows, each output column of input columns, the weights PIL's filter
(bilinear: triangle, support 1; bicubic: Keys a=-0.5, support 2) stretched by the scale factor when shrinking
(antialiasing) and normalised to sum 1, the taps cut at the crop's edges (nearest: the pixel under each output
pixel's centre). So a crop + resize is two matrices per image, the crop's offset folded into them:
out = Wy @ image @ Wx^T. With the images padded to one (H, W) (`pad_batch`) and the matrices built for the whole
batch at once (zero past each image's valid region), a batch of any sizes and boxes is batched matmuls: the
number of ops does not depend on the batch size (resmlp.data.device.augment uses it on the GPU, where each op is
a kernel launch).

Why our own and not F.interpolate: interpolate resizes one shape per call (one call per image), and
torchvision's resized_crop likewise; neither takes per-image boxes. Tested against PIL's crop + resize
(tests/test_device_resample.py): within 1 level on >= 99.5 % of pixels.

Like PIL on uint8 images, the horizontal pass runs first and its result is clamped and rounded to whole levels
when the input is uint8 (PIL keeps the intermediate image in uint8); the output is not rounded: the caller
rounds. Memory: the two weight matrices (N, oh, H) and (N, ow, W), built from each output pixel's few taps; then,
channel by channel, the float copy of the channel (N, H, W) and its horizontal pass (N, H, ow); the output
(docs/training.md gives the figure at batch 256).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

# the most pixels one padded group of images may hold: 256 images of 512 x 512 (ImageNet's are at most ~500 a side,
# so one group as a rule); 0.8 GB as float32 RGB, the size resized_crop works on (docs/training.md)
GROUP_PIXELS = 256 * 512 * 512
SUPPORT = {"bilinear": 1.0, "bicubic": 2.0, "nearest": 0.5}  # PIL's filter supports (Imaging/Resample.c)
BICUBIC_A = -0.5  # PIL's bicubic_filter constant (torch's antialiased kernels use the same)


def resized_crop(images: torch.Tensor, sizes: torch.Tensor, boxes: torch.Tensor, out_size: tuple[int, int],
                 interpolation: str = "bicubic", antialias: bool = True) -> torch.Tensor:
    """Each image's box [top, left, height, width] (in its own pixels, inside its valid [h, w] region `sizes`)
    resized to `out_size`: (N, C, oh, ow) float32 on the images' device, in the input's value range, not
    clamped or rounded. `images` is (N, C, H, W), uint8 or float, each image's pixels at its top left."""
    if interpolation not in SUPPORT:
        raise ValueError(f"resized_crop resamples with {' or '.join(SUPPORT)}, not {interpolation!r}")
    if images.dim() != 4 or sizes.shape != (len(images), 2) or boxes.shape != (len(images), 4):
        raise ValueError(f"resized_crop takes images (N, C, H, W), sizes (N, 2), boxes (N, 4); got "
                         f"{tuple(images.shape)}, {tuple(sizes.shape)}, {tuple(boxes.shape)}")
    boxes = boxes.to(images.device, torch.float64)
    sizes = sizes.to(images.device)
    n, (h, w) = len(images), images.shape[-2:]
    # both axes' matrices in one go (rows first, then columns): half the ops of two calls
    # the output sizes filled on the device: no Python data copied up (new_tensor would wait for the stream)
    outs = boxes.new_full((2 * n,), float(out_size[0]))
    outs[n:] = out_size[1]
    taps = taps_bound(max(h, w), min(out_size), interpolation, antialias)
    both = resample_weights(torch.cat([boxes[:, 0], boxes[:, 1]]), torch.cat([boxes[:, 2], boxes[:, 3]]),
                            torch.cat([sizes[:, 0], sizes[:, 1]]), outs, max(out_size), max(h, w), taps,
                            interpolation, antialias)
    rows, cols = both[:n, :out_size[0], :h], both[n:, :out_size[1], :w]
    # channel by channel: the float copy of the images, the largest temporary, is one channel's at a time
    planes = []
    for channel in images.unbind(1):
        wide = torch.bmm(channel.float(), cols.transpose(1, 2))  # (N, H, ow): PIL's horizontal pass first
        if images.dtype == torch.uint8:  # PIL's intermediate image is uint8: clipped and rounded (in place)
            wide = wide.clamp_(0, 255).add_(0.5).floor_()
        planes.append(torch.bmm(rows, wide))  # (N, oh, ow)
    return torch.stack(planes, 1)


def resample_weights(start: torch.Tensor, length: torch.Tensor, valid: torch.Tensor, out: torch.Tensor,
                     steps: int, padded: int, taps: int, interpolation: str, antialias: bool) -> torch.Tensor:
    """(N, steps, padded) float32: row i holds the weights of input pixels for output pixel i < out of a crop
    [start, start + length) resized to `out` pixels, of an axis with `valid` pixels, as PIL's precompute_coeffs
    computes them (its box argument, the taps cut at the crop's edges as after a crop); all float64 (N,) but
    `valid`. Computed on each output pixel's few taps (at most `taps`: taps_bound), then scattered into the dense
    matrix: the temporaries are (N, steps, taps), not (N, steps, padded)."""
    scale = length / out
    filter_scale = scale.clamp(min=1.0) if antialias else torch.ones_like(scale)
    support = SUPPORT[interpolation] * filter_scale
    step = torch.arange(steps, device=start.device, dtype=torch.float64)
    centre = start[:, None] + (step[None] + 0.5) * scale[:, None]  # (N, out), in the image's pixels
    first = torch.maximum(torch.floor(centre - support[:, None] + 0.5), torch.floor(start)[:, None])
    end = torch.minimum(torch.floor(centre + support[:, None] + 0.5),
                        torch.minimum(torch.ceil(start + length), valid.to(torch.float64))[:, None])
    offsets = torch.arange(taps, device=start.device, dtype=torch.float64)
    pixels = first[..., None] + offsets  # (N, out, taps)
    inside = pixels < end[..., None]
    if interpolation == "nearest":  # PIL's NEAREST with a box: the pixel under each output pixel's centre
        weights = (inside & (pixels == torch.floor(centre)[..., None])).float()
    else:
        distance = ((pixels - (centre - 0.5)[..., None]) / filter_scale[:, None, None]).float()
        weights = torch.where(inside, _kernel(distance, interpolation), 0.0)
        total = weights.sum(-1, keepdim=True)
        weights = weights / torch.where(total == 0, 1.0, total)
    # taps past the end carry weight 0 and may land on a real tap's index: scatter_add adds nothing for them
    index = pixels.clamp(max=padded - 1).long()
    dense = torch.zeros(len(start), steps, padded, device=start.device, dtype=torch.float32)
    return dense.scatter_add_(2, index, weights)


def taps_bound(padded: int, fewest_out: int, interpolation: str, antialias: bool) -> int:
    """The most input pixels one output pixel can weigh, from host numbers: a crop is at most `padded` long,
    so its scale factor at most padded / fewest_out (the filter's support widened by it when antialiasing)."""
    widest = max(1.0, padded / fewest_out) if antialias else 1.0
    return int(math.ceil(2 * SUPPORT[interpolation] * widest)) + 2


def _kernel(x: torch.Tensor, interpolation: str) -> torch.Tensor:
    """PIL's bilinear (triangle) or bicubic (Keys, a = -0.5) filter at distances x."""
    x = x.abs()
    if interpolation == "bilinear":
        return (1 - x).clamp(min=0)
    a = BICUBIC_A
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1, near, torch.where(x < 2, far, 0.0))


def pad_batch(images: Sequence[torch.Tensor], shapes: torch.Tensor, out_shape: tuple[int, int, int]) -> torch.Tensor:
    """Images (C_i, H_i, W_i) of one dtype and device -> one (N, C, H, W) batch, each image at its top left, in
    a fixed number of ops: the images concatenated flat (one _chunk_cat), then every padded row gathered from
    the flat buffer seen as overlapping rows of W (one index_select). `shapes` (N, 3) int64 [c, h, w] on the
    images' device: the row offsets are computed there, so the host reads nothing. A grey image fills every
    channel (its one channel repeated, as PIL's convert('RGB')); past each image's h and w the batch holds
    other pixels, not zeros: resized_crop gives them no weight."""
    c_out, h_out, w_out = out_shape
    flat = torch._chunk_cat(list(images), 0, 1)[0]  # one op for any number of images (torch >= 2.4)
    flat = torch.cat([flat, flat.new_zeros(w_out)])  # the last row's window stays inside the buffer
    rows_of_width = flat.unfold(0, w_out, 1)  # row r: flat[r:r + W], a view, no copy
    numel = shapes.prod(1)
    start = numel.cumsum(0) - numel
    c, h, w = shapes[:, 0:1, None], shapes[:, 1:2, None], shapes[:, 2:3, None]
    channel = torch.minimum(torch.arange(c_out, device=shapes.device).view(1, -1, 1), c - 1)
    row = torch.minimum(torch.arange(h_out, device=shapes.device).view(1, 1, -1), h - 1)
    offsets = start.view(-1, 1, 1) + (channel * h + row) * w
    return rows_of_width.index_select(0, offsets.flatten()).view(len(shapes), c_out, h_out, w_out)


def size_groups(sizes: np.ndarray, max_pixels: int | None = None) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Host numbers: (an order of the images, [start, stop) ranges of it) such that each range padded to its
    tallest and widest image holds at most `max_pixels` pixels (GROUP_PIXELS) or is one image: the images
    sorted by height and cut greedily. Padding an 8000-pixel-tall image and a 10000-pixel-wide one to one
    shape would ask for far more than both; a batch of like sizes is one group, one pad and one resample."""
    max_pixels = max_pixels or GROUP_PIXELS
    order = np.argsort(-sizes[:, 0], kind="stable")
    groups, start, widest = [], 0, 0
    for at, index in enumerate(order):
        widest = max(widest, int(sizes[index, 1]))
        if at > start and (at + 1 - start) * int(sizes[order[start], 0]) * widest > max_pixels:
            groups.append((start, at))
            start, widest = at, int(sizes[index, 1])
    groups.append((start, len(order)))
    return order, groups

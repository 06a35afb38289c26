"""Training augmentation of whole batches of in-memory uint8 images (Fashion-MNIST, CIFAR, synthetic).

Why not timm's per-image transform here: for 28x28 images its PIL pipeline costs ~0.4 ms an image, as much
as a small model's training step on a 2-core CPU, and it needs a loader worker that takes a core from the
model. timm and torchvision have no batched random-resized crop, so this module draws timm's crop
parameters itself (RandomResizedCropAndInterpolation.get_params: 10 attempts at an area in `scale` and a
log-uniform aspect ratio in `ratio`, else a centre crop clamped to `ratio`) and applies crop, resize and
flip to the whole batch with one `grid_sample`. Random erasing is timm's RandomErasing.

Every image's random numbers come from its sampler key (resmlp.data.loading.samplers.sample_seed), as with the
per-image path, so an image gets the same augmentation whatever the batch it lands in, the number of
processes or a restart. The numbers are drawn on the CPU from per-image generators (a few per image) and the
pixels are computed where the images are: on a GPU the dataset lives on the device (ArrayDataset.on_device)
and only the random numbers cross the bus, so an image is augmented the same on any device (exactly on the
CPU, within float tolerance on a GPU).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
import torch.nn.functional as F
from timm.data.random_erasing import RandomErasing

from resmlp.data.arrays import ArrayDataset
from resmlp.data.loading.samplers import sample_seed
from resmlp.runtime import copy_to

ATTEMPTS = 10  # timm's RandomResizedCrop tries 10 areas before it falls back to a centre crop
GRID_MODES = {"bicubic": "bicubic", "bilinear": "bilinear", "nearest": "nearest"}
LUMINANCE = (0.299, 0.587, 0.114)  # ITU-R 601-2, what PIL's convert("L") uses


class BatchAugment:
    """uint8 images (B, H, W) or (B, H, W, 3) + one seed per image -> normalised float (B, C, S, S).

    Random-resized crop to `img_size` (scale, ratio), horizontal flip with probability `hflip`, ToTensor and
    Normalize, random erasing with probability `reprob` (per-pixel normal noise, as timm's re_mode="pixel"),
    then `after` (e.g. a fixed pixel permutation) if given. `scale=ratio=(1, 1)` without flips and erasing
    reproduces ToTensor + Normalize exactly.
    """

    def __init__(self, img_size: int, in_chans: int, mean: Sequence[float], std: Sequence[float],
                 scale: Sequence[float] = (0.08, 1.0), ratio: Sequence[float] = (3 / 4, 4 / 3), hflip: float = 0.5,
                 reprob: float = 0.0, interpolation: str = "bicubic",
                 after: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        if interpolation not in GRID_MODES:
            raise ValueError(f"batch augmentation interpolates with {', '.join(GRID_MODES)}, not {interpolation!r}; "
                             "set data.batch_augment=false to use timm's per-image transform")
        if not (0 < scale[0] <= scale[1] <= 1) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"need 0 < scale[0] <= scale[1] <= 1 and 0 < ratio[0] <= ratio[1], got scale={scale}, "
                             f"ratio={ratio}")
        self.img_size, self.in_chans = img_size, in_chans
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.luminance = torch.tensor(LUMINANCE).view(1, 3, 1, 1)  # RGB -> grey, moved with the images once
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.scale, self.log_ratio = scale, (math.log(ratio[0]), math.log(ratio[1]))
        self.ratio, self.hflip, self.mode, self.after = ratio, hflip, GRID_MODES[interpolation], after
        self.erase = RandomErasing(reprob, mode="pixel", max_count=1, device="cpu") if reprob > 0 else None
        # whole image, no flip (evaluation): no random numbers to draw
        self.random = (tuple(scale), tuple(ratio), hflip) != ((1, 1), (1, 1), 0)
        self._fixed_theta: dict[tuple, torch.Tensor] = {}  # evaluation's crop maps, by batch size, shape and device

    def __call__(self, images: torch.Tensor, seeds: Sequence[int]) -> torch.Tensor:
        """Augment `images` on their own device (CPU or GPU)."""
        if len(images) != len(seeds):
            raise ValueError(f"{len(images)} images but {len(seeds)} seeds")
        device = images.device
        x = self._channels(images)
        height, width = x.shape[-2:]
        theta = self._fixed_theta.get((len(x), height, width, device)) if not self.random else None
        if theta is None:
            theta = self._theta(seeds, height, width, device)
            if not self.random:  # the same map for every batch of this size: copied to the device once
                self._fixed_theta[(len(x), height, width, device)] = theta
        grid = F.affine_grid(theta, [len(x), x.shape[1], self.img_size, self.img_size], align_corners=False)
        x = F.grid_sample(x, grid, mode=self.mode, padding_mode="border", align_corners=False)
        if self.mean.device != device:  # once: the statistics then live where the images are
            self.mean, self.std = copy_to(self.mean, device), copy_to(self.std, device)
        x = (x.clamp(0, 255) / 255 - self.mean) / self.std
        if self.erase is not None:
            if device.type == "cpu":
                self._erase(x, seeds)
            else:
                self._erase_on_device(x, seeds)
        return self.after(x) if self.after is not None else x

    def _theta(self, seeds: Sequence[int], height: int, width: int, device: torch.device) -> torch.Tensor:
        """The batch's affine maps from output to input coordinates (N, 2, 3) on `device`: drawn per image on the
        CPU, then one small copy."""
        if self.random:
            u = torch.stack([torch.rand(2 * ATTEMPTS + 3, generator=torch.Generator().manual_seed(s)) for s in seeds])
        else:  # zeros pick the full-area, unflipped box
            u = torch.zeros(len(seeds), 2 * ATTEMPTS + 3)
        # the boxes are a few numbers an image: computed on the CPU, then one small copy
        top, left, h, w = self._crop_boxes(u, height, width)
        flip = u[:, -1] < self.hflip
        # affine map from output to input coordinates (align_corners=False: -1 and 1 are the outer pixel edges)
        theta = torch.zeros(len(seeds), 2, 3)
        theta[:, 0, 0] = torch.where(flip, -w / width, w / width)
        theta[:, 0, 2] = (2 * left + w) / width - 1
        theta[:, 1, 1] = h / height
        theta[:, 1, 2] = (2 * top + h) / height - 1
        return copy_to(theta, device)

    def _channels(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) float in [0, 255] with the model's channel count (as ArrayDataset's PIL modes)."""
        x = images.float()
        x = x.unsqueeze(1) if x.dim() == 3 else x.permute(0, 3, 1, 2)
        if x.shape[1] == 3 and self.in_chans == 1:
            if self.luminance.device != x.device:
                self.luminance = copy_to(self.luminance, x.device)
            x = (x * self.luminance).sum(1, keepdim=True)
        elif x.shape[1] == 1 and self.in_chans == 3:
            x = x.expand(-1, 3, -1, -1)
        return x

    def _crop_boxes(self, u: torch.Tensor, height: int, width: int) -> tuple[torch.Tensor, ...]:
        """timm's random-resized-crop boxes (top, left, h, w) from per-image uniforms u[:, :2*ATTEMPTS+2]."""
        area = height * width * (self.scale[0] + (self.scale[1] - self.scale[0]) * u[:, :ATTEMPTS])
        aspect = torch.exp(self.log_ratio[0] + (self.log_ratio[1] - self.log_ratio[0]) * u[:, ATTEMPTS:2 * ATTEMPTS])
        w_try, h_try = torch.sqrt(area * aspect).round(), torch.sqrt(area / aspect).round()
        fits = (w_try <= width) & (h_try <= height)
        first = fits.int().argmax(dim=1, keepdim=True)  # the first attempt that fits
        w, h = w_try.gather(1, first)[:, 0], h_try.gather(1, first)[:, 0]
        # fallback: the whole image, narrowed to the nearest allowed aspect ratio, centred
        in_ratio = width / height
        fw = min(width, round(height * self.ratio[1])) if in_ratio > self.ratio[1] else width
        fh = min(height, round(width / self.ratio[0])) if in_ratio < self.ratio[0] else height
        found = fits.any(dim=1)
        w, h = torch.where(found, w, float(fw)), torch.where(found, h, float(fh))
        top = torch.where(found, torch.floor(u[:, -3] * (height - h + 1)), (height - h) // 2)
        left = torch.where(found, torch.floor(u[:, -2] * (width - w + 1)), (width - w) // 2)
        return top, left, h, w

    def _erase(self, x: torch.Tensor, seeds: Sequence[int]) -> None:
        """timm's RandomErasing per image, its RNGs seeded from the image's seed; the step's RNGs are kept."""
        python_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            for image, seed in zip(x, seeds, strict=True):
                random.seed(seed)
                torch.default_generator.manual_seed(seed)
                self.erase(image)
        random.setstate(python_state)

    def _erase_on_device(self, x: torch.Tensor, seeds: Sequence[int]) -> None:
        """The same erasing as `_erase` for images on a GPU: timm draws each erased box and its noise on the CPU,
        exactly as it would for a CPU image (it paints a NaN canvas, which shows the box), and only the box's
        pixels are copied to the device."""
        python_state = random.getstate()
        with torch.random.fork_rng(devices=[]):
            for image, seed in zip(x, seeds, strict=True):
                random.seed(seed)
                if random.random() > self.erase.probability:  # timm's own first draw: most images keep theirs
                    continue
                random.seed(seed)
                torch.default_generator.manual_seed(seed)
                canvas = torch.full(image.shape, math.nan)
                self.erase(canvas)
                painted = ~canvas.isnan()
                rows, cols = painted.any(dim=(0, 2)).nonzero()[:, 0], painted.any(dim=(0, 1)).nonzero()[:, 0]
                if len(rows):
                    box = (slice(None), slice(int(rows[0]), int(rows[-1]) + 1), slice(int(cols[0]), int(cols[-1]) + 1))
                    image[box] = copy_to(canvas[box], image.device)
        random.setstate(python_state)


def array_batches(dataset: ArrayDataset, keys: Iterable[tuple[int, int, int, int]], batch_size: int,
                  augment: BatchAugment, drop_last: bool = True, device: torch.device | None = None,
                  ) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """(images, targets, 0 skipped) batches of `dataset` in the order of `keys` (ResumableSampler's
    (seed, epoch, position, index)), the last partial batch dropped when `drop_last`. With a `device` (the
    trainer gives one for GPUs), the dataset is kept there (ArrayDataset.on_device) and batches are gathered and
    augmented on it; without, they are gathered from the numpy arrays (the fastest on a CPU)."""
    resident = device is not None
    if resident:
        all_images, all_labels = dataset.on_device(device)
    keys = iter(keys)
    while batch := list(itertools.islice(keys, batch_size)):
        if drop_last and len(batch) < batch_size:
            return
        index = [key[3] for key in batch]
        if resident:
            where = copy_to(torch.tensor(index), device)
            images, labels = all_images[where], all_labels[where]
        else:
            images, labels = torch.from_numpy(dataset.images[index]), torch.from_numpy(dataset.labels[index])
        yield augment(images, [sample_seed(key) for key in batch]), labels, 0


def eval_batches(dataset: ArrayDataset, indices: Iterable[int], batch_size: int, preprocess: BatchAugment,
                 device: torch.device | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
    """Evaluation batches of `indices` with a deterministic `preprocess` (no random crop, flip or erasing)."""
    return array_batches(dataset, ((0, 0, i, i) for i in indices), batch_size, preprocess, drop_last=False,
                         device=device)

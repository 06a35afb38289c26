"""resmlp.data.device.resample: batched resized crops of images of different sizes against PIL's crop + resize
(what timm's RandomResizedCropAndInterpolation and torchvision's resized_crop run on PIL images): within 1 level
on >= 99.5 % of pixels, for down- and upscaling, bicubic and bilinear, in one batch of mixed sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from resmlp.data.device import resample
from resmlp.data.device.resample import resized_crop

PIL_MODES = {"bicubic": Image.BICUBIC, "bilinear": Image.BILINEAR}
OUT = (37, 41)


def photo(h: int, w: int, seed: int) -> np.ndarray:
    """A photo-like RGB image: smooth gradients and edges plus sensor noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 3 + 20 * np.sin(yy / 5), yy * 4 + xx, 128 + 60 * np.cos((xx + yy) / 9)], -1)
    return np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)


def mixed_batch(count: int = 12, seed: int = 0):
    """(images, sizes, boxes): photos of 20-120 px with random boxes (crops smaller and larger than OUT)."""
    rng = np.random.default_rng(seed)
    images, sizes, boxes = [], [], []
    for i in range(count):
        h, w = (int(v) for v in rng.integers(20, 120, 2))
        bh, bw = int(rng.integers(3, h + 1)), int(rng.integers(3, w + 1))
        images.append(photo(h, w, i))
        sizes.append((h, w))
        boxes.append((int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1)), bh, bw))
    return images, sizes, boxes


def padded(images: list[np.ndarray]) -> torch.Tensor:
    out = torch.zeros(len(images), 3, max(i.shape[0] for i in images), max(i.shape[1] for i in images),
                      dtype=torch.uint8)
    for i, image in enumerate(images):
        out[i, :, :image.shape[0], :image.shape[1]] = torch.from_numpy(image).permute(2, 0, 1)
    return out


def pils(images, boxes, mode: str) -> np.ndarray:
    return np.stack([np.asarray(Image.fromarray(image).crop((left, top, left + w, top + h))
                                .resize(OUT[::-1], PIL_MODES[mode])) for image, (top, left, h, w)
                     in zip(images, boxes, strict=True)]).astype(int)


def within_one_level(ours: torch.Tensor, theirs: np.ndarray) -> float:
    rounded = torch.floor(ours + 0.5).clamp(0, 255).permute(0, 2, 3, 1).numpy().astype(int)
    return float((np.abs(rounded - theirs) <= 1).mean())


@pytest.mark.parametrize("mode", ["bicubic", "bilinear"])
def test_a_mixed_batch_matches_pils_crop_and_resize(mode):
    images, sizes, boxes = mixed_batch()
    ours = resized_crop(padded(images), torch.tensor(sizes), torch.tensor(boxes), OUT, mode)
    assert ours.shape == (len(images), 3, *OUT) and ours.dtype == torch.float32
    assert within_one_level(ours, pils(images, boxes, mode)) >= 0.995
    # float input of the same pixels: the same result but for PIL's uint8 intermediate
    floats = resized_crop(padded(images).float(), torch.tensor(sizes), torch.tensor(boxes), OUT, mode)
    assert within_one_level(floats, pils(images, boxes, mode)) >= 0.99


def test_a_shifted_box_or_a_wrong_kernel_is_caught(monkeypatch):
    images, sizes, boxes = mixed_batch()
    theirs = pils(images, boxes, "bicubic")
    shifted = torch.tensor(boxes) + torch.tensor([1, 0, 0, 0])
    shifted[:, 2] -= 1
    assert within_one_level(resized_crop(padded(images), torch.tensor(sizes), shifted, OUT), theirs) < 0.9
    monkeypatch.setattr(resample, "BICUBIC_A", -0.75)
    wrong = resized_crop(padded(images), torch.tensor(sizes), torch.tensor(boxes), OUT)
    assert within_one_level(wrong, theirs) < 0.99


def test_padding_does_not_leak_into_the_crop():
    images, sizes, boxes = mixed_batch(4)
    batch = padded(images)
    noisy = batch.clone()
    for i, (h, w) in enumerate(sizes):
        noisy[i, :, h:, :] = 255
        noisy[i, :, :, w:] = 255
    full = [(0, 0, h, w) for h, w in sizes]
    for chosen in (boxes, full):
        assert torch.equal(resized_crop(batch, torch.tensor(sizes), torch.tensor(chosen), OUT),
                           resized_crop(noisy, torch.tensor(sizes), torch.tensor(chosen), OUT))


def test_images_of_unlike_sizes_are_padded_in_groups_within_the_bound():
    sizes = np.array([[8000, 100], [100, 8000], [90, 7000], [500, 375], [480, 500]])
    order, groups = resample.size_groups(sizes, max_pixels=3 * 500 * 500)
    assert sorted(order.tolist()) == list(range(5)) and groups[0][0] == 0 and groups[-1][1] == 5
    for start, stop in groups:
        members = sizes[order[start:stop]]
        assert stop - start == 1 or (stop - start) * members[:, 0].max() * members[:, 1].max() <= 3 * 500 * 500
    # the tall one alone, the two photos together, the wide ones apart (two of them would pass the bound); one
    # padded batch would hold 5 x 8000 x 8000 pixels
    assert len(groups) == 4


def test_the_deit_crops_are_the_same_in_one_group_or_many(monkeypatch):
    from resmlp.data.device.augment import DeviceAugment

    images, _, _ = mixed_batch(6)
    tensors = [torch.from_numpy(image).permute(2, 0, 1) for image in images]
    augment = DeviceAugment(24, 3, (0.5,) * 3, (0.5,) * 3, auto_augment="rand-m9-mstd0.5-inc1", reprob=0.5)
    whole = augment(tensors, list(range(6)))
    monkeypatch.setattr(resample, "GROUP_PIXELS", 1)  # every image its own group
    assert torch.allclose(augment(tensors, list(range(6))), whole, atol=1e-5)

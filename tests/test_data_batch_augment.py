"""Batch augmentation of in-memory images: exact where it should be exact, timm's crop distribution, seeds."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data.transforms import RandomResizedCropAndInterpolation
from torchvision import transforms

from resmlp.data import synthetic
from resmlp.data.device.batch_augment import BatchAugment, array_batches, eval_batches
from resmlp.data.loading.assemble import build_data
from resmlp.data.loading.samplers import ResumableSampler, sample_seed
from resmlp.train.config import load_config
from resmlp.train.state import seed_step

MEAN, STD = (0.3,), (0.2,)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    return torch.from_numpy(synthetic("train", 12, 3, 20).images.copy())


def reference(images: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    """What the per-image path gives without augmentation: ToTensor + Normalize."""
    to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    return torch.stack([to_tensor(image.numpy()) for image in images])


def test_no_augmentation_is_exactly_to_tensor_and_normalize(images):
    out = BatchAugment(20, 1, MEAN, STD, scale=(1, 1), ratio=(1, 1), hflip=0.0)(images, list(range(12)))
    assert out.shape == (12, 1, 20, 20)
    torch.testing.assert_close(out, reference(images), atol=1e-5, rtol=0)


def test_flip_probability_one_mirrors_every_image(images):
    out = BatchAugment(20, 1, MEAN, STD, scale=(1, 1), ratio=(1, 1), hflip=1.0)(images, list(range(12)))
    torch.testing.assert_close(out, reference(images).flip(-1), atol=1e-5, rtol=0)


def test_an_image_gets_the_same_augmentation_in_any_batch(images):
    aug = BatchAugment(20, 1, MEAN, STD, scale=(0.3, 1), hflip=0.5, reprob=0.5)
    seeds = [sample_seed((0, 1, p, p)) for p in range(12)]
    batch = aug(images, seeds)
    torch.testing.assert_close(aug(images[5:6], seeds[5:6]), batch[5:6], atol=1e-6, rtol=0)
    torch.testing.assert_close(aug(images.flip(0), seeds[::-1]), batch.flip(0), atol=1e-6, rtol=0)
    assert not torch.allclose(aug(images, [s + 1 for s in seeds]), batch)  # other seeds, other crops


def test_crop_boxes_follow_timms_random_resized_crop():
    aug = BatchAugment(28, 1, MEAN, STD, scale=(0.35, 1.0), ratio=(3 / 4, 4 / 3))
    u = torch.stack([torch.rand(23, generator=torch.Generator().manual_seed(s)) for s in range(2000)])
    top, left, h, w = aug._crop_boxes(u, 28, 28)
    area = h * w / 28**2
    assert area.min() >= 0.35 - 0.06 and area.max() <= 1.0  # rounding w and h to pixels moves area a little
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 28).all() and (left + w <= 28).all()
    aspect = torch.log(w / h)
    assert aspect.min() >= math.log(3 / 4) - 0.1 and aspect.max() <= math.log(4 / 3) + 0.1
    assert top.unique().numel() > 5 and left.unique().numel() > 5  # random positions
    # the same distribution as timm's own sampler (large non-square boxes don't fit and are redrawn)
    random.seed(0)
    boxes = [RandomResizedCropAndInterpolation.get_params(Image.new("L", (28, 28)), (0.35, 1.0), (3 / 4, 4 / 3))
             for _ in range(2000)]
    timm_area = torch.tensor([b[2] * b[3] / 28**2 for b in boxes])
    assert area.mean().item() == pytest.approx(timm_area.mean().item(), abs=0.015)
    assert area.std().item() == pytest.approx(timm_area.std().item(), abs=0.015)


def test_crop_falls_back_to_a_centred_box_clamped_to_the_ratio():
    # an aspect of exactly 2 on a square image never fits at full area: timm then centres a 28x14 box
    top, left, h, w = BatchAugment(28, 1, MEAN, STD, scale=(1, 1), ratio=(2, 2))._crop_boxes(torch.rand(4, 23), 28, 28)
    assert w.tolist() == [28] * 4 and h.tolist() == [14] * 4 and top.tolist() == [7] * 4 and left.tolist() == [0] * 4


def test_a_crop_magnifies_the_chosen_box():
    # columns numbered 0..27: a 14-wide box resized to 28 shows 14 consecutive columns, twice as wide
    columns = torch.arange(28, dtype=torch.uint8).repeat(28, 1)[None]
    aug = BatchAugment(28, 1, (0.0,), (1 / 255,), scale=(0.25, 0.25), ratio=(1, 1), hflip=0.0,
                       interpolation="nearest")
    out = aug(columns, [3])[0, 0]
    row = out[0]
    assert (out == row).all() and (row[1:] >= row[:-1]).all()
    assert row.unique().numel() == 14 and row.max() - row.min() == 13


def test_channels_follow_the_model(images):
    rgb = torch.from_numpy(np.stack([images.numpy()] * 3, axis=-1))
    gray_from_rgb = BatchAugment(20, 1, MEAN, STD, scale=(1, 1), ratio=(1, 1), hflip=0.0)(rgb, list(range(12)))
    torch.testing.assert_close(gray_from_rgb, reference(images), atol=1e-4, rtol=0)
    rgb_from_gray = BatchAugment(20, 3, MEAN * 3, STD * 3, scale=(1, 1), ratio=(1, 1), hflip=0.0)(images, [0] * 12)
    torch.testing.assert_close(rgb_from_gray, reference(images).expand(-1, 3, -1, -1), atol=1e-5, rtol=0)


def test_random_erasing_erases_and_leaves_the_step_rngs_alone(images):
    plain = BatchAugment(20, 1, MEAN, STD, scale=(1, 1), ratio=(1, 1), hflip=0.0)(images, list(range(12)))
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    erased = BatchAugment(20, 1, MEAN, STD, scale=(1, 1), ratio=(1, 1), hflip=0.0, reprob=1.0)(images, list(range(12)))
    assert torch.equal(torch.rand(3), expected)  # dropout and drop-path draw the same numbers as without erasing
    changed = (erased != plain).flatten(1).float().mean(1)
    assert (changed > 0.01).all() and (changed < 1).all()  # every image has one erased box, not all of it


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="interpolates with"):
        BatchAugment(20, 1, MEAN, STD, interpolation="lanczos")
    with pytest.raises(ValueError, match="scale"):
        BatchAugment(20, 1, MEAN, STD, scale=(0.5, 1.5))


def test_array_batches_follow_the_sampler_and_drop_the_partial_batch():
    ds = synthetic("train", 10, 2, 8)
    sampler = ResumableSampler(ds, seed=0)
    sampler.set_position(0, skip=2)
    aug = BatchAugment(8, 1, MEAN, STD, scale=(1, 1), ratio=(1, 1), hflip=0.0)
    batches = list(array_batches(ds, iter(sampler), 3, aug))
    assert len(batches) == 2  # 8 remaining samples: two batches of 3, the last 2 dropped
    order = [key[3] for key in sampler][:6]
    assert torch.cat([t for _, t, _ in batches]).tolist() == ds.labels[order].tolist()
    torch.testing.assert_close(batches[0][0], reference(torch.from_numpy(ds.images[order[:3]])), atol=1e-5, rtol=0)


def test_trainer_data_picks_the_batch_path_only_where_it_applies():
    base = {"data.kind": "synthetic", "model.img_size": 16, "data.crop_pct": 1.0}
    data = build_data(load_config("fashion-mnist-quick", base).data, 1, 16, 0)
    assert data.train_augment is not None and data.val_batched is not None
    for off in ({"data.batch_augment": False}, {"data.auto_augment": "rand-m6-mstd0.5-inc1"}):
        assert build_data(load_config("fashion-mnist-quick", {**base, **off}).data, 1, 16, 0).train_augment is None
    # an evaluation crop (resize, then centre crop) stays on the per-image transform
    cropped = build_data(load_config("fashion-mnist-quick", {**base, "data.crop_pct": 0.875}).data, 1, 16, 0)
    assert cropped.train_augment is not None and cropped.val_batched is None


@pytest.mark.parametrize("permute", ["none", "global"])
def test_batched_evaluation_equals_the_per_image_transform(permute):
    cfg = load_config("fashion-mnist-quick", {"data.kind": "synthetic", "model.img_size": 16, "data.crop_pct": 1.0,
                                              "data.permute": permute})
    data = build_data(cfg.data, 1, 16, cfg.train.seed)
    per_image = torch.stack([data.val[i][0] for i in range(len(data.val))])
    batches = list(eval_batches(data.val, range(len(data.val)), 10, data.val_batched))
    assert [len(t) for _, t, _ in batches] == [10] * 6 + [4]  # 64 images: the partial batch is kept
    torch.testing.assert_close(torch.cat([x for x, _, _ in batches]), per_image, atol=1e-5, rtol=0)
    assert torch.cat([t for _, t, _ in batches]).tolist() == data.val.targets


def test_step_seeds_are_the_same_in_every_process():
    # resume and DDP rely on it: a str in the seeded tuple would hash differently per process
    seed_step(3, 11, 1)
    here = torch.rand(4)
    code = ("import torch; from resmlp.train.state import seed_step; seed_step(3, 11, 1); "
            "print(torch.rand(4).tolist())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert torch.tensor(eval(there)).equal(here)

"""DINO pieces and frozen-feature evaluation, on synthetic data."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

import resmlp
from resmlp.train.dino import DINOHead, DINOLoss, DINOModel, MultiCropTransform, cosine_schedule
from resmlp.train.probe import knn_accuracy, linear_probe_accuracy


def _separable(n: int, dim: int = 16, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    centers = np.random.default_rng(0).normal(size=(classes, dim)) * 3
    rng = np.random.default_rng(seed + 1)
    labels = rng.integers(0, classes, n)
    return centers[labels] + rng.normal(size=(n, dim)), labels


def test_knn_and_linear_probe_on_a_separable_set():
    train_x, train_y = _separable(400)
    test_x, test_y = _separable(200, seed=1)
    assert knn_accuracy(train_x, train_y, test_x, test_y) >= 95
    assert linear_probe_accuracy(train_x, train_y, test_x, test_y) >= 95
    # and they are not always high: random labels give chance level
    shuffled = np.random.default_rng(2).permutation(test_y)
    assert knn_accuracy(train_x, train_y, test_x, shuffled) < 60


def test_head_output_and_frozen_norm():
    head = DINOHead(32, out_dim=64, hidden_dim=48, bottleneck_dim=16)
    out = head(torch.randn(5, 32))
    assert out.shape == (5, 64)
    g = head.last_layer.parametrizations.weight.original0
    assert not g.requires_grad and torch.all(g == 1)
    # rows of the last layer are unit-norm, so |logit| <= 1 for a unit bottleneck vector
    assert out.abs().max() <= 1 + 1e-5


def test_dino_loss_centres_and_prefers_matching_views():
    loss = DINOLoss(out_dim=8, num_crops=3, warmup_teacher_temp=0.04, teacher_temp=0.07, warmup_epochs=2, epochs=5)
    assert torch.allclose(loss.teacher_temps[:2], torch.tensor([0.04, 0.07]))
    view = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    teacher = torch.cat([view, view])  # 2 global crops of a batch of 4 that agree with each other
    agree = loss(torch.cat([view, view, view]) * 10, teacher, epoch=0)  # 3 student crops
    loss.center.zero_()
    disagree = loss(torch.cat([-view, -view, -view]) * 10, teacher, epoch=0)
    assert agree < disagree
    assert loss.center.abs().sum() > 0  # the centre moved towards the teacher mean


def test_cosine_schedule_goes_from_start_to_end():
    m = cosine_schedule(0.996, 1.0, 10)  # DINO's utils.cosine_scheduler: cos(pi * i / 10), i < 10
    assert m[0] == 0.996 and 0.9999 < m[-1] < 1.0 and all(a <= b for a, b in zip(m, m[1:], strict=False))
    assert abs(m[5] - 0.998) < 1e-12  # half-way on a cosine is the mean


def test_multicrop_gives_global_size_crops_and_model_runs():
    transform = MultiCropTransform(28, mean=(0.5,), std=(0.5,), num_local=3, grayscale=True)
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (28, 28), dtype=np.uint8))
    crops = transform(image)
    assert len(crops) == 5 and all(c.shape == (1, 28, 28) for c in crops)
    backbone = resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, dim=16, depth=1, num_classes=0)
    model = DINOModel(backbone, DINOHead(16, out_dim=32, hidden_dim=24, bottleneck_dim=8))
    batch = [torch.stack([c] * 2) for c in crops]
    assert model(batch).shape == (10, 32)


def test_grayscale_multicrop_jitters_intensity():
    # crops, flips and blur leave a uniform image unchanged; only the brightness/contrast jitter (and
    # solarisation) change its level, so views of one image must not all share its intensity
    torch.manual_seed(0)
    transform = MultiCropTransform(28, mean=(0.0,), std=(1.0,), num_local=2, grayscale=True)
    image = Image.new("L", (28, 28), color=100)
    levels = {round(c.mean().item(), 4) for _ in range(10) for c in transform(image)}
    assert len(levels) > 5, f"views of a uniform image kept {levels}: no photometric augmentation"


def test_only_the_second_global_view_is_solarised():
    # a white image stays above 0.6 under brightness jitter (factor >= 0.6); only solarisation (255 - x for
    # x >= 128) takes it below 0.45, and DINO solarises the second global view alone
    torch.manual_seed(0)
    transform = MultiCropTransform(28, mean=(0.0,), std=(1.0,), num_local=1, grayscale=True)
    image = Image.new("L", (28, 28), color=255)
    views = [transform(image) for _ in range(60)]
    solarised = [sum(v[i].mean().item() < 0.45 for v in views) for i in range(3)]
    assert solarised[0] == 0 and solarised[2] == 0 and 3 <= solarised[1] <= 25, solarised

"""DINO as DINO's code does it (facebookresearch/dino): the Gaussian blur (utils.GaussianBlur), per-parameter
gradient clipping (utils.clip_gradients), the cosine schedules (utils.cosine_scheduler), each against a twin of
DINO's function written from its source."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image, ImageFilter
from torch import nn

from resmlp.train.dino import DINOGaussianBlur, cosine_schedule
from resmlp.train.sections import ScheduleConfig
from resmlp.train.step import lr_scheduler, total_grad_norm


def dino_cosine_scheduler(base, final, epochs, niter_per_ep, warmup_epochs=0, start_warmup_value=0):
    """DINO's utils.cosine_scheduler, as written there (numpy)."""
    warmup = np.linspace(start_warmup_value, base, warmup_epochs * niter_per_ep) if warmup_epochs > 0 else []
    iters = np.arange(epochs * niter_per_ep - warmup_epochs * niter_per_ep)
    cosine = final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))
    return np.concatenate((warmup, cosine))


def dino_clip_gradients(model: nn.Module, clip: float) -> None:
    """DINO's utils.clip_gradients: each parameter's gradient norm clipped to `clip` alone."""
    for p in model.parameters():
        if p.grad is not None:
            norm = p.grad.data.norm(2)
            coef = clip / (norm + 1e-6)
            if coef < 1:
                p.grad.data.mul_(coef)


def test_the_blur_is_pils_full_kernel_at_a_radius_drawn_from_dinos_range():
    image = Image.new("L", (31, 31), 0)
    image.putpixel((15, 15), 255)
    blur = DINOGaussianBlur()
    torch.manual_seed(3)
    radius = 0.1 + 1.9 * float(torch.rand(()))
    torch.manual_seed(3)
    ours = np.asarray(blur(image))
    assert np.array_equal(ours, np.asarray(image.filter(ImageFilter.GaussianBlur(radius=radius))))
    # a wide radius spreads past the 3x3 neighbourhood a 3x3 kernel (torchvision GaussianBlur(3)) is limited to
    wide = np.asarray(image.filter(ImageFilter.GaussianBlur(radius=2.0)))
    assert wide[15, 18] > 0
    radii = [0.1 + 1.9 * float(torch.rand(())) for _ in range(200)]
    assert 0.1 <= min(radii) < 0.3 and 1.8 < max(radii) <= 2.0


def test_per_parameter_clipping_equals_dinos_clip_gradients_and_differs_from_the_global_norm():
    torch.manual_seed(0)
    ours, dinos, global_ = (nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)) for _ in range(3))
    grads = [torch.randn_like(p) * scale for p, scale in zip(ours.parameters(), (10.0, 0.1, 5.0, 0.01),
                                                                  strict=True)]
    for model in (ours, dinos, global_):
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g.clone()
    norm = total_grad_norm(ours, 3.0, "per_param")
    dino_clip_gradients(dinos, 3.0)
    total_grad_norm(global_, 3.0, "norm")
    for a, b in zip(ours.parameters(), dinos.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert max(p.grad.norm().item() for p in ours.parameters()) <= 3.0 + 1e-5
    assert norm.item() == pytest.approx(torch.stack([g.norm() for g in grads]).norm().item(), rel=1e-6)  # pre-clip
    small = list(global_.parameters())[3].grad  # the global norm shrinks even the small gradients
    assert small.norm() < grads[3].norm() * 0.5 and torch.equal(list(ours.parameters())[3].grad, grads[3])


def test_global_clipping_clips_as_torchs_clip_grad_norm_on_the_parameters():
    """train.clip_mode norm: the gradients' global norm is at most clip_grad afterwards, and the returned norm is
    the one before clipping (it was 0 and nothing was clipped when clip_grad_norm_ was handed the grads)."""
    torch.manual_seed(1)
    ours, torchs = nn.Linear(6, 3), nn.Linear(6, 3)
    for a, b in zip(ours.parameters(), torchs.parameters(), strict=True):
        a.grad = torch.randn_like(a) * 10
        b.grad = a.grad.clone()
    norm = total_grad_norm(ours, 1.0, "norm")
    expected = nn.utils.clip_grad_norm_(list(torchs.parameters()), 1.0)
    assert norm.item() == pytest.approx(expected.item()) and expected.item() > 10
    for a, b in zip(ours.parameters(), torchs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    assert torch.stack([p.grad.norm() for p in ours.parameters()]).norm().item() == pytest.approx(1.0, rel=1e-4)
    for p in ours.parameters():
        p.grad[0] = float("nan")
    assert not torch.isfinite(total_grad_norm(ours, 1.0, "norm"))  # the step guard sees NaN gradients


def test_momentum_and_weight_decay_follow_dinos_cosine_scheduler():
    ours = cosine_schedule(0.996, 1.0, 37)
    np.testing.assert_allclose(ours, dino_cosine_scheduler(0.996, 1.0, 37, 1), rtol=0, atol=1e-15)
    assert ours[0] == 0.996 and ours[-1] < 1.0  # DINO stops one step short of the final value


def test_warmup_prefix_starts_the_cosine_after_the_warmup_as_dino():
    epochs, warmup, per_epoch, lr, min_lr = 6, 2, 5, 0.1, 1e-3
    params = [nn.Parameter(torch.zeros(1))]

    def lrs(prefix: bool) -> list[float]:
        optimizer = torch.optim.SGD(params, lr=lr)
        s = ScheduleConfig(epochs=epochs, warmup_epochs=warmup, warmup_lr=0.0, min_lr=min_lr, warmup_prefix=prefix)
        scheduler = lr_scheduler(optimizer, s, per_epoch)
        out = []
        for step in range(epochs * per_epoch):
            scheduler.step_update(step)
            out.append(optimizer.param_groups[0]["lr"])
        return out

    dino = dino_cosine_scheduler(lr, min_lr, epochs, per_epoch, warmup)
    after = slice(warmup * per_epoch, None)
    np.testing.assert_allclose(lrs(True)[after], dino[after], rtol=1e-12)
    assert lrs(True)[warmup * per_epoch] == pytest.approx(lr)  # the peak right after the warm-up
    assert lrs(False)[warmup * per_epoch] < lr - 1e-3  # timm's default: the cosine already began in the warm-up
    assert not math.isclose(lrs(False)[-1], dino[-1])

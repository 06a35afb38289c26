"""DINO's multi-crop as batch ops (resmlp.data.device.multi_crop) against torchvision's per-image ops and DINO's
PIL transform (resmlp.train.dino.MultiCropTransform, whose values follow DINO's main_dino.py).

Stated bounds:
- per op, same arguments: the batched brightness, contrast, saturation, hue, jitter in a per-image order and
  per-image Gaussian blur within 1e-5 of torchvision.transforms.v2.functional's op on each image (float
  pixels in [0, 1]); a whole view within 1e-4 of torchvision's ops run one image at a time from the same drawn
  numbers (resize aside: resmlp.data.device.resample's own tests hold it to PIL);
- in distribution over 10,000 images: crop boxes against torchvision's RandomResizedCrop.get_params with DINO's
  scales (KS per coordinate), how often each op fires against the probabilities MultiCropTransform sets
  (binomial), jitter factors and blur radii against their uniform ranges (KS), the jitter order's first op
  (chi-square), each at p > 1e-4; a wrong rule is caught;
- op count: the aten ops of a batch of 12 views do not grow with the batch (<= 1.2x from 8 to 64) and stay
  under 3,000, on CPU tensors and on fake CUDA, where nothing reads back to the host.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torchvision import transforms as T
from torchvision.transforms import functional as TF1
from torchvision.transforms.v2 import functional as TF

from resmlp.data.device import multi_crop as mc
from resmlp.train.dino import MultiCropTransform

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import device_op_counts as op_counts  # noqa: E402

DRAWS = 10_000
P_MIN = 1e-4
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def floats(n: int = 6, h: int = 12, w: int = 14, c: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.rand((n, c, h, w), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------- ops, one by one
@pytest.mark.parametrize(("name", "low", "high"), [("brightness", 0.6, 1.4), ("contrast", 0.6, 1.4),
                                                   ("saturation", 0.8, 1.2), ("hue", -0.1, 0.1)])
def test_batched_jitter_ops_match_torchvisions_per_image(name, low, high):
    x = floats()
    factors = torch.linspace(low, high, len(x))
    ours = getattr(mc, f"adjust_{name}")(x, factors)
    theirs = torch.stack([getattr(TF, f"adjust_{name}")(image, float(f)) for image, f in zip(x, factors, strict=True)])
    assert torch.allclose(ours, theirs, atol=1e-5)
    if name != "hue":  # a factor given to the wrong image is caught
        assert not torch.allclose(getattr(mc, f"adjust_{name}")(x, factors.flip(0)), theirs, atol=1e-3)


def test_contrast_of_a_grey_batch_uses_each_images_own_mean():
    x = floats(c=1)
    factors = torch.linspace(0.6, 1.4, len(x))
    theirs = torch.stack([TF.adjust_contrast(image, float(f)) for image, f in zip(x, factors, strict=True)])
    assert torch.allclose(mc.adjust_contrast(x, factors), theirs, atol=1e-5)


def jitter_steps(factors: np.ndarray, order: np.ndarray, in_chans: int = 3) -> list[mc.JitterStep]:
    """jitter_plan's steps for these factors and orders, as tensors (what the upload gives the device)."""
    rows = np.zeros((len(factors), mc.ROW))
    rows[:, 1:5], rows[:, 5:9] = factors, order
    return [mc.JitterStep(s.op, torch.from_numpy(s.index), torch.from_numpy(s.factor).float())
            for s in mc.jitter_plan(rows, in_chans)]


def test_jitter_runs_in_each_images_own_order():
    x = floats()
    factors = np.array([[1.3, 0.7, 1.15, 0.08]] * len(x))
    factors[2] = mc.NEUTRAL  # this image's RandomApply skipped the jitter
    order = np.stack([np.random.default_rng(i).permutation(4) for i in range(len(x))])
    ours = mc.color_jitter(x, jitter_steps(factors, order))
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for image, out, perm, row in zip(x, ours, order, factors, strict=True):
        for index in perm.tolist():
            image = ops[index](image, float(row[index]))
        assert torch.allclose(out, image, atol=1e-5)
    # one fixed order for all is caught: the ops do not commute
    fixed = mc.color_jitter(x, jitter_steps(factors, np.tile(np.arange(4), (len(x), 1))))
    assert not torch.allclose(fixed, ours, atol=1e-3)
    assert len(mc.jitter_plan(np.zeros((4, mc.ROW)) + np.r_[0, 1.2, 1.2, 1, 0, 0, 1, 2, 3, np.zeros(15)], 1)) == 2


def test_per_image_blur_matches_torchvisions_gaussian_blur():
    x = floats(h=16, w=18)
    sigma = np.linspace(0.1, 2.0, len(x))
    apply = np.array([True, True, False, True, True, True])
    ours = mc.gaussian_blur(x, torch.from_numpy(mc.blur_kernels(apply, sigma)).float())
    for image, out, s, on in zip(x, ours, sigma, apply, strict=True):
        size = 2 * math.ceil(3 * s) + 1  # resmlp.train.dino.DINOGaussianBlur's kernel on tensors
        theirs = TF1.gaussian_blur(image, [size, size], [float(s), float(s)]) if on else image
        assert torch.allclose(out, theirs, atol=1e-5)
    wrong = mc.gaussian_blur(x, torch.from_numpy(mc.blur_kernels(apply, sigma[::-1].copy())).float())
    assert not torch.allclose(wrong[0], ours[0], atol=1e-3)


def test_a_view_equals_torchvisions_ops_one_image_at_a_time():
    """augment_views on a batch = flip, jitter in the image's order, grey, blur, solarize by torchvision per
    image, from the same drawn row; normalised after."""
    aug = mc.MultiCropAugment(16, 3, MEAN, STD, num_local=0)
    x = floats(n=8, h=16, w=16, seed=3)
    rows = aug.draw(list(range(8)), np.full((8, 2), 16))["rows"][1]  # the second global view: solarize too
    rows[:, 10] = 1  # solarize all, so the threshold is exercised
    ours = aug.augment_views(x, torch.from_numpy(rows).float(), jitter_steps(rows[:, 1:5], rows[:, 5:9]))
    ops = (TF.adjust_brightness, TF.adjust_contrast, TF.adjust_saturation, TF.adjust_hue)
    for image, out, row in zip(x, ours, rows, strict=True):
        image = TF.horizontal_flip(image) if row[0] else image
        for index in row[5:9].astype(int):
            image = ops[index](image, float(row[1 + index]))
        image = TF.rgb_to_grayscale(image, 3) if row[9] else image
        kernel = row[11:]
        taps = int((kernel > 0).sum())
        if taps > 1:
            sigma = _sigma_of(kernel)
            image = TF1.gaussian_blur(image, [taps, taps], [sigma, sigma])
        image = TF.solarize(image, mc.SOLARIZE_AT) if row[10] else image
        assert torch.allclose(out, image, atol=1e-4)


def _sigma_of(kernel: np.ndarray) -> float:
    """The sigma of a centred Gaussian kernel, from its centre and first taps."""
    centre = len(kernel) // 2
    return math.sqrt(-0.5 / math.log(kernel[centre + 1] / kernel[centre]))


# ----------------------------------------------------------------------------------------- distributions
@pytest.fixture(scope="module")
def plan():
    aug = mc.MultiCropAugment(224, 3, MEAN, STD, num_local=2, local_size=96)
    return aug.draw(list(range(DRAWS)), np.tile([375, 500], (DRAWS, 1)))


def test_crop_boxes_follow_torchvisions_rule_with_dinos_scales(plan):
    torch.manual_seed(0)
    img = torch.empty(3, 375, 500)
    for view, scale in ((0, (0.4, 1.0)), (2, (0.05, 0.4))):
        theirs = np.array([T.RandomResizedCrop.get_params(img, list(scale), [3 / 4, 4 / 3]) for _ in range(DRAWS)])
        for column in range(4):
            assert stats.ks_2samp(plan["boxes"][view][:, column], theirs[:, column]).pvalue > P_MIN
    # the local scale given to a global view is caught
    wrong = mc.MultiCropAugment(224, 3, MEAN, STD, num_local=2, local_scale=(0.4, 1.0), local_size=96)
    boxes = wrong.draw(list(range(DRAWS)), np.tile([375, 500], (DRAWS, 1)))["boxes"][2]
    assert stats.ks_2samp(boxes[:, 2], plan["boxes"][2][:, 2]).pvalue < 1e-20


def _pil_probabilities(transform: MultiCropTransform) -> list[dict[str, float]]:
    """Each view's probabilities as DINO's PIL transform sets them: flip, jitter, grey, blur, solarize."""
    out = []
    for view in transform.global_views + [transform.local_view]:
        p = {"flip": 0.0, "jitter": 0.0, "grey": 0.0, "blur": 0.0, "solarize": 0.0}
        for step in view.transforms:
            if isinstance(step, T.RandomHorizontalFlip):
                p["flip"] = step.p
            elif isinstance(step, T.RandomGrayscale):
                p["grey"] = step.p
            elif isinstance(step, T.RandomSolarize):
                p["solarize"] = step.p
            elif isinstance(step, T.RandomApply):
                p["jitter" if isinstance(step.transforms[0], T.ColorJitter) else "blur"] = step.p
        out.append(p)
    return out


def test_each_op_fires_as_often_as_in_dinos_pil_transform(plan):
    expected = _pil_probabilities(MultiCropTransform(224, MEAN, STD, num_local=2, local_size=96))
    rows = plan["rows"]
    for view, p in zip(rows, expected + expected[-1:], strict=True):
        fired = {"flip": view[:, 0] > 0, "jitter": (view[:, 1:5] != mc.NEUTRAL).any(1), "grey": view[:, 9] > 0,
                 "blur": view[:, 18] > 0, "solarize": view[:, 10] > 0}  # a blurred kernel's second tap is > 0
        for name, hits in fired.items():
            assert stats.binomtest(int(hits.sum()), DRAWS, p[name]).pvalue > P_MIN, name


def test_jitter_factors_order_and_blur_radii_follow_torchvision(plan):
    rows = plan["rows"][0]
    jittered = rows[(rows[:, 1:5] != mc.NEUTRAL).any(1)]
    for column, (low, high) in enumerate(((0.6, 1.4), (0.6, 1.4), (0.8, 1.2), (-0.1, 0.1))):
        assert stats.kstest(jittered[:, 1 + column], stats.uniform(low, high - low).cdf).pvalue > P_MIN
    torch.manual_seed(1)
    theirs = np.bincount([int(T.ColorJitter.get_params(*[(0.6, 1.4)] * 3, (-0.1, 0.1))[0][0])
                          for _ in range(DRAWS)], minlength=4)
    ours = np.bincount(rows[:, 5].astype(int), minlength=4)
    assert stats.chi2_contingency([ours, theirs])[1] > P_MIN
    sigma = np.array([_sigma_of(k) for k in rows[:, 11:]])  # view 0 blurs every image
    assert stats.kstest(sigma, stats.uniform(0.1, 1.9).cdf).pvalue > P_MIN
    assert stats.kstest(sigma ** 0.9, stats.uniform(0.1, 1.9).cdf).pvalue < 1e-20


def test_grey_images_get_brightness_and_contrast_only():
    aug = mc.MultiCropAugment(16, 1, (0.5,), (0.5,), num_local=1, local_size=8)
    rows = aug.draw(list(range(500)), np.full((500, 2), 20))["rows"]
    assert (rows[..., 3:5] == mc.NEUTRAL[2:]).all() and (rows[..., 9] == 0).all()
    assert (rows[..., 1] != 1).mean() > 0.7


# ----------------------------------------------------------------------------------------- the transform
def images(n: int, seed: int = 0, c: int = 3) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.integers(0, 256, (c, 20 + 3 * (i % 4), 24 + 2 * (i % 3)), dtype=np.uint8))
            for i in range(n)]


@pytest.mark.parametrize("per_crop_on_cpu", [True, False])
def test_views_have_the_model_shape_and_an_image_gets_the_same_views_in_any_batch(per_crop_on_cpu):
    aug = mc.MultiCropAugment(16, 3, MEAN, STD, num_local=2, local_size=8, per_crop_on_cpu=per_crop_on_cpu)
    batch = images(5)
    views = aug(batch, [11, 12, 13, 14, 15])
    assert len(views) == 4 and all(v.shape == (5, 3, 16, 16) and v.dtype == torch.float32 for v in views)
    again = aug(batch[2:], [13, 14, 15])
    assert all(torch.allclose(a, b[2:], atol=1e-4) for a, b in zip(again, views, strict=True))
    assert not torch.allclose(aug(batch, [21, 22, 23, 24, 25])[0], views[0])
    pixels = torch.stack([v * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1) for v in views])
    assert pixels.min() >= -1e-5 and pixels.max() <= 1 + 1e-5  # normalised from [0, 1]


def test_too_small_a_view_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="dino.local_size"):
        mc.MultiCropAugment(16, 3, MEAN, STD, num_local=2, local_size=6)


# ----------------------------------------------------------------------------------------- op counts
def dino_ops(device: str = "cpu", batches: tuple[int, ...] = (16, 256)) -> tuple[int, ...]:
    """The aten ops one batch of DINO's 12 views dispatches (benchmarks/device_op_counts.py's dino path: a list of
    mixed-size images, padded and resized by batch ops) at these batch sizes."""
    return tuple(sum(op_counts.count("dino multi-crop (12 views)", n, device).values()) for n in batches)


def test_ops_per_batch_do_not_grow_with_the_batch():
    small, large = dino_ops()
    assert large <= 1.2 * small and large <= 3000, (small, large)


def test_on_fake_cuda_the_views_read_nothing_back(monkeypatch):
    from fakecuda import fake_cuda

    with fake_cuda() as ledger:
        small, large = dino_ops("cuda", batches=(16, 64))
        views = mc.MultiCropAugment(16, 3, MEAN, STD, num_local=1, local_size=8)(
            [image.to("cuda") for image in images(3)], [1, 2, 3])
    assert all(v.device.type == "cuda" for v in views)
    assert ledger.inside("MultiCropAugment.__call__") == []
    assert large <= 1.2 * small and large <= 3000, (small, large)


def test_all_views_resized_at_once_equal_resized_crop_view_by_view():
    from resmlp.data.device.resample import resized_crop

    batch = torch.from_numpy(np.random.default_rng(4).integers(0, 256, (3, 3, 30, 40), dtype=np.uint8))
    sizes = torch.tensor([[30, 40], [25, 33], [30, 20]], dtype=torch.float64)
    boxes = torch.tensor([[[0, 0, 30, 40], [2, 3, 20, 25], [5, 1, 10, 12]],
                          [[4, 6, 9, 9], [0, 0, 25, 33], [10, 2, 12, 18]]], dtype=torch.float64)
    ours = mc.resized_views(batch, sizes, boxes, 8).view(2, 3, 3, 8, 8)
    for view in range(2):
        theirs = torch.floor(resized_crop(batch, sizes, boxes[view], (8, 8), "bicubic").clamp(0, 255) + 0.5)
        assert (ours[view] - theirs).abs().max() <= 1 and (ours[view] == theirs).float().mean() > 0.99
    assert not torch.allclose(ours[0], ours[1], atol=1)
    # the CPU's per-crop form: torch's uint8 kernels, within 1 level of the batched weights (PIL's)
    cpu = mc.resized_views_cpu(batch, boxes.long().numpy(), 8).view(2, 3, 3, 8, 8)
    assert (cpu - ours).abs().max() <= 1 and (cpu == ours).float().mean() > 0.95


def test_local_views_are_resized_to_the_global_size_as_pils_resize():
    """Option (a)'s last step, T.Resize(img_size) bicubic on the PIL path: torch's antialiased bicubic (PIL's
    a = -0.5) on the float view, within 1 level of PIL's on >= 99 % of pixels of a photo-like crop (PIL rounds
    between its two passes; on pure noise, all overshoot, 98.8 %); torch's plain bicubic (a = -0.75) is caught."""
    from PIL import Image
    from torch.nn import functional as F

    coarse = np.random.default_rng(5).integers(0, 256, (4, 4, 3), dtype=np.uint8)
    small = np.array(Image.fromarray(coarse).resize((12, 12), Image.BICUBIC))
    theirs = np.asarray(Image.fromarray(small).resize((28, 28), Image.BICUBIC)).astype(np.float64)
    x = torch.from_numpy(small).permute(2, 0, 1)[None].float() / 255

    def gap(antialias: bool) -> np.ndarray:
        ours = F.interpolate(x, size=(28, 28), mode="bicubic", antialias=antialias, align_corners=False).clamp(0, 1)
        return np.abs(ours[0].permute(1, 2, 0).numpy() * 255 - theirs)

    assert (gap(True) <= 1).mean() >= 0.99
    assert (gap(False) <= 1).mean() < 0.9

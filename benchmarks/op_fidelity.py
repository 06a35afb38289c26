"""How far the device pipeline's ops land from the PIL ops they twin, measured on real photos: timm's geometric
RandAugment ops (Rotate, ShearX/Y, TranslateX/YRel; bilinear and bicubic) against our batched `warp`, and DINO's
multi-crop photometric ops (ColorJitter's brightness, contrast, saturation and hue on PIL images, as
torchvision runs them; PIL's GaussianBlur) against ours on float images.

    .venv/bin/python benchmarks/op_fidelity.py [--json OUT.json]
    .venv/bin/python benchmarks/op_fidelity.py --tiny      # proves it runs (a test runs it)

Images: scikit-image's sample photos (astronaut, coffee, chelsea, rocket), as RGB uint8. Arguments: each op at
magnitudes across its range (timm's m9 with its standard deviation reaches past them: Rotate 27 degrees, shear
0.27, translate 0.41 of the size at m9; DINO's jitter 0.4 / 0.4 / 0.2 / 0.1 and blur radius 0.1-2). Per op it
prints the largest per-pixel difference in levels (0-255), the mean signed offset (ours - PIL), and the PSNR.
Where an op is not in PIL's exact arithmetic (PIL rounds to uint8 after each op and truncates, uses an a=-1
bicubic, and approximates a Gaussian with box filters), these numbers are the size of that difference. Not a
speed benchmark: the numbers depend on no machine load.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import torch
import torchvision.transforms.functional as TF
from PIL import Image, ImageFilter
from timm.data import auto_augment as aa

from resmlp.data.device import multi_crop as mc
from resmlp.data.device import rand_augment as ra
from resmlp.fileio import write_json
from resmlp.hostinfo import host_info

GEOMETRIC = {"Rotate": [-30.0, -10.0, 5.0, 27.0], "ShearX": [-0.3, 0.15, 0.27], "ShearY": [-0.27, 0.1, 0.3],
             "TranslateXRel": [-0.41, 0.2], "TranslateYRel": [-0.3, 0.41]}
JITTER = {"brightness": [0.6, 0.85, 1.2, 1.4], "contrast": [0.6, 0.9, 1.15, 1.4], "saturation": [0.8, 0.9, 1.2],
          "hue": [-0.1, -0.04, 0.03, 0.1]}
BLUR_RADII = [0.1, 0.5, 1.0, 2.0]
FILL = (124, 116, 104)  # timm's img_mean fill for ImageNet's mean


def sample_photos(tiny: bool) -> list[np.ndarray]:
    from skimage import data

    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    return [np.ascontiguousarray(p[:96, :128]) for p in photos[:1]] if tiny else photos


def stats(ours: np.ndarray, theirs: np.ndarray) -> dict[str, float]:
    diff = ours.astype(np.float64) - theirs.astype(np.float64)
    mse = (diff ** 2).mean()
    return {"max_levels": float(np.abs(diff).max()), "mean_offset": float(diff.mean()),
            "psnr_db": 10 * math.log10(255 ** 2 / max(mse, 1e-12))}


def geometric(name: str, arg: float, mode: str, img: np.ndarray) -> dict[str, float]:
    size = img.shape[:2]
    theta = torch.from_numpy(ra.grid_theta(ra.affine_matrix(name, np.array([arg]), size), size))
    batch = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    ours = ra.warp(batch, theta, torch.tensor(FILL), mode)[0].permute(1, 2, 0).numpy()
    resample = Image.BICUBIC if mode == "bicubic" else Image.BILINEAR
    theirs = np.asarray(aa.NAME_TO_OP[name](Image.fromarray(img), arg, fillcolor=FILL, resample=resample))
    return stats(ours, theirs)


def jitter(op: str, factor: float, img: np.ndarray) -> dict[str, float]:
    """Ours on the float image (as the multi-crop runs it) against torchvision's op on the PIL image (DINO's)."""
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
    ours_fn = {"brightness": mc.adjust_brightness, "contrast": mc.adjust_contrast,
               "saturation": mc.adjust_saturation, "hue": mc.adjust_hue}[op]
    ours = (ours_fn(x, torch.tensor([factor])) * 255)[0].permute(1, 2, 0).numpy()
    pil_fn = {"brightness": TF.adjust_brightness, "contrast": TF.adjust_contrast,
              "saturation": TF.adjust_saturation, "hue": TF.adjust_hue}[op]
    theirs = np.asarray(pil_fn(Image.fromarray(img), factor))
    return stats(ours, theirs)


def blur(radius: float, img: np.ndarray) -> dict[str, float]:
    x = torch.from_numpy(img).permute(2, 0, 1)[None].float() / 255
    kernels = torch.from_numpy(mc.blur_kernels(np.array([True]), np.array([radius])))
    ours = (mc.gaussian_blur(x, kernels) * 255)[0].permute(1, 2, 0).numpy()
    theirs = np.asarray(Image.fromarray(img).filter(ImageFilter.GaussianBlur(radius=radius)))
    return stats(ours, theirs)


def worst(rows: list[dict[str, float]]) -> dict[str, float]:
    """Over images and arguments: the largest difference, the mean offset's range, the lowest PSNR."""
    offsets = [r["mean_offset"] for r in rows]
    return {"max_levels": max(r["max_levels"] for r in rows), "mean_offset_min": min(offsets),
            "mean_offset_max": max(offsets), "psnr_db_min": min(r["psnr_db"] for r in rows),
            "psnr_db_max": max(r["psnr_db"] for r in rows)}


def measure(tiny: bool) -> dict[str, dict[str, float]]:
    photos = sample_photos(tiny)
    pick = (lambda values: values[:1]) if tiny else (lambda values: values)
    out = {}
    for name, args in GEOMETRIC.items():
        for mode in ("bilinear", "bicubic"):
            out[f"{name} ({mode})"] = worst([geometric(name, a, mode, p) for a in pick(args) for p in photos])
    for op, factors in JITTER.items():
        out[f"{op} (DINO jitter)"] = worst([jitter(op, f, p) for f in pick(factors) for p in photos])
    out["GaussianBlur (DINO)"] = worst([blur(r, p) for r in pick(BLUR_RADII) for p in photos])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--tiny", action="store_true", help="one photo crop, one argument per op (a test)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    figures = measure(args.tiny)
    print("| op | largest difference (levels) | mean offset, ours - PIL (levels) | PSNR (dB) |")
    print("|---|---|---|---|")
    for name, f in figures.items():
        print(f"| {name} | {f['max_levels']:.0f} | {f['mean_offset_min']:+.2f} to {f['mean_offset_max']:+.2f} | "
              f"{f['psnr_db_min']:.1f}-{f['psnr_db_max']:.1f} |")
    if args.json:
        write_json(args.json, {"host": host_info(), "ops": figures})


if __name__ == "__main__":
    main()

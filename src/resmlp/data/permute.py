"""Fixed pixel permutations of an image (MLP-Mixer's "Permutation Invariance" experiment).

`patch` shuffles the order of the patches and permutes the pixels inside every patch with one shared
permutation (a patch-based model that sees whole patches is unaffected up to relabelling its weights);
`global` permutes all pixels with one permutation (destroys every local structure). The permutation is
a pure function of (mode, image size, patch size, seed), so train and test images get the same one.
"""

from __future__ import annotations

import torch

MODES = ("none", "patch", "global")


def pixel_permutation(mode: str, img_size: int, patch_size: int = 4, seed: int = 0) -> torch.Tensor:
    """Indices `perm` of length img_size**2: permuted.flatten() = image.flatten()[perm] (row-major)."""
    if mode not in MODES:
        raise ValueError(f"permutation mode {mode!r} is not one of {', '.join(MODES)}")
    n = img_size * img_size
    generator = torch.Generator().manual_seed(seed)
    if mode == "none":
        return torch.arange(n)
    if mode == "global":
        return torch.randperm(n, generator=generator)
    if patch_size < 1 or img_size % patch_size:
        raise ValueError(f"patch permutation needs img_size ({img_size}) to be a multiple of patch_size "
                         f"({patch_size}); set data.permute_patch to a divisor of the image size")
    grid = img_size // patch_size
    # source pixel index of every (patch row, patch col, pixel row, pixel col), row-major in the image
    index = torch.arange(n).view(grid, patch_size, grid, patch_size).permute(0, 2, 1, 3)
    index = index.reshape(grid * grid, patch_size * patch_size)
    patch_order = torch.randperm(grid * grid, generator=generator)
    pixel_order = torch.randperm(patch_size * patch_size, generator=generator)  # shared by all patches
    moved = index[patch_order][:, pixel_order]  # new patch k, pixel j comes from patch_order[k], pixel_order[j]
    return moved.view(grid, grid, patch_size, patch_size).permute(0, 2, 1, 3).reshape(n)


class PixelPermutation:
    """Transform applying a fixed permutation to the spatial pixels of a (C, H, W) tensor."""

    def __init__(self, mode: str, img_size: int, patch_size: int = 4, seed: int = 0) -> None:
        self.mode, self.img_size = mode, img_size
        self.perm = pixel_permutation(mode, img_size, patch_size, seed)

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        if image.shape[-2:] != (self.img_size, self.img_size):
            raise ValueError(f"pixel permutation built for {self.img_size}x{self.img_size} images, got "
                             f"{tuple(image.shape[-2:])}")
        if self.perm.device != image.device:  # once per device: the index then lives where the images do
            self.perm = self.perm.to(image.device)
        return image.flatten(-2)[..., self.perm].view(image.shape)

    def __repr__(self) -> str:
        return f"PixelPermutation(mode={self.mode!r}, img_size={self.img_size})"

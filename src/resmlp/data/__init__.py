"""Datasets for training and evaluation: Fashion-MNIST (default), image folders, CIFAR, synthetic."""

from __future__ import annotations

from pathlib import Path

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import Dataset
from torchvision import transforms

from resmlp.data import cifar as _cifar
from resmlp.data import fashion_mnist as _fmnist
from resmlp.data.arrays import ArrayDataset
from resmlp.data.fashion_mnist import fashion_mnist, read_idx
from resmlp.data.folder import SkippingImageFolder
from resmlp.data.permute import PixelPermutation, pixel_permutation
from resmlp.data.samplers import ResumableSampler, SeededDataset, ShardSampler, collate_skipping
from resmlp.data.synthetic import synthetic

KINDS = ("fashion-mnist", "folder", "cifar10", "cifar100", "synthetic")
# kinds that ship a validation split; the others (a train and a test split) get one carved from train
KINDS_WITH_VAL = ("folder", "synthetic")
DEFAULT_STATS = {
    "fashion-mnist": (_fmnist.MEAN, _fmnist.STD),
    "cifar10": (_cifar.MEAN, _cifar.STD),
    "cifar100": (_cifar.MEAN, _cifar.STD),
    "synthetic": ((0.5,), (0.25,)),
}

__all__ = ["KINDS", "ArrayDataset", "PixelPermutation", "ResumableSampler", "SeededDataset", "ShardSampler",
           "SkippingImageFolder", "build_dataset", "collate_skipping", "dataset_stats", "fashion_mnist",
           "heldout_split", "pixel_permutation", "read_idx", "synthetic"]


def dataset_stats(kind: str, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Default normalisation for a dataset kind, with as many channels as the model takes."""
    mean, std = DEFAULT_STATS.get(kind, (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
    if len(mean) != in_chans:  # grayscale repeated to RGB, or colour read as grayscale
        mean, std = (sum(mean) / len(mean),) * in_chans, (sum(std) / len(std),) * in_chans
    return tuple(mean), tuple(std)


def heldout_split(kind: str, data_dir: str | Path | None = None) -> str:
    """The split a trained model is scored on: the test split where the kind has one (a folder: when DIR/test
    exists, as a training run reads it), else val."""
    if kind == "folder":
        return "test" if data_dir is not None and (Path(data_dir) / "test").is_dir() else "val"
    return "test"


def build_dataset(kind: str, split: str, data_dir: str | Path | None, in_chans: int, transform=None,
                  synthetic_size: tuple[int, int] = (256, 64), synthetic_classes: int = 4,
                  img_size: int = 28, seed: int = 0, permute: str = "none", permute_patch: int = 4,
                  permute_seed: int = 0) -> Dataset:
    """Split 'train', 'val' or 'test' of a dataset kind. Fashion-MNIST and CIFAR have no 'val' (a training run
    carves one from 'train', resmlp.data.assemble); folders read DIR/<split>/<class>/.

    permute: 'patch' or 'global' applies one fixed pixel permutation (resmlp.data.permute) to every image
    tensor after `transform`, the same for every split.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    if split == "val" and kind not in KINDS_WITH_VAL:
        raise ValueError(f"{kind} has no official validation split (training runs carve one from train, "
                         "data.val_size); use the test split")
    if permute != "none":
        if transform is None:
            raise ValueError("a pixel permutation acts on image tensors: pass a transform that makes them")
        transform = transforms.Compose([transform, PixelPermutation(permute, img_size, permute_patch, permute_seed)])
    if kind == "fashion-mnist":
        return fashion_mnist(split, data_dir, in_chans, transform)
    if kind in ("cifar10", "cifar100"):
        if data_dir is None:
            raise ValueError(f"{kind} needs data.dir (the folder holding the python-pickle version)")
        return _cifar.cifar(kind, split, data_dir, in_chans, transform)
    if kind == "folder":
        if data_dir is None:
            raise ValueError("an image-folder dataset needs data.dir (holding train/<class>/ and val/<class>/)")
        return SkippingImageFolder(Path(data_dir) / split, in_chans=in_chans, transform=transform)
    if kind == "synthetic":
        n = synthetic_size[0] if split == "train" else synthetic_size[1]  # test: as many as val
        return synthetic(split, n, synthetic_classes, img_size, in_chans, seed=seed, transform=transform)
    raise ValueError(f"unknown dataset kind {kind!r}; choose one of {', '.join(KINDS)}")


"""Datasets for training and evaluation: every source of resmlp.data.sources (image folders in ImageNet's
layouts, WebDataset shards, Hugging Face datasets, Fashion-MNIST (default), CIFAR, synthetic) decoded for a model."""

from __future__ import annotations

from pathlib import Path

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import Dataset
from torchvision import transforms

from resmlp.data.arrays import ArrayDataset
from resmlp.data.loading.samplers import ResumableSampler, SeededDataset, ShardSampler, collate_skipping
from resmlp.data.per_image.decoded import decoded
from resmlp.data.per_image.folder import SkippingImageFolder
from resmlp.data.permute import PixelPermutation, pixel_permutation
from resmlp.data.records import SourceSpec
from resmlp.data.sources import KINDS, open_source, parse_source, spec_from_config
from resmlp.data.sources import cifar as _cifar
from resmlp.data.sources import fashion_mnist as _fmnist
from resmlp.data.sources.fashion_mnist import fashion_mnist, read_idx
from resmlp.data.sources.synthetic import synthetic
from resmlp.data.splits import heldout_split as _heldout

DEFAULT_STATS = {
    "fashion-mnist": (_fmnist.MEAN, _fmnist.STD),
    "cifar10": (_cifar.MEAN, _cifar.STD),
    "cifar100": (_cifar.MEAN, _cifar.STD),
    "synthetic": ((0.5,), (0.25,)),
}

__all__ = ["KINDS", "ArrayDataset", "PixelPermutation", "ResumableSampler", "SeededDataset", "ShardSampler",
           "SkippingImageFolder", "build_dataset", "collate_skipping", "dataset_stats", "fashion_mnist",
           "heldout_split", "open_source", "pixel_permutation", "read_idx", "resolve_data", "source_for", "synthetic"]


def dataset_stats(kind: str, in_chans: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Default normalisation for a dataset kind, with as many channels as the model takes."""
    mean, std = DEFAULT_STATS.get(kind, (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD))
    if len(mean) != in_chans:  # grayscale repeated to RGB, or colour read as grayscale
        mean, std = (sum(mean) / len(mean),) * in_chans, (sum(std) / len(std),) * in_chans
    return tuple(mean), tuple(std)


def source_for(kind: str | SourceSpec, data_dir: str | Path | None = None, **options):
    """The source named by a kind or source name (`folder`, `folder:DIR`, a folder) plus an optional folder."""
    if isinstance(kind, SourceSpec):
        return open_source(kind, **options)
    spec = spec_from_config(kind, "fashion-mnist", None) if data_dir is None else spec_from_config(
        None, kind, str(data_dir))
    return open_source(spec, **options)


def resolve_data(data: str, data_dir: str | Path | None = None) -> SourceSpec:
    """The source a command's --data (and --data-dir) name: a kind (its folder in data_dir), a source in the
    grammar (folder:DIR, wds:PATTERN, hf:DIR...), or an existing folder."""
    if data in KINDS:
        return spec_from_config(None, data, None if data_dir is None else str(data_dir))
    return parse_source(data)


def heldout_split(kind: str | SourceSpec, data_dir: str | Path | None = None) -> str:
    """The split a trained model is scored on: the test split where the source has one (a folder: when DIR/test
    exists, as a training run reads it), else val."""
    return _heldout(source_for(kind, data_dir))


def build_dataset(kind: str | SourceSpec, split: str, data_dir: str | Path | None, in_chans: int, transform=None,
                  synthetic_size: tuple[int, int] = (256, 64), synthetic_classes: int = 4,
                  img_size: int = 28, seed: int = 0, permute: str = "none", permute_patch: int = 4,
                  permute_seed: int = 0) -> Dataset:
    """Split 'train', 'val' or 'test' of a source (a kind plus data_dir, or a source name), decoded for a model
    with `transform`. Fashion-MNIST and CIFAR have no 'val' (a training run carves one from 'train',
    resmlp.data.splits).

    permute: 'patch' or 'global' applies one fixed pixel permutation (resmlp.data.permute) to every image
    tensor after `transform`, the same for every split.
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    source = source_for(kind, data_dir, synthetic_size=synthetic_size, synthetic_classes=synthetic_classes,
                        img_size=img_size, seed=seed)
    if split == "val" and "val" not in source.splits and source.spec.kind != "folder":
        raise ValueError(f"{source.spec.kind} has no official validation split (training runs carve one from train, "
                         "data.val_size); use the test split")
    return decoded(source.records(split), in_chans, with_permutation(transform, permute, img_size, permute_patch,
                                                                     permute_seed))


def with_permutation(transform, permute: str, img_size: int, patch: int, seed: int):
    """`transform` followed by the run's pixel permutation (none: `transform` itself)."""
    if permute == "none":
        return transform
    if transform is None:
        raise ValueError("a pixel permutation acts on image tensors: pass a transform that makes them")
    return transforms.Compose([transform, PixelPermutation(permute, img_size, patch, seed)])

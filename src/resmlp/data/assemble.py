"""A training run's data: train and val datasets, their preprocessing, and the batched paths where they apply.

Two data paths (docs/training.md): in-memory datasets (Fashion-MNIST, CIFAR, synthetic) without RandAugment
or colour jitter are augmented in whole batches in the training process (resmlp.data.batch_augment); all
others go through timm's per-image transform in DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from resmlp.data import ArrayDataset, PixelPermutation, build_dataset, dataset_stats
from resmlp.data.batch_augment import BatchAugment
from resmlp.preprocess import Preprocess

if TYPE_CHECKING:
    from resmlp.train.config import DataConfig


@dataclass
class RunData:
    train: Any
    val: Any
    class_names: list[str]
    preprocess: Preprocess
    train_augment: BatchAugment | None = None  # set: train is an ArrayDataset augmented batch by batch
    val_batched: BatchAugment | None = None  # set: val is an ArrayDataset preprocessed batch by batch


def run_preprocess(d: DataConfig, in_chans: int, img_size: int) -> Preprocess:
    """The run's evaluation preprocessing: the data section's statistics and crop for the model's input."""
    mean, std = (tuple(d.mean), tuple(d.std)) if d.mean else dataset_stats(d.kind, in_chans)
    if len(mean) != in_chans:
        raise ValueError(f"data.mean has {len(mean)} values but the model takes {in_chans} channels")
    return Preprocess(img_size, in_chans, mean, std, d.crop_pct, d.interpolation)


def build_data(d: DataConfig, in_chans: int, img_size: int, seed: int,
               train_transform: Callable[[Preprocess], Any] | None = None) -> RunData:
    """Train and val datasets with their transforms; errors (missing files, empty classes) come first.

    train_transform(preprocess) replaces the recipe's training augmentation (DINO's multi-crop).
    """
    pre = run_preprocess(d, in_chans, img_size)
    common = dict(data_dir=d.dir, in_chans=in_chans, synthetic_size=tuple(d.synthetic_size),
                  synthetic_classes=d.synthetic_classes, img_size=img_size, seed=seed,
                  permute=d.permute, permute_patch=d.permute_patch, permute_seed=d.permute_seed)
    train_tf = (train_transform(pre) if train_transform else
                pre.train_transform(d.scale, d.ratio, d.hflip, d.color_jitter, d.auto_augment, d.reprob))
    train = build_dataset(d.kind, "train", transform=train_tf, **common)
    val = build_dataset(d.kind, "val", transform=pre.eval_transform(), **common)
    if train.class_names != val.class_names:
        raise ValueError(f"train and val classes differ: {len(train.class_names)} vs {len(val.class_names)} "
                         "classes; both splits need the same class folders")
    batched = (d.batch_augment and train_transform is None and isinstance(train, ArrayDataset)
               and not d.auto_augment and not d.color_jitter)
    augment = val_batched = None
    if batched:
        permutation = (PixelPermutation(d.permute, img_size, d.permute_patch, d.permute_seed)
                       if d.permute != "none" else None)
        augment = BatchAugment(img_size, in_chans, pre.mean, pre.std, d.scale, d.ratio, d.hflip, d.reprob,
                               d.interpolation, after=permutation)
        val_batched = pre.batched_eval(*val.images.shape[1:3], after=permutation)
    return RunData(train, val, list(train.class_names), pre, augment, val_batched)

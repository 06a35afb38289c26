"""A training run's data: train, val and test datasets, their preprocessing, and the batched paths.

Model selection never looks at the test set: per-epoch metrics and the best checkpoint use the validation
split, the test split is scored once at the end. Kinds without a validation split (Fashion-MNIST, CIFAR) get
one carved from the training set: `data.val_size` images, class-stratified, seeded by `data.val_seed`.

Two data paths (docs/training.md): in-memory datasets (Fashion-MNIST, CIFAR, synthetic) without RandAugment
or colour jitter are augmented in whole batches in the training process (resmlp.data.batch_augment); all
others go through timm's per-image transform in DataLoader workers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torchvision import transforms

from resmlp.data import (
    KINDS_WITH_VAL,
    ArrayDataset,
    PixelPermutation,
    SkippingImageFolder,
    build_dataset,
    dataset_stats,
)
from resmlp.data.arrays import stratified_split
from resmlp.data.batch_augment import BatchAugment
from resmlp.preprocess import Preprocess

if TYPE_CHECKING:
    from resmlp.train.sections import DataConfig


@dataclass
class RunData:
    train: Any
    val: Any
    test: Any | None  # None: the dataset has no test split (an image folder without test/)
    train_eval: Any  # the training images with the evaluation transform (DINO's k-NN memory)
    class_names: list[str]
    preprocess: Preprocess
    validation: str  # where the validation images come from, for summary.json
    train_augment: BatchAugment | None = None  # set: train is an ArrayDataset augmented batch by batch
    val_batched: BatchAugment | None = None  # set: val is an ArrayDataset preprocessed batch by batch
    test_batched: BatchAugment | None = None


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
    eval_tf = pre.eval_transform()
    folder_without_val = d.kind == "folder" and d.dir is not None and not (Path(d.dir) / "val").is_dir()
    if d.kind in KINDS_WITH_VAL and not folder_without_val:
        val, validation = build_dataset(d.kind, "val", transform=eval_tf, **common), "the dataset's val split"
        test = _optional_test(d, eval_tf, common)
    elif d.val_size:
        # the datasets' transforms carry the run's pixel permutation, if any (build_dataset adds it)
        if folder_without_val:
            test = _optional_test(d, eval_tf, common)
            val_tf = _with_permutation(eval_tf, d, img_size)
        else:
            test = build_dataset(d.kind, "test", transform=eval_tf, **common)
            val_tf = test.transform
        if not 0 < d.val_size < len(train.labels):
            raise ValueError(f"data.val_size={d.val_size}: the validation split carved from the training set must "
                             f"be smaller than it ({len(train.labels)} images); set --set data.val_size=N with N "
                             f"below {len(train.labels)}, or add a val split")
        kept, held = stratified_split(train.labels, d.val_size, d.val_seed)
        train, val = train.subset(kept, train.transform), train.subset(held, val_tf)
        validation = f"{d.val_size} images carved from train (class-stratified, seed {d.val_seed})"
    elif folder_without_val:
        raise ValueError(f"{d.dir} has no val/ folder: add {d.dir}/val/<class>/ or carve a validation split "
                         "from train/ with --set data.val_size=N")
    else:
        val = test = build_dataset(d.kind, "test", transform=eval_tf, **common)
        validation = "the test split (data.val_size 0: model selection sees the test set)"
    train_eval = _with_transform(train, val.transform)
    if train.class_names != val.class_names:
        raise ValueError(f"train and val classes differ: {len(train.class_names)} vs {len(val.class_names)} "
                         "classes; both splits need the same class folders")
    permutation = (PixelPermutation(d.permute, img_size, d.permute_patch, d.permute_seed)
                   if d.permute != "none" else None)
    augment = val_batched = test_batched = None
    if (d.batch_augment and train_transform is None and isinstance(train, ArrayDataset)
            and not d.auto_augment and not d.color_jitter):
        augment = BatchAugment(img_size, in_chans, pre.mean, pre.std, d.scale, d.ratio, d.hflip, d.reprob,
                               d.interpolation, after=permutation)
    # evaluation is batched wherever it is exact, whatever the training augmentation (DINO's multi-crop too)
    if d.batch_augment and isinstance(val, ArrayDataset):
        val_batched = pre.batched_eval(*val.images.shape[1:3], after=permutation)
        test_batched = (pre.batched_eval(*test.images.shape[1:3], after=permutation)
                        if isinstance(test, ArrayDataset) else None)
    return RunData(train, val, test, train_eval, list(train.class_names), pre, validation, augment, val_batched,
                   test_batched)


def _with_permutation(transform, d: DataConfig, img_size: int):
    """`transform` followed by the run's pixel permutation, as build_dataset composes them."""
    if d.permute == "none":
        return transform
    return transforms.Compose([transform, PixelPermutation(d.permute, img_size, d.permute_patch, d.permute_seed)])


def _with_transform(dataset, transform):
    """The same images with another transform: no second read of the files or scan of the folders."""
    view = copy.copy(dataset)
    view.transform = transform
    return view


def _optional_test(d: DataConfig, eval_tf, common: dict[str, Any]):
    """The test split of a kind with its own val split: synthetic's, or a folder's data.test_dir (default
    DIR/test/<class>/, when it exists)."""
    if d.kind == "synthetic":
        return build_dataset(d.kind, "test", transform=eval_tf, **common)
    if d.test_dir:
        return SkippingImageFolder(d.test_dir, in_chans=common["in_chans"], transform=eval_tf)
    return build_dataset(d.kind, "test", transform=eval_tf, **common) if (Path(d.dir) / "test").is_dir() else None

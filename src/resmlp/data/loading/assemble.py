"""A training run's data: train, val and test datasets, their preprocessing, and the batched paths.

The run's source (resmlp.data.sources, named by data.source or data.kind + data.dir) gives raw records; its
splits are decided in one place (resmlp.data.splits: model selection never looks at the test set); here they
are decoded with the run's transforms.

Data paths (docs/training.md): in-memory datasets (Fashion-MNIST, CIFAR, synthetic) without RandAugment or
colour jitter are augmented in whole batches in the training process (resmlp.data.device.batch_augment); with
data.pipeline=device, encoded images are decoded and augmented in whole batches where the model runs, and
in-memory ones with RandAugment augmented there (resmlp.data.device.pipeline); all others go through timm's
per-image transform in DataLoader workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resmlp.data import ArrayDataset, PixelPermutation, dataset_stats, with_permutation
from resmlp.data.device.augment import DeviceAugment
from resmlp.data.device.batch_augment import BatchAugment
from resmlp.data.device.decode import EncodedDataset, EncodedStream
from resmlp.data.device.multi_crop import MultiCropAugment
from resmlp.data.device.pipeline import DevicePipeline, device_refusal
from resmlp.data.loading.finish import DeviceFinish
from resmlp.data.per_image.decoded import decoded
from resmlp.data.per_image.folder import class_folder_records
from resmlp.data.records import MapRecords, Source, SourceSpec
from resmlp.data.sources import open_source, spec_from_config
from resmlp.data.sources.remote import RemoteOptions
from resmlp.data.splits import decide_splits
from resmlp.errors import ConfigError
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
    train_pipeline: DevicePipeline | None = None  # set: train is an EncodedDataset decoded on the device
    pipeline: str = "timm"  # the training data path, for summary.json
    train_finish: DeviceFinish | None = None  # set: timm's path sends uint8, finished on the device
    requested: str = "timm"  # data.pipeline as configured: auto, device or timm (resmlp.data.loading.choice)
    device_refused: str | None = None  # auto: why the device path can't run this data section (None: it can)

    def pipeline_summary(self) -> dict[str, Any]:
        """How the training images were decoded and augmented (summary.json's data_pipeline)."""
        return self.train_pipeline.summary() if self.train_pipeline is not None else {"name": self.pipeline}


def run_spec(d: DataConfig) -> SourceSpec:
    """The run's data source: data.source, else data.kind + data.dir in the source grammar."""
    return spec_from_config(d.source, d.kind, d.dir)


def run_preprocess(d: DataConfig, in_chans: int, img_size: int) -> Preprocess:
    """The run's evaluation preprocessing: the data section's statistics and crop for the model's input."""
    mean, std = (tuple(d.mean), tuple(d.std)) if d.mean else dataset_stats(run_spec(d).kind, in_chans)
    if len(mean) != in_chans:
        raise ValueError(f"data.mean has {len(mean)} values but the model takes {in_chans} channels")
    return Preprocess(img_size, in_chans, mean, std, d.crop_pct, d.interpolation)


def run_source(d: DataConfig, img_size: int, seed: int, cache: str | Path | None = None) -> Source:
    """The run's source with the data section's options (`cache`: a folder for a folder source's index)."""
    return open_source(run_spec(d), synthetic_size=tuple(d.synthetic_size), synthetic_classes=d.synthetic_classes,
                       img_size=img_size, seed=seed, class_map=d.class_map, index_cache=cache,
                       streaming=d.streaming, length=d.epoch_length, remote=remote_options(d))


def remote_options(d: DataConfig) -> RemoteOptions:
    """How the run reads URLs (resmlp.data.sources.remote), from the data section."""
    return RemoteOptions(d.endpoint_url, d.remote_retries, float(d.remote_timeout), float(d.remote_backoff),
                         d.shard_errors, d.cache_dir, int(d.cache_gb * 10**9))


def build_data(d: DataConfig, in_chans: int, img_size: int, seed: int,
               train_transform: Callable[[Preprocess], Any] | None = None, cache: str | Path | None = None) -> RunData:
    """Train and val datasets with their transforms; errors (missing files, empty classes) come first.

    train_transform(preprocess) replaces the recipe's training augmentation (DINO's multi-crop). The splits are
    decided by resmlp.data.splits.decide_splits, for every source alike.
    """
    pre = run_preprocess(d, in_chans, img_size)
    test_records = class_folder_records(d.test_dir) if d.test_dir else None
    splits = decide_splits(run_source(d, img_size, seed, cache), d.val_size, d.val_seed, test_records)
    for name, records in (("val", splits.val), ("test", splits.test)):
        if records is not None and records.class_names != splits.train.class_names:
            raise ValueError(f"train and {name} classes differ: {len(splits.train.class_names)} vs "
                             f"{len(records.class_names)} classes; both splits need the same class folders")

    def permuted(transform):
        return with_permutation(transform, d.permute, img_size, d.permute_patch, d.permute_seed)

    # the recipe's timm transform sends uint8 and is finished on the device (timm's prefetcher); a permutation
    # acts on normalised pixels and a task's own transform (DINO's views) on its own terms: those stay float
    uint8 = train_transform is None and d.permute == "none"
    train_tf = (train_transform(pre) if train_transform else
                pre.train_transform(d.scale, d.ratio, d.hflip, d.color_jitter, d.auto_augment, d.reprob, uint8,
                                         d.remode, d.recount))
    eval_tf = permuted(pre.eval_transform())
    train, val = decoded(splits.train, in_chans, permuted(train_tf)), decoded(splits.val, in_chans, eval_tf)
    test = val if splits.test is splits.val else (
        decoded(splits.test, in_chans, eval_tf) if splits.test is not None else None)
    train_eval = decoded(splits.train, in_chans, eval_tf)  # the same records: no second read or listing
    permutation = (PixelPermutation(d.permute, img_size, d.permute_patch, d.permute_seed)
                   if d.permute != "none" else None)
    augment = val_batched = test_batched = pipeline = None
    refused: list[str] = []  # data.pipeline=auto: why the device path can't run this data section
    if (d.batch_augment and train_transform is None and isinstance(train, ArrayDataset)
            and not d.auto_augment and not d.color_jitter):
        augment = BatchAugment(img_size, in_chans, pre.mean, pre.std, d.scale, d.ratio, d.hflip, d.reprob,
                               d.interpolation, after=permutation)
    elif (device_augment := _device_augment(d, pre, train_transform, permutation, refused)) is not None:
        if isinstance(train, ArrayDataset):
            augment = device_augment  # array_batches hands it device-resident uint8 batches
        else:  # map records by sampler key; a stream in the order and with the keys of its DecodedStream
            encoded = (EncodedDataset(splits.train, in_chans) if isinstance(splits.train, MapRecords) else
                       EncodedStream(train, in_chans))
            pipeline = DevicePipeline(device_augment, encoded, in_chans)
    # evaluation is batched wherever it is exact, whatever the training augmentation (DINO's multi-crop too)
    if d.batch_augment and isinstance(val, ArrayDataset):
        val_batched = pre.batched_eval(*val.images.shape[1:3], after=permutation)
        test_batched = (pre.batched_eval(*test.images.shape[1:3], after=permutation)
                        if isinstance(test, ArrayDataset) else None)
    # timm's path (the reference; with a device path, the one auto measures it against and falls back to)
    finish = DeviceFinish(pre.mean, pre.std, d.reprob, d.remode, d.recount) if uint8 else None
    return RunData(train, val, test, train_eval, list(splits.train.class_names), pre, splits.validation, augment,
                   val_batched, test_batched, pipeline, "device" if pipeline or isinstance(
                       augment, (DeviceAugment, MultiCropAugment)) else "batched" if augment is not None else "timm",
                   finish, d.pipeline, refused[0] if refused else None)


def _device_augment(d: DataConfig, pre: Preprocess, train_transform: Callable[..., Any] | None,
                    permutation: PixelPermutation | None, refused: list[str]) -> Any:
    """The device path's batch augmentation (DeviceAugment, or the task's batched transform: DINO's
    MultiCropAugment); None with data.pipeline=timm, or with auto where the device path can't run the data
    section's ops (the reason appended to `refused`)."""
    if d.pipeline == "timm":
        return None
    if d.pipeline == "auto" and (why := device_refusal(d)) is not None:
        refused.append(why)
        return None
    try:
        return (train_transform(pre, batched=True) if train_transform else
                DeviceAugment(pre.img_size, pre.in_chans, pre.mean, pre.std, d.scale, d.ratio, d.hflip,
                              d.auto_augment, d.reprob, d.interpolation, after=permutation))
    except ConfigError as e:  # e.g. views too small for the device multi-crop's blur: auto takes timm's path
        if d.pipeline != "auto":
            raise
        refused.append(str(e))
        return None

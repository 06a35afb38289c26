"""Datasets: IDX and CIFAR readers, folders with corrupt images, synthetic data, resumable samplers."""

from __future__ import annotations

import gzip
import pickle
import struct
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from resmlp.data import (
    ResumableSampler,
    SeededDataset,
    SkippingImageFolder,
    build_dataset,
    collate_skipping,
    read_idx,
    synthetic,
)
from resmlp.data.sources.fashion_mnist import fashion_mnist
from resmlp.preprocess import Preprocess


def write_idx(path: Path, array: np.ndarray, gz: bool) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(struct.pack(">I", n) for n in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if gz else payload)


@pytest.mark.parametrize("gz", [True, False])
def test_fashion_mnist_reads_idx_files_gz_or_raw(tmp_path, gz):
    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (7, 28, 28)), rng.integers(0, 10, 7)
    suffix = ".gz" if gz else ""
    for split, n in (("train", 7), ("t10k", 7)):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte{suffix}", images[:n], gz)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte{suffix}", labels[:n], gz)
    ds = fashion_mnist("train", tmp_path)
    assert len(ds) == 7 and ds.class_names[0] == "T-shirt/top"
    image, label = ds[3]
    assert image.mode == "L" and np.array_equal(np.asarray(image), images[3]) and label == labels[3]
    assert fashion_mnist("test", tmp_path, in_chans=3)[0][0].mode == "RGB"  # grayscale repeated


def test_idx_reader_rejects_garbage_and_truncation(tmp_path):
    (tmp_path / "bad").write_bytes(b"\x12\x34\x56\x78rest")
    with pytest.raises(ValueError, match="magic"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "ok", np.zeros((2, 3, 3)), gz=False)
    (tmp_path / "cut").write_bytes((tmp_path / "ok").read_bytes()[:-4])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "cut")


def test_missing_fashion_mnist_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="apt-get install -y dataset-fashion-mnist.*--data-dir"):
        fashion_mnist("train", tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte.gz not found.*apt-get"):
        fashion_mnist("train", tmp_path)


def test_cifar10_pickle_layout(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    base.mkdir()
    rng = np.random.default_rng(0)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    batches = []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.integers(0, 256, (3, 3072), dtype=np.uint8), b"labels": [1, 2, 3]}
        batches.append(batch)
        with open(base / name, "wb") as f:
            pickle.dump(batch, f)
    train = build_dataset("cifar10", "train", tmp_path, in_chans=3)
    val = build_dataset("cifar10", "test", tmp_path, in_chans=3)
    assert len(train) == 15 and len(val) == 3 and train.class_names[9] == "c9"
    # channel-planar rows become HWC images
    expected = batches[0][b"data"][0].reshape(3, 32, 32).transpose(1, 2, 0)
    assert np.array_equal(np.asarray(train[0][0]), expected) and train[0][1] == 1
    with pytest.raises(FileNotFoundError, match="cifar-100-python"):
        build_dataset("cifar100", "train", tmp_path, in_chans=3)


def make_folder(root: Path, classes: dict[str, int], corrupt: int = 0) -> None:
    rng = np.random.default_rng(0)
    for name, n in classes.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    for i in range(corrupt):
        (root / next(iter(classes)) / f"broken{i}.jpg").write_bytes(b"\xff\xd8 not really a jpeg")


def test_folder_skips_corrupt_images_and_counts_them(tmp_path):
    make_folder(tmp_path, {"cat": 3, "dog": 2}, corrupt=2)
    pre = Preprocess(16, 3, (0.5,) * 3, (0.25,) * 3, crop_pct=1.0)
    ds = SkippingImageFolder(tmp_path, transform=pre.eval_transform())
    assert ds.class_names == ["cat", "dog"] and len(ds) == 7
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        images, targets, skipped = collate_skipping([ds[i] for i in range(len(ds))])
    assert skipped == 2 and images.shape == (5, 3, 16, 16) and sorted(targets.tolist()) == [0, 0, 0, 1, 1]


def test_randaugment_top_magnitude_trains_on_healthy_images(tmp_path):
    # the 'inc1' posterize at magnitude 10 keeps 0 bits, which Pillow 13 refuses; the image must still be
    # augmented (black, as older Pillow made it) and trained on, not skipped as unreadable
    make_folder(tmp_path, {"cat": 2, "dog": 2})
    pre = Preprocess(16, 3, (0.5,) * 3, (0.25,) * 3, crop_pct=1.0)
    transform = pre.train_transform(auto_augment="rand-m10-n4-mstd0-inc1")
    posterize = [op for op in transform.transforms[2].ops if op.name == "PosterizeIncreasing"]
    assert posterize and all(np.asarray(op.aug_fn(Image.new("RGB", (4, 4), (200, 90, 7)), 0)).max() == 0
                             for op in posterize)
    ds = SeededDataset(SkippingImageFolder(tmp_path, transform=transform))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "skipping unreadable image"
        samples = [ds[(0, 0, position, position % 4)] for position in range(40)]
    assert all(sample is not None and sample[0].shape == (3, 16, 16) for sample in samples)


def test_folder_raises_a_transform_failure_instead_of_skipping_the_image(tmp_path):
    make_folder(tmp_path, {"cat": 1})

    def broken(_image):
        raise ValueError("bits must be between or equal to 1 and 8")

    with pytest.raises(RuntimeError, match="transform failed on the readable image .*0.png.*bits must be"):
        SkippingImageFolder(tmp_path, transform=broken)[0]


def test_folder_errors_before_training(tmp_path):
    make_folder(tmp_path / "a", {"cat": 1})
    (tmp_path / "a" / "empty_class").mkdir()
    with pytest.raises(ValueError, match="no images.*empty_class"):
        SkippingImageFolder(tmp_path / "a")
    (tmp_path / "b").mkdir()
    with pytest.raises(ValueError, match="no class sub-folders"):
        SkippingImageFolder(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SkippingImageFolder(tmp_path / "c")


def test_synthetic_is_deterministic_and_class_dependent():
    a, b = synthetic("train", 40, 4, 16, seed=3), synthetic("train", 40, 4, 16, seed=3)
    assert np.array_equal(a.images, b.images) and np.array_equal(a.labels, b.labels)
    class_means = np.stack([a.images[a.labels == c].astype(float).mean(axis=0) for c in range(4)])
    assert np.abs(class_means[0] - class_means[1]).mean() > 20  # classes differ: learnable
    assert not np.array_equal(a.images, synthetic("val", 40, 4, 16, seed=3).images)


@pytest.mark.parametrize("repeats", [0, 3])
def test_resumable_sampler_skips_exactly_and_shards_round_robin(repeats):
    ds = synthetic("train", 50, 2, 8)
    full = ResumableSampler(ds, seed=1, repeats=repeats)
    full.set_position(epoch=2)
    everything = list(full)
    resumed = ResumableSampler(ds, seed=1, repeats=repeats)
    resumed.set_position(epoch=2, skip=12)
    assert list(resumed) == everything[12:] and len(resumed) == len(everything) - 12
    other_epoch = ResumableSampler(ds, seed=1, repeats=repeats)
    other_epoch.set_position(epoch=3)
    assert [k[3] for k in other_epoch] != [k[3] for k in everything]
    if repeats == 0:  # two ranks together visit the single-process order, position by position
        ranks = [ResumableSampler(ds, seed=1, world_size=2, rank=r) for r in (0, 1)]
        for r in ranks:
            r.set_position(epoch=2)
        merged = sorted((k for r in ranks for k in r), key=lambda k: k[2])
        assert [k[3] for k in merged][:50] == [k[3] for k in everything]


def test_seeded_dataset_repeats_augmentation_for_the_same_key():
    pre = Preprocess(16, 1, (0.5,), (0.25,))
    ds = SeededDataset(synthetic("train", 8, 2, 16, transform=pre.train_transform(reprob=0.5)))
    first, again, other = ds[(0, 1, 5, 3)][0], ds[(0, 1, 5, 3)][0], ds[(0, 1, 6, 3)][0]
    assert torch.equal(first, again) and not torch.equal(first, other)


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_repeated_augmentation_keeps_copies_out_of_one_batch_on_any_process_count(world_size):
    """No rank's batch holds two copies of one image (they would share one Mixup lambda and CutMix box) on 1, 2
    (copies spread) or 4 processes (DeiT's placement: copies on different processes), the epoch keeps timm's
    images and counts, and it is exactly resumable."""
    from timm.data.distributed_sampler import RepeatAugSampler

    ds, global_batch = list(range(96)), 16
    for epoch in (0, 1):
        ours, timms = [], []
        for rank in range(world_size):
            sampler = ResumableSampler(ds, seed=3, world_size=world_size, rank=rank, repeats=3)
            sampler.set_position(epoch)
            order = [key[3] for key in sampler]
            timm_share = RepeatAugSampler(ds, num_replicas=world_size, rank=rank, num_repeats=3)
            timm_share.set_epoch(3 * 100_003 + epoch)
            ours += order
            timms += list(timm_share)
            batch = global_batch // world_size
            for start in range(0, len(order), batch):
                chunk = order[start:start + batch]
                assert len(set(chunk)) == len(chunk), (rank, epoch, start, chunk)
            resumed = ResumableSampler(ds, seed=3, world_size=world_size, rank=rank, repeats=3)
            resumed.set_position(epoch, skip=7)
            assert [key[3] for key in resumed] == order[7:]
        assert sorted(ours) == sorted(timms)  # the same images, as often, as timm's sampler deals them
        one = RepeatAugSampler(ds, num_replicas=1, rank=0, num_repeats=3)
        one.set_epoch(epoch)
        timm_order = list(one)
        assert any(a == b for a, b in zip(timm_order, timm_order[1:], strict=False))  # timm's: copies adjacent

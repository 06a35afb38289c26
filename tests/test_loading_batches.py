"""The trainer's one seam to the data: TrainBatches.batches(epoch, skip) for every data path alike."""

from __future__ import annotations

import json
import random
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import create_transform

from resmlp.data.loading.assemble import build_data
from resmlp.data.loading.batches import TrainBatches
from resmlp.data.loading.finish import DeviceFinish
from resmlp.data.shards import parse_size, write_shards
from resmlp.data.sources import open_source
from resmlp.preprocess import Preprocess
from resmlp.train.config import load_config

BATCH = 4
TINY = {"data.kind": "synthetic", "model.img_size": 16, "data.crop_pct": 1.0, "data.synthetic_size": [32, 8],
        "data.num_workers": 0}
PATHS = {  # each data path the trainer can be given, and how to tell it was the one built
    "arrays": ({}, lambda data: data.train_augment is not None),
    "per-image": ({"data.batch_augment": False}, lambda data: data.train_augment is None
                  and data.train_pipeline is None),
    "arrays on the device": ({"data.pipeline": "device", "data.auto_augment": "rand-m6-mstd0.5-inc1"},
                             lambda data: data.pipeline == "device" and data.train_augment is not None),
    "stream": ({"data.source": "wds"}, lambda data: data.train_pipeline is None and data.train_augment is None),
    "stream on the device": ({"data.source": "wds", "data.pipeline": "device"},
                             lambda data: data.train_pipeline is not None),
}


def _shards(root: Path) -> str:
    source = open_source("synthetic", synthetic_size=(32, 8), synthetic_classes=4, img_size=16, seed=0)
    write_shards(source, root, parse_size("1GB"), seed=0, shard_records=4, log=lambda _: None)
    return f"wds:{root}"


@pytest.mark.parametrize("path", list(PATHS))
def test_every_data_path_gives_an_epoch_from_any_position_exactly(path, tmp_path):
    overrides, built = PATHS[path]
    overrides = {**TINY, **overrides}
    if "stream" in path:
        overrides["data.source"] = _shards(tmp_path / "shards")
    cfg = load_config("fashion-mnist-quick", overrides)
    data = build_data(cfg.data, 1, 16, 0)
    assert built(data), f"the config did not build the {path} path"
    batches = TrainBatches(data, 0, 1, 0, 1, BATCH, 0, torch.device("cpu"))
    whole = list(batches.batches(epoch=1))
    assert len(whole) == len(batches) // BATCH > 1
    resumed = list(batches.batches(epoch=1, skip=2 * BATCH))  # a resume two batches into the epoch
    assert len(resumed) == len(whole) - 2
    for (images, targets, _), (images_again, targets_again, _) in zip(whole[2:], resumed, strict=True):
        torch.testing.assert_close(images_again, images)
        assert targets_again.tolist() == targets.tolist()
    other_epoch = list(batches.batches(epoch=2))
    assert any(not torch.equal(a[0], b[0]) for a, b in zip(whole, other_epoch, strict=False))


def _per_sample(transform, images: list[Image.Image]) -> torch.Tensor:
    """transform of each image, seeded by its index as SeededDataset seeds a sample by its key."""
    out = []
    for i, image in enumerate(images):
        random.seed(i)
        np.random.seed(i)
        torch.manual_seed(i)
        out.append(torch.as_tensor(transform(image)))
    return torch.stack(out)


def test_uint8_from_the_workers_is_the_float_batch_once_finished_on_the_device():
    pre = Preprocess(16, 3, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), 1.0, "bicubic")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (24, 20, 3), dtype=np.uint8)) for _ in range(8)]
    sent = _per_sample(pre.train_transform(auto_augment="rand-m9-mstd0.5-inc1", uint8=True), images)
    assert sent.dtype == torch.uint8
    float_path = _per_sample(pre.train_transform(auto_augment="rand-m9-mstd0.5-inc1"), images)
    torch.testing.assert_close(DeviceFinish(pre.mean, pre.std, 0.0)(sent), float_path, atol=1e-5, rtol=0)


def _erased(batch: torch.Tensor, plain: float) -> torch.Tensor:
    """Per image: the fraction of its pixels that are no longer the plain image's value (erased with noise)."""
    return (batch - plain).abs().gt(1e-4).float().mean(dim=(1, 2, 3))


def test_erasing_on_the_device_draws_as_timm_erases_per_image():
    pre = Preprocess(16, 3, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), 1.0, "bicubic")
    count, plain = 400, (128 - 127.5) / 63.75
    torch.manual_seed(0)
    random.seed(0)
    on_device = _erased(DeviceFinish(pre.mean, pre.std, 0.5)(torch.full((count, 3, 16, 16), 128, dtype=torch.uint8)),
                        plain)
    timm_erasing = create_transform(16, is_training=True, scale=(1.0, 1.0), ratio=(1.0, 1.0), hflip=0.0,
                                    color_jitter=0.0, mean=pre.mean, std=pre.std, re_prob=0.5, re_mode="pixel",
                                    re_count=1)
    per_image = _erased(_per_sample(timm_erasing, [Image.new("RGB", (16, 16), (128,) * 3)] * count), plain)
    for ours, theirs in ((on_device, per_image), (on_device[on_device > 0], per_image[per_image > 0])):
        assert abs(ours.gt(0).float().mean() - theirs.gt(0).float().mean()) < 0.1  # which images are erased
        assert abs(ours.mean() - theirs.mean()) < 0.05  # how much of an image
    assert 0.4 < on_device.gt(0).float().mean() < 0.6


def test_the_uint8_transport_benchmark_runs_at_tiny_size(tmp_path, monkeypatch):
    script = runpy.run_path(str(Path(__file__).parents[1] / "benchmarks" / "uint8_transport.py"))
    script["make_folder"](tmp_path / "jpegs", 8, size=(20, 24))
    monkeypatch.setattr(sys, "argv", ["uint8_transport.py", "--folder", str(tmp_path / "jpegs"), "--batch", "2",
                                      "--batches", "1", "--img-size", "16", "--json", str(tmp_path / "out.json")])
    script["main"]()
    results = json.loads((tmp_path / "out.json").read_text())["results"]
    sent = {name: row["bytes_per_image"] for name, row in results.items()}
    assert sent == {"float32 from the workers": 4 * 3 * 16 * 16, "uint8 from the workers": 3 * 16 * 16,
                    "timm prefetcher loader": 3 * 16 * 16}


@pytest.mark.parametrize("recount", [1, 3])
def test_batched_erasing_erases_timms_boxes_in_timms_order(recount):
    """DeviceFinish's batched erasing (finish.erase_boxes + paint_boxes) against timm's RandomErasing, the
    library it twins: with the same `random` state, the same boxes of the same images (const fill makes them
    visible), the later of two overlapping boxes winning (rand fill), and a box count that does not change the
    number of ops."""
    from timm.data.random_erasing import RandomErasing

    from resmlp.data.loading.finish import erase_boxes, paint_boxes

    for seed in range(8):
        x = torch.randn(12, 3, 20, 24, generator=torch.Generator().manual_seed(seed))
        random.seed(seed)
        theirs = RandomErasing(0.6, mode="const", max_count=recount, device="cpu")(x.clone())
        random.seed(seed)
        boxes = erase_boxes(12, 20, 24, 0.6, recount)
        ours = paint_boxes(x.clone(), torch.tensor(boxes), "const") if boxes else x
        assert torch.equal(ours, theirs), seed
    overlapping = torch.tensor([[0, 0, 0, 10, 10], [0, 5, 5, 10, 10]])
    painted = paint_boxes(torch.zeros(1, 3, 20, 20), overlapping, "rand")
    assert torch.equal(painted[0, :, 7, 7], painted[0, :, 14, 14])  # the overlap has the second box's colour
    assert not torch.equal(painted[0, :, 2, 2], painted[0, :, 14, 14])

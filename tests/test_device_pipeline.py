"""data.pipeline: device -- workers read, the device decodes (resmlp.data.device.decode, resmlp.data.device.pipeline).

Decoding equals the timm path's (resmlp.data.images.decode_image) within 1 level on the CPU; what torchvision
can't decode exactly (PNG, CMYK, EXIF-rotated) takes PIL's path and is counted; unreadable files are skipped and
counted; the size bound is checked from the header; a training run records its pipeline in summary.json.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from resmlp.cli import main
from resmlp.data.device import decode
from resmlp.data.device.augment import DeviceAugment
from resmlp.data.device.decode import EncodedDataset, collate_encoded, decode_batch, device_decodable
from resmlp.data.device.pipeline import DevicePipeline
from resmlp.data.images import decode_image
from resmlp.data.records import MapRecords
from resmlp.errors import DataError


def photo(h: int = 37, w: int = 53, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([xx * 4, yy * 5 + xx, 128 + 60 * np.cos((xx + yy) / 7)], -1)
    return np.clip(img + rng.normal(0, 10, img.shape), 0, 255).astype(np.uint8)


def encoded(img: np.ndarray | Image.Image, fmt: str = "JPEG", **options) -> bytes:
    out = io.BytesIO()
    (img if isinstance(img, Image.Image) else Image.fromarray(img)).save(out, fmt, **options)
    return out.getvalue()


def rotated_jpeg() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees on display
    return encoded(photo(), exif=exif.tobytes())


class BytesRecords(MapRecords):
    def __init__(self, payloads: list[bytes]) -> None:
        super().__init__(np.arange(len(payloads)) % 2, ["a", "b"])
        self.payloads = payloads

    def payload(self, index: int) -> bytes:
        return self.payloads[index]

    def name(self, index: int) -> str:
        return f"file{index}"


PAYLOADS = {
    "rgb jpeg": (encoded(photo(), quality=90), True),
    "progressive jpeg": (encoded(photo(seed=1), quality=75, progressive=True), True),
    "grey jpeg": (encoded(Image.fromarray(photo(seed=2)).convert("L")), True),
    "png": (encoded(photo(seed=3), "PNG"), False),
    "cmyk jpeg": (encoded(Image.fromarray(photo(seed=4)).convert("CMYK")), False),
    "exif-rotated jpeg": (rotated_jpeg(), False),
    "16-bit png": (encoded(Image.fromarray(photo()[..., 0].astype(np.uint16) * 257), "PNG"), False),
}


@pytest.mark.parametrize("in_chans", [3, 1])
def test_every_format_decodes_as_the_timm_path_does(in_chans):
    names = list(PAYLOADS)
    data = EncodedDataset(BytesRecords([PAYLOADS[n][0] for n in names]), in_chans)
    items = [data[(0, 0, i, i)] for i in range(len(names))]
    assert [on_device for _, on_device, _, _ in items] == [PAYLOADS[n][1] for n in names]
    images, kept, fallbacks = decode_batch(collate_encoded(items), torch.device("cpu"), in_chans)
    assert kept == list(range(len(names))) and fallbacks == 0
    for name, image in zip(names, images, strict=True):
        expected = np.asarray(decode_image(PAYLOADS[name][0], in_chans))
        ours = image if image.shape[0] == in_chans else _as_channels(image, in_chans)
        ours = ours.permute(1, 2, 0).numpy().squeeze(-1) if in_chans == 1 else ours.permute(1, 2, 0).numpy()
        assert ours.shape == expected.shape, name
        assert np.abs(ours.astype(int) - expected.astype(int)).max() <= 1, name


def _as_channels(image: torch.Tensor, in_chans: int) -> torch.Tensor:
    from resmlp.data.device.rand_augment import luminance

    return luminance(image[None].float())[0].to(torch.uint8) if in_chans == 1 else image.expand(3, -1, -1)


def test_unreadable_files_are_skipped_and_counted_and_bombs_refused_from_the_header():
    bomb = encoded(np.zeros((64, 64, 3), np.uint8))
    with pytest.raises(DataError, match="more than the limit of 100"):
        device_decodable(bomb, "bomb.jpg", max_pixels=100)
    good = PAYLOADS["rgb jpeg"][0]
    truncated_body = good[:len(good) // 2]  # a fine header, then the data stops
    records = BytesRecords([good, b"\xff\xd8 not a jpeg", truncated_body, good])
    data = EncodedDataset(records, 3)
    with pytest.warns(UserWarning) as caught:
        items = [data[(0, 0, i, i)] for i in range(4)]
    # the truncated JPEG (no end-of-image marker) is decoded by the worker, whose refusal names it (issue 55: the
    # device's decoder, which sees bytes only, skipped it without its name)
    assert [str(w.message).split(":")[0] for w in caught] == ["skipping unreadable image file1",
                                                              "skipping unreadable image file2"]
    batch = collate_encoded(items)
    assert batch.skipped == 2
    pipeline = DevicePipeline(DeviceAugment(16, 3, (0.5,) * 3, (0.5,) * 3), data, 3)
    x, targets, skipped, counts = pipeline(batch)
    assert len(x) == len(targets) == 4 - skipped and skipped == 2
    assert counts["decoded_on_device"] == 2 and counts["pil_fallback"] == 0


def test_a_batch_gets_the_same_images_as_its_members_alone():
    payloads = [PAYLOADS[n][0] for n in PAYLOADS]
    data = EncodedDataset(BytesRecords(payloads), 3)
    pipeline = DevicePipeline(DeviceAugment(24, 3, (0.5,) * 3, (0.5,) * 3, auto_augment="rand-m9-mstd0.5-inc1",
                                            reprob=0.25), data, 3)
    keys = [(1, 0, i, i) for i in range(len(payloads))]
    whole, targets, _, counts = pipeline(collate_encoded([data[k] for k in keys]))
    assert whole.shape == (len(payloads), 3, 24, 24) and targets.tolist() == [i % 2 for i in range(len(payloads))]
    assert counts == {"decoded_on_device": 3, "pil_fallback": 4}
    part, _, _, _ = pipeline(collate_encoded([data[k] for k in keys[2:5]]))
    assert torch.equal(part, whole[2:5])


def make_jpeg_folder(root: Path, per_class: int = 6) -> Path:
    for split in ("train", "val"):
        for label, name in enumerate(("dark", "light")):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                img = np.clip(photo(30 + i, 40, seed=i).astype(int) // 2 + 100 * label, 0, 255).astype(np.uint8)
                Image.fromarray(img).save(root / split / name / f"{i}.jpg", quality=90)
    Image.fromarray(photo()).save(root / "train" / "dark" / "x.png")
    (root / "train" / "light" / "broken.jpg").write_bytes(b"\xff\xd8 broken")
    return root


TINY = ["--set=model.img_size=16", "--set=model.patch_size=8", "--set=model.dim=16", "--set=model.depth=1",
        "--set=schedule.epochs=1", "--set=schedule.warmup_epochs=0", "--set=train.batch_size=4",
        "--set=train.progress=false", "--set=train.compile=false", "--set=train.threads=1",
        "--set=data.auto_augment=rand-m9-mstd0.5-inc1", "--set=data.reprob=0.25", "--set=data.mixup=0.8",
        "--set=data.cutmix=1.0", "--set=loss.label_smoothing=0.1"]


@pytest.mark.parametrize(("pipeline", "workers"), [("device", 0), ("device", 1), ("timm", 0)])
def test_a_run_trains_on_the_chosen_pipeline_and_records_it(tmp_path, pipeline, workers):
    data = make_jpeg_folder(tmp_path / "data")
    out = tmp_path / "run"
    with pytest.warns(UserWarning, match="skipping unreadable image") if workers == 0 else warnings.catch_warnings():
        code = main(["train", "--data-dir", str(data), "--set=data.kind=folder", f"--set=data.pipeline={pipeline}",
                     f"--set=data.num_workers={workers}", "--out", str(out), *TINY])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data_pipeline"]["name"] == pipeline
    if pipeline == "device":  # the PNG goes through PIL, the JPEGs through decode_jpeg (in a worker too)
        assert summary["data_pipeline"]["decoded_on_device"] > 0


@pytest.mark.parametrize(("override", "message"), [
    ("data.pipeline=gpu", "is not one of auto, device, timm"),
    ("data.auto_augment=augmix-m5-w4-d2", "set data.pipeline=timm"),
    ("data.color_jitter=0.4", "does not run data.color_jitter"),
])
def test_what_the_device_pipeline_cannot_run_is_refused_in_one_line(tmp_path, capsys, override, message):
    data = make_jpeg_folder(tmp_path / "data")
    code = main(["train", "--data-dir", str(data), "--set=data.kind=folder", "--set=data.pipeline=device",
                 f"--set={override}", "--out", str(tmp_path / "run"), *TINY[:-5]])
    err = capsys.readouterr().err
    assert code != 0 and message in err and "Traceback" not in err


# ----------------------------------------------------------------------------------------- DINO's multi-crop
def test_dino_trains_on_the_device_pipeline(tmp_path):
    data = make_jpeg_folder(tmp_path / "data")
    out = tmp_path / "run"
    sets = [f"--set={k}={v}" for k, v in {
        "data.kind": "folder", "data.pipeline": "device", "data.num_workers": 0, "model.img_size": 16,
        "model.patch_size": 8, "model.dim": 16, "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
        "train.batch_size": 4, "train.progress": "false", "train.compile": "false", "train.threads": 1,
        "dino.out_dim": 16, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 1,
        "dino.local_size": 8, "dino.knn_k": 3}.items()]
    with pytest.warns(UserWarning, match="skipping unreadable image"):
        code = main(["pretrain", "dino", "--data-dir", str(data), "--output", str(out), *sets])
    assert code == 0
    assert json.loads((out / "summary.json").read_text())["data_pipeline"]["decoded_on_device"] > 0


def test_a_batch_in_which_no_image_decodes_is_one_line(capsys):
    good = PAYLOADS["rgb jpeg"][0]
    truncated_body = good[:len(good) // 2]  # fine headers; handed to the decoders as bytes, they refuse them
    data = EncodedDataset(BytesRecords([truncated_body, truncated_body]), 3)
    pipeline = DevicePipeline(DeviceAugment(16, 3, (0.5,) * 3, (0.5,) * 3), data, 3)
    with pytest.warns(UserWarning, match="decode_jpeg and PIL both refuse"), \
            pytest.raises(DataError, match="no image of a batch of 2 could be decoded"):
        pipeline(collate_encoded([(truncated_body, True, 0, i) for i in range(2)]))


def test_huge_jpegs_are_decoded_by_the_workers_within_the_batchs_share_of_pixels():
    big = encoded(np.kron(photo(40, 50), np.ones((8, 8, 1), np.uint8)), quality=90)  # 320 x 400
    small = PAYLOADS["rgb jpeg"][0]  # 37 x 53
    data = EncodedDataset(BytesRecords([big, small, big]), 3)
    pipeline = DevicePipeline(DeviceAugment(16, 3, (0.5,) * 3, (0.5,) * 3), data, 3)
    pipeline.loader(None, batch_size=3, num_workers=0, device=torch.device("cpu"))
    assert data.share == decode.DEVICE_BATCH_PIXELS // 3
    data.share = 100 * 100  # as a batch of huge headers would: 128,000 pixels each is over the share
    items = [data[(0, 0, i, i)] for i in range(3)]
    assert [item[1] for item in items] == [False, True, False]  # the big ones come decoded, at 1/4 scale
    assert items[0][0].shape == (80, 100, 3)
    full = np.asarray(Image.open(io.BytesIO(big)).convert("RGB").reduce(4)).astype(int)
    assert np.abs(items[0][0].astype(int) - full).mean() < 3  # the same picture
    images, kept, _ = decode_batch(collate_encoded(items), torch.device("cpu"))
    assert sum(image.numel() for image in images) <= 3 * 3 * data.share
    x, _, _, counts = pipeline(collate_encoded(items))
    assert x.shape == (3, 3, 16, 16) and counts["pil_fallback"] == 2

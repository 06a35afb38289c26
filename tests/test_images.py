"""Hostile and unusual image files: decompression bombs, 16-bit and float images, palettes with alpha."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import resmlp
from resmlp.data import SkippingImageFolder, collate_skipping
from resmlp.data.images import open_image
from resmlp.errors import DataError
from resmlp.preprocess import Preprocess


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _bomb_png(path: Path, side: int = 20000) -> Path:
    """A valid PNG header declaring side x side gray pixels, with a few bytes of pixel data: a tiny file
    that a reader trusting the header would allocate side**2 bytes for."""
    ihdr = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * (side + 1))  # the first row only
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))
    return path


def test_a_decompression_bomb_is_a_data_error_before_decoding(tmp_path):
    bomb = _bomb_png(tmp_path / "bomb.png")
    assert bomb.stat().st_size < 2000
    with pytest.raises(DataError, match="bomb.png"):
        open_image(bomb)
    # just over our bound but under twice PIL's (where PIL itself only warns): refused by the header check
    with pytest.raises(DataError, match=r"10000x10000 pixels, more than the limit"):
        open_image(_bomb_png(tmp_path / "b2.png", 10000))


def test_the_pixel_limit_can_be_lowered_and_raised(tmp_path, monkeypatch):
    path = tmp_path / "x.png"
    Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(path)
    with pytest.raises(DataError, match="more than the limit of 1000"):
        open_image(path, max_pixels=1000)
    monkeypatch.setenv("RESMLP_MAX_IMAGE_PIXELS", "1000")
    with pytest.raises(DataError, match="RESMLP_MAX_IMAGE_PIXELS=4096 in the environment"):
        open_image(path)
    assert open_image(path, max_pixels=64 * 64).size == (64, 64)


def test_a_bomb_in_an_image_folder_is_skipped_and_counted_like_a_corrupt_file(tmp_path):
    for cls in ("a", "b"):
        (tmp_path / cls).mkdir()
        for i in range(2):
            Image.fromarray(np.full((8, 8, 3), 40 * i, np.uint8)).save(tmp_path / cls / f"{i}.png")
    _bomb_png(tmp_path / "a" / "bomb.png")
    dataset = SkippingImageFolder(tmp_path, in_chans=3, transform=lambda im: torch.from_numpy(np.array(im)))
    with pytest.warns(UserWarning, match="skipping unreadable image .*bomb.png"):
        items = [dataset[i] for i in range(len(dataset))]
    images, targets, skipped = collate_skipping(items)
    assert skipped == 1 and images.shape[0] == 4 and targets.tolist() == [0, 0, 1, 1]


def test_a_16_bit_png_reads_like_its_8_bit_version_and_predicts_the_same(tmp_path):
    rng = np.random.default_rng(0)
    eight = rng.integers(0, 256, (40, 40), dtype=np.uint8)
    Image.fromarray(eight).save(tmp_path / "8.png")
    Image.fromarray(eight.astype(np.uint16) * 257).save(tmp_path / "16.png")  # the same image at 16 bits
    assert Image.open(tmp_path / "16.png").mode.startswith("I")
    for chans in (1, 3):
        a, b = (np.asarray(open_image(tmp_path / f"{d}.png", chans), dtype=np.int16) for d in (8, 16))
        assert np.abs(a - b).max() <= 1 and a.std() > 50  # not saturated at 255 as convert('L') would be
    model = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=1, num_classes=5,
                                in_chans=1).eval()
    pre = Preprocess(32, 1, (0.5,), (0.25,), crop_pct=1.0)
    x8, x16 = pre.load(tmp_path / "8.png"), pre.load(tmp_path / "16.png")
    assert (x8 - x16).abs().max() <= 1 / 255 / 0.25 + 1e-5
    with torch.no_grad():
        assert torch.equal(model(x8[None]).argmax(-1), model(x16[None]).argmax(-1))


def test_float_and_palette_alpha_images_convert_by_their_range(tmp_path):
    ramp = np.linspace(0, 1, 32 * 32, dtype=np.float32).reshape(32, 32)
    Image.fromarray(ramp, mode="F").save(tmp_path / "f.tiff")
    gray = np.asarray(open_image(tmp_path / "f.tiff", 1))
    assert gray.min() == 0 and gray.max() == 255
    palette = Image.new("P", (4, 4))
    palette.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    palette.info["transparency"] = 0
    palette.save(tmp_path / "p.png")
    assert np.asarray(open_image(tmp_path / "p.png")).shape == (4, 4, 3)


def test_garbage_is_a_data_error_naming_the_file(tmp_path):
    (tmp_path / "x.jpg").write_bytes(b"not an image at all")
    with pytest.raises(DataError, match=r"cannot read image .*x\.jpg"):
        open_image(tmp_path / "x.jpg")
    with pytest.raises(ValueError, match=r"x\.jpg"):  # Preprocess.load's contract: a ValueError
        Preprocess(32, 3, (0.5,) * 3, (0.25,) * 3).load(tmp_path / "x.jpg")

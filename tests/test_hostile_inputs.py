"""Inputs that mean nothing are refused, and unusual ones read as they are meant: k-NN arguments, high-depth and
rotated images, exotic checkpoint dtypes, damaged Fashion-MNIST files."""

from __future__ import annotations

import gzip
import struct
import warnings

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file

import resmlp
from resmlp.checkpoint import CheckpointError, read_checkpoint
from resmlp.cli import main
from resmlp.data import build_dataset
from resmlp.data.images import open_image
from resmlp.data.sources.fashion_mnist import fashion_mnist, read_idx
from resmlp.errors import ConfigError, DataError
from resmlp.train.probe import knn_accuracy

GRADIENT = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (16, 1))  # 16x16, 0..240 across


@pytest.mark.parametrize("temperature", ["0", "nan", "-1", "inf"])
def test_eval_knn_refuses_a_temperature_that_means_nothing(tmp_path, capsys, temperature):
    ckpt = resmlp.save(resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1),
                       tmp_path / "m.safetensors")
    assert main(["eval-knn", str(ckpt), "--data", "synthetic", "--temperature", temperature]) == 2
    err = capsys.readouterr().err
    assert f"--temperature {float(temperature)!r}: expected a number from" in err and "Traceback" not in err


def test_knn_arguments_are_checked_in_the_library_too():
    x, y = np.eye(4, dtype=np.float32), np.arange(4)
    with pytest.raises(ConfigError, match="--k 0"):
        knn_accuracy(x, y, x, y, k=0)
    with pytest.raises(ConfigError, match="--temperature nan"):
        knn_accuracy(x, y, x, y, temperature=float("nan"))


def test_a_small_temperature_votes_for_the_nearest_neighbour_without_overflow():
    rng = np.random.default_rng(0)
    memory, labels = rng.normal(size=(50, 8)).astype(np.float32), rng.integers(0, 5, 50)
    queries = memory[:20] + 0.01 * rng.normal(size=(20, 8)).astype(np.float32)
    # exp(1 / 1e-4) overflows float32; relative weights make the nearest neighbour decide: the query's own point
    assert knn_accuracy(memory, labels, queries, labels[:20], k=10, temperature=1e-4) == 100.0


def test_analyze_refuses_a_threshold_outside_0_1(tmp_path, capsys):
    ckpt = resmlp.save(resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1),
                       tmp_path / "m.safetensors")
    assert main(["analyze", str(ckpt), "--output", str(tmp_path / "a"), "--threshold", "nan"]) == 2
    assert "--threshold nan: expected a fraction" in capsys.readouterr().err


def _tiff(path, array: np.ndarray, mode: str):
    Image.fromarray(array, mode=mode).save(path)
    return path


def test_a_float_tiff_holding_0_255_reads_as_its_8bit_version_with_a_warning(tmp_path):
    path = _tiff(tmp_path / "f.tif", GRADIENT.astype(np.float32), "F")
    with pytest.warns(UserWarning, match="values up to 255"):
        image = open_image(path, in_chans=1)
    assert np.array_equal(np.asarray(image), GRADIENT)  # not clipped to white


def test_a_float_tiff_in_0_1_reads_without_a_warning(tmp_path):
    path = _tiff(tmp_path / "f.tif", GRADIENT.astype(np.float32) / 255, "F")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        image = open_image(path, in_chans=1)
    assert np.abs(np.asarray(image).astype(int) - GRADIENT).max() <= 1


def test_a_32bit_tiff_above_16_bits_is_scaled_by_its_maximum_with_a_warning(tmp_path):
    values = GRADIENT.astype(np.int32) * 100_000  # up to 24,000,000
    path = _tiff(tmp_path / "i.tif", values, "I")
    with pytest.warns(UserWarning, match="i.tif .*outside its format's usual range"):
        image = np.asarray(open_image(path, in_chans=1)).astype(int)
    expected = np.round(GRADIENT / 240 * 255)
    assert np.abs(image - expected).max() <= 1 and len(np.unique(image)) == 16  # no longer all white


def test_a_float_image_with_nan_pixels_is_refused(tmp_path):
    values = GRADIENT.astype(np.float32) / 255
    values[3, 3] = np.nan
    with pytest.raises(DataError, match="f.tif holds NaN"):
        open_image(_tiff(tmp_path / "f.tif", values, "F"))


def test_the_exif_orientation_is_applied(tmp_path):
    pixels = np.zeros((8, 16, 3), np.uint8)  # wide: 16 across, 8 down, the left half white
    pixels[:, :8] = 255
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 degrees clockwise to view
    path = tmp_path / "phone.png"
    Image.fromarray(pixels).save(path, exif=exif)
    image = open_image(path)
    assert image.size == (8, 16)  # now tall, as a viewer shows it
    upright = np.asarray(image)
    assert upright[:8].min() == 255 and upright[8:].max() == 0  # the white half is on top


def test_every_image_reader_goes_through_open_image(tmp_path):
    """Training, evaluation, predict and DINO read image folders through one dataset class and predict's files
    through Preprocess: both call open_image, so a rotated photo is upright everywhere."""
    for split in ("train", "val"):
        folder = tmp_path / split / "a"
        folder.mkdir(parents=True)
        pixels = np.zeros((8, 16, 3), np.uint8)
        exif = Image.Exif()
        exif[0x0112] = 6
        Image.fromarray(pixels).save(folder / "x.png", exif=exif)
    image, _ = build_dataset("folder", "train", tmp_path, in_chans=3)[0]
    assert image.size == (8, 16)


def _tiny_file(tmp_path, dtype: torch.dtype, poison: bool = False):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=3)
    path = resmlp.save(model, tmp_path / "m.safetensors")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(path).items()}
    if poison:
        tensors["head.weight"][0, 0] = float("nan")
    save_file(tensors, str(path), metadata=meta)
    return path


@pytest.mark.parametrize("dtype", [torch.complex64, torch.bool])
def test_exotic_checkpoint_dtypes_are_refused_naming_the_tensor(tmp_path, dtype):
    with pytest.raises(CheckpointError, match=f"is of dtype {str(dtype).removeprefix('torch.')}, which no weight"):
        resmlp.load(_tiny_file(tmp_path, dtype))


def test_a_float8_checkpoint_is_checked_for_nan_not_crashed_on(tmp_path):
    read_checkpoint(_tiny_file(tmp_path, torch.float8_e4m3fn))
    with pytest.raises(CheckpointError, match="'head.weight' holds 1 NaN"):
        read_checkpoint(_tiny_file(tmp_path, torch.float8_e4m3fn, poison=True))


def _idx(path, header: bytes, payload: bytes = b"", gz: bool = True):
    raw = header + payload
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def test_a_corrupt_gzip_is_a_data_error_naming_the_file(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(b"\0" * 100)[:30] + b"garbage")
    with pytest.raises(DataError, match="train-images-idx3-ubyte.gz is not a readable gzip file"):
        read_idx(path)


def test_a_zero_dimension_idx_header_is_a_data_error(tmp_path):
    path = _idx(tmp_path / "x.gz", bytes([0, 0, 8, 0]), b"\x07")
    with pytest.raises(DataError, match="x.gz: IDX header declares 0 dimension"):
        read_idx(path)


def test_labels_that_do_not_match_the_images_are_a_data_error(tmp_path):
    images = np.zeros((3, 4, 4), np.uint8)
    _idx(tmp_path / "train-images-idx3-ubyte.gz", bytes([0, 0, 8, 3]) + struct.pack(">III", 3, 4, 4),
         images.tobytes())
    _idx(tmp_path / "train-labels-idx1-ubyte.gz", bytes([0, 0, 8, 1]) + struct.pack(">I", 3), bytes([0, 1, 42]))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte.gz: expected 3 labels from 0 to 9"):
        fashion_mnist("train", tmp_path)


def test_a_damaged_fashion_mnist_folder_is_one_line_on_the_command_line(tmp_path, capsys):
    ckpt = resmlp.save(resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, dim=8, depth=1, in_chans=1),
                       tmp_path / "m.safetensors", metadata={"preprocess": {"img_size": 28, "in_chans": 1,
                                                                            "mean": [0.5], "std": [0.25]}})
    data = tmp_path / "fm"
    data.mkdir()
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (data / f"{name}.gz").write_bytes(b"\x1f\x8b not really gzip")
    assert main(["eval-knn", str(ckpt), "--data", "fashion-mnist", "--data-dir", str(data)]) == 2
    err = capsys.readouterr().err
    assert "is not a readable gzip file" in err and "Traceback" not in err


def test_an_uncompressed_idx_file_is_bounded_like_a_gzipped_one(tmp_path, monkeypatch):
    from resmlp.data.sources import fashion_mnist as fm

    path = _idx(tmp_path / "x-idx1-ubyte", bytes([0, 0, 8, 1]) + struct.pack(">I", 2000), bytes(2000), gz=False)
    monkeypatch.setattr(fm, "MAX_IDX_BYTES", 1000)
    with pytest.raises(DataError, match="x-idx1-ubyte holds more than 1000 bytes"):
        read_idx(path)


def test_an_idx_strip_of_images_is_refused_by_its_aspect_ratio(tmp_path):
    """1 x 4,000 pixels per image: few pixels, but resized to the model's size a strip takes gigabytes."""
    _idx(tmp_path / "train-images-idx3-ubyte", bytes([0, 0, 8, 3]) + struct.pack(">III", 1, 1, 4000),
         bytes(4000), gz=False)
    _idx(tmp_path / "train-labels-idx1-ubyte", bytes([0, 0, 8, 1]) + struct.pack(">I", 1), bytes(1), gz=False)
    with pytest.raises(DataError, match=r"4000x1 pixels, a side ratio above 100:1"):
        fashion_mnist("train", tmp_path)


def test_a_fifo_named_like_an_image_is_never_opened(tmp_path):
    """Opening a FIFO blocks until a writer comes: every reader checks the file type first."""
    import os
    from pathlib import Path

    from resmlp.commands.predict import expand_inputs
    from resmlp.data import SkippingImageFolder

    (tmp_path / "cls").mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "cls" / "a.png")
    os.mkfifo(tmp_path / "cls" / "x.png")
    with pytest.raises(DataError, match="not a regular file"):
        open_image(tmp_path / "cls" / "x.png")
    assert [Path(p).name for p, _ in SkippingImageFolder(tmp_path).samples] == ["a.png"]
    paths, errors = expand_inputs([str(tmp_path / "cls"), str(tmp_path / "cls" / "x.png"),
                                   str(tmp_path / "**" / "*.png")])
    assert [p.name for p in paths] == ["a.png"] and "not a regular file" in errors[0]["error"]


def test_symlinks_to_parent_folders_make_no_loop(tmp_path):
    """Two links to `..` in each folder: torchvision's walk and Python's recursive glob grow exponentially."""
    import os

    from resmlp.commands.predict import expand_inputs
    from resmlp.data import SkippingImageFolder

    (tmp_path / "data" / "cls" / "sub").mkdir(parents=True)
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "data" / "cls" / "sub" / "a.png")
    for folder in (tmp_path / "data" / "cls", tmp_path / "data" / "cls" / "sub"):
        os.symlink("..", folder / "up1")
        os.symlink("..", folder / "up2")
    assert len(SkippingImageFolder(tmp_path / "data").samples) == 1
    paths, _ = expand_inputs([str(tmp_path / "data" / "**" / "*.png"), str(tmp_path / "data")])
    assert [p.name for p in paths] == ["a.png"]


def test_the_walk_is_bounded(tmp_path):
    from resmlp.data.sources.walk import expand_pattern

    for i in range(20):
        (tmp_path / f"f{i}.txt").write_text("x")
    with pytest.raises(DataError, match="more than 10 entries"):
        expand_pattern(str(tmp_path / "**" / "*.png"), max_entries=10)


def test_glob_patterns_match_as_glob_does(tmp_path):
    from resmlp.data.sources.walk import expand_pattern

    for rel in ("a.png", "b.jpg", "s/c.png", "s/t/d.png", "s/t/e.PNG"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    names = lambda pattern: sorted(p.relative_to(tmp_path).as_posix() for p in expand_pattern(str(tmp_path / pattern)))  # noqa: E731
    assert names("**/*.png") == ["a.png", "s/c.png", "s/t/d.png"]
    assert names("s/**/*.png") == ["s/c.png", "s/t/d.png"]
    assert names("*.png") == ["a.png"]
    assert names("s/*/[de].*") == ["s/t/d.png", "s/t/e.PNG"]


def test_a_strip_image_is_refused_by_its_aspect_ratio_or_resized_size(tmp_path):
    """A 1 x 20,000 PNG (few pixels) would be resized to 256 x 5,120,000 by a 224-px model's evaluation."""
    from resmlp.preprocess import Preprocess

    strip = tmp_path / "strip.png"
    Image.fromarray(np.zeros((1, 20000, 3), np.uint8)).save(strip)
    with pytest.raises(DataError, match="strip.png is 20000x1 pixels, a side ratio above 100:1"):
        open_image(strip)
    wide = tmp_path / "wide.png"  # 90:1, a ratio open_image allows
    Image.fromarray(np.zeros((10, 900, 3), np.uint8)).save(wide)
    pre = Preprocess(2048, 3, (0.5,) * 3, (0.5,) * 3, crop_pct=0.5)
    with pytest.raises(DataError, match=r"wide.png: a 900x10-pixel image resized to a shorter side of 4096"):
        pre.load(wide)


def test_any_decoder_error_is_a_data_error_naming_the_file(tmp_path, monkeypatch):
    """PIL's AVIF decoder raises RuntimeError('Failed to decode frame 0') for a damaged file."""
    from PIL import ImageFile

    path = tmp_path / "x.png"
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path)

    def broken_decoder(self):
        raise RuntimeError("Failed to decode frame 0")

    monkeypatch.setattr(ImageFile.ImageFile, "load", broken_decoder)
    with pytest.raises(DataError, match="cannot read image .*x.png: RuntimeError: Failed to decode frame 0"):
        open_image(path)


def test_a_batch_of_only_unreadable_images_is_one_line_even_from_a_worker():
    """The DataLoader re-raises a worker's error with the worker's traceback as its text: the message is its
    last line."""
    from torch.utils.data import DataLoader

    from resmlp.data import collate_skipping
    from resmlp.errors import user_message

    loader = DataLoader([None, None], batch_size=2, num_workers=1, collate_fn=collate_skipping)
    with pytest.raises(DataError) as caught:
        next(iter(loader))
    assert "Original Traceback" in str(caught.value)
    assert user_message(caught.value) == ("every image of a batch (2) was unreadable (see the warnings above); "
                                          "check the dataset files")


def test_an_image_folder_lists_its_samples_in_torchvisions_order(tmp_path):
    """Sample order decides the validation split carved from a folder: the bounded walk keeps ImageFolder's."""
    from torchvision.datasets import ImageFolder

    from resmlp.data import SkippingImageFolder

    for rel in ("a/x.png", "a/b/y.png", "a/b-c/z.png", "a/b/d/w.png", "b/q.png", "b/A.png"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / rel)
    assert SkippingImageFolder(tmp_path).samples == ImageFolder(str(tmp_path)).samples

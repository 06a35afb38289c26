"""Opening one image file safely: bounded size, every bit depth scaled to 8-bit meaning, one error type.

All image reading (predict's files, image-folder datasets) goes through `open_image`, so that
- a decompression bomb (a small file declaring a huge size) is refused from its header, before any pixel
  is decoded, as a DataError that folder readers count as a skipped image like any corrupt file;
- 16-bit ('I;16*'), 32-bit integer ('I') and float ('F') images are scaled to [0, 255] by their real
  range, not clipped at 255 as PIL's convert('L') does, so a 16-bit scan means what its 8-bit version means:
  16-bit data by 65535; 'I' data by 65535 while it fits 16 bits (16-bit PNGs and TIFFs open as 'I'), else by
  its own maximum; float data by 1 when it lies in [0, 1], by 255 when in [0, 255] (how float TIFFs are often
  saved), else from 0 (or its minimum, when negative) to its maximum. Those last two warn;
  NaN or infinite pixels are refused;
- the EXIF orientation is applied (ImageOps.exif_transpose): a phone photo is seen upright, as a viewer
  shows it;
- palette images with transparency and bilevel images convert without PIL's warnings.
"""

from __future__ import annotations

import io
import os
import stat
import warnings
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps

from resmlp.errors import ConfigError, DataError

# PIL's own bound (about 89 Mpixels, a 9459 x 9459 image): larger ones are refused unless raised by the
# max_pixels argument or, for every command at once, the environment variable RESMLP_MAX_IMAGE_PIXELS
DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
MAX_PIXELS_VARIABLE = "RESMLP_MAX_IMAGE_PIXELS"
HIGH_DEPTH_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")
# the largest encoded image file read into memory: a 100-Mpixel JPEG is about 50 MB
MAX_IMAGE_FILE_BYTES = 1 << 30


def open_image(path: str | Path, in_chans: int = 3, max_pixels: int | None = None) -> Image.Image:
    """The image at `path`, decoded, as mode 'L' (in_chans 1) or 'RGB'; DataError naming the file if it
    can't be read, is not a regular file, or fails `check_image_size` (default bound: $RESMLP_MAX_IMAGE_PIXELS,
    else PIL's)."""
    try:
        file = _open_regular(path)
    except (DataError, MemoryError):
        raise
    except OSError as e:
        raise DataError(f"cannot read image {path}: {type(e).__name__}: {e}") from None
    with file:
        return decode_image(file, in_chans, max_pixels, what=str(path))


def read_image_bytes(path: str | Path, max_bytes: int = MAX_IMAGE_FILE_BYTES) -> bytes:
    """The encoded bytes of the image file at `path` exactly as stored (regular files only, at most `max_bytes`):
    the raw record a data source hands out; DataError naming the file otherwise."""
    try:
        with _open_regular(path) as file:
            data = file.read(max_bytes + 1)
    except DataError:
        raise
    except OSError as e:
        raise DataError(f"cannot read image {path}: {type(e).__name__}: {e}") from None
    if len(data) > max_bytes:
        raise DataError(f"image {path} is larger than {max_bytes} bytes; no dataset image is")
    return data


def decode_image(data: bytes | BinaryIO, in_chans: int = 3, max_pixels: int | None = None,
                 what: str = "an image record") -> Image.Image:
    """Encoded image bytes (or an open binary file) decoded as `open_image` decodes a file: size bounded from the
    header before any pixel is decoded, EXIF orientation applied, high bit depths scaled; DataError naming `what`
    if it can't be read."""
    limit = max_image_pixels() if max_pixels is None else int(max_pixels)
    if limit > (Image.MAX_IMAGE_PIXELS or 0):
        # PIL refuses more than twice its global bound inside Image.open; raising ours must raise it too
        Image.MAX_IMAGE_PIXELS = limit
    file = io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data
    try:
        with warnings.catch_warnings():
            # the size check below is the bound; PIL's warning between 1x and 2x its own would be noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(file) as img:
                check_image_size(img.width, img.height, f"image {what}", limit)
                img.load()
                upright = ImageOps.exif_transpose(img)
                return _to_mode(upright, "L" if in_chans == 1 else "RGB", what)
    except (DataError, MemoryError):
        raise
    except Exception as e:  # PIL's decoders raise many types for damaged files (RuntimeError for AVIF, struct...)
        raise DataError(f"cannot read image {what}: {type(e).__name__}: {e}") from None


# the widest (or tallest) image read: a 1 x 20,000,000 strip passes any pixel bound, then its resize to the model's
# size allocates gigabytes; panoramas are up to about 10:1
MAX_ASPECT_RATIO = 100


def check_image_size(width: int, height: int, what: str, max_pixels: int | None = None) -> None:
    """DataError unless the image has at least one pixel, at most `max_pixels` (default: max_image_pixels())
    and a side ratio up to MAX_ASPECT_RATIO."""
    limit = max_image_pixels() if max_pixels is None else max_pixels
    if width < 1 or height < 1:
        raise DataError(f"{what} is {width}x{height} pixels: it has no pixels")
    if width * height > limit:
        raise DataError(f"{what} is {width}x{height} pixels, more than the limit of {limit} (a decompression "
                        f"bomb?); if it is real, raise the limit: {MAX_PIXELS_VARIABLE}={width * height} in the "
                        "environment")
    if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
        raise DataError(f"{what} is {width}x{height} pixels, a side ratio above {MAX_ASPECT_RATIO}:1; resized to a "
                        "model's input it would take gigabytes: crop it first")


def _open_regular(path: str | Path):
    """The file at `path` opened for reading only if it is a regular file: a FIFO would block the open (and a
    device read forever); O_NONBLOCK makes opening a FIFO return at once, and fstat then refuses it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DataError(f"cannot read image {path}: not a regular file (a FIFO, socket or device?)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def max_image_pixels() -> int:
    """The default pixel bound: $RESMLP_MAX_IMAGE_PIXELS when set, else PIL's."""
    value = os.environ.get(MAX_PIXELS_VARIABLE)
    if not value:
        return DEFAULT_MAX_PIXELS
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(f"{MAX_PIXELS_VARIABLE}={value!r} is not a whole number of pixels (at least 1); set it "
                          f"to e.g. {DEFAULT_MAX_PIXELS}, or unset it for that default")
    return limit


def _to_mode(img: Image.Image, mode: str, path: str | Path) -> Image.Image:
    if img.mode in HIGH_DEPTH_MODES:
        values = np.asarray(img, dtype=np.float64)
        low, high = _value_range(values, img.mode, path)
        scaled = (values - low) / max(high - low, np.finfo(np.float64).tiny)
        img = Image.fromarray(np.round(np.clip(scaled, 0.0, 1.0) * 255).astype(np.uint8), mode="L")
    elif img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    return img.convert(mode)


def _value_range(values: np.ndarray, mode: str, path: str | Path) -> tuple[float, float]:
    """The (black, white) values of a high-depth image's pixels: its format's full scale where the data fits it,
    else the data's own range, with a warning where that is a guess."""
    if not np.isfinite(values).all():
        raise DataError(f"image {path} holds NaN or infinite pixel values; it can't be shown or classified")
    low, high = (float(values.min()), float(values.max())) if values.size else (0.0, 0.0)
    if mode.startswith("I;16") or (mode == "I" and low >= 0 and high <= 65535):
        return 0.0, 65535.0
    if mode == "F" and low >= 0 and high <= 1:
        return 0.0, 1.0
    if mode == "F" and low >= 0 and high <= 255:
        # no path in the message: a folder of such images warns once, not once per image
        warnings.warn("a float image with values up to 255 (not [0, 1]) is read as 0-255", stacklevel=4)
        return 0.0, 255.0
    warnings.warn(f"image {path} ({mode}) holds values from {low:g} to {high:g}, outside its format's usual "
                  "range: scaled from 0 (or its minimum, when negative) to its maximum", stacklevel=4)
    return min(low, 0.0), high

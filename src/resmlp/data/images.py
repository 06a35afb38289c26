"""Opening one image file safely: bounded size, every bit depth scaled to 8-bit meaning, one error type.

All image reading (predict's files, image-folder datasets) goes through `open_image`, so that
- a decompression bomb (a small file declaring a huge size) is refused from its header, before any pixel
  is decoded, as a DataError that folder readers count as a skipped image like any corrupt file;
- 16-bit ('I;16*'), 32-bit integer ('I') and float ('F') images are scaled to [0, 255] by their range,
  not clipped at 255 as PIL's convert('L') does, so a 16-bit scan means what its 8-bit version means;
- palette images with transparency and bilevel images convert without PIL's warnings.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from resmlp.errors import ConfigError, DataError

# PIL's own bound (about 89 Mpixels, a 9459 x 9459 image): larger ones are refused unless raised by the
# max_pixels argument or, for every command at once, the environment variable RESMLP_MAX_IMAGE_PIXELS
DEFAULT_MAX_PIXELS = Image.MAX_IMAGE_PIXELS or 89_478_485
MAX_PIXELS_VARIABLE = "RESMLP_MAX_IMAGE_PIXELS"
# full-scale value of each high-depth mode: 16-bit PNG/TIFF come as 'I;16*' (or 'I' from older Pillow
# and some TIFFs, whose data is 16-bit too), float TIFF as 'F' in [0, 1]
_FULL_SCALE = {"I;16": 65535, "I;16L": 65535, "I;16B": 65535, "I;16N": 65535, "I": 65535, "F": 1.0}
READ_ERRORS = (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def open_image(path: str | Path, in_chans: int = 3, max_pixels: int | None = None) -> Image.Image:
    """The image at `path`, decoded, as mode 'L' (in_chans 1) or 'RGB'; DataError naming the file if it
    can't be read or has more than `max_pixels` pixels (default: $RESMLP_MAX_IMAGE_PIXELS, else PIL's)."""
    limit = max_image_pixels() if max_pixels is None else int(max_pixels)
    if limit > (Image.MAX_IMAGE_PIXELS or 0):
        # PIL refuses more than twice its global bound inside Image.open; raising ours must raise it too
        Image.MAX_IMAGE_PIXELS = limit
    try:
        with warnings.catch_warnings():
            # the size check below is the bound; PIL's warning between 1x and 2x its own would be noise
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                if img.width * img.height > limit:
                    raise DataError(f"image {path} is {img.width}x{img.height} pixels, more than the limit of "
                                    f"{limit} (a decompression bomb?); raise max_image_pixels if it is real")
                img.load()
                return _to_mode(img, "L" if in_chans == 1 else "RGB")
    except DataError:
        raise
    except READ_ERRORS as e:
        raise DataError(f"cannot read image {path}: {e}") from None


def max_image_pixels() -> int:
    """The default pixel bound: $RESMLP_MAX_IMAGE_PIXELS when set, else PIL's."""
    value = os.environ.get(MAX_PIXELS_VARIABLE)
    if not value:
        return DEFAULT_MAX_PIXELS
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{MAX_PIXELS_VARIABLE}={value!r} is not a whole number of pixels") from None


def _to_mode(img: Image.Image, mode: str) -> Image.Image:
    if img.mode in _FULL_SCALE:
        values = np.asarray(img, dtype=np.float64) / _FULL_SCALE[img.mode]
        img = Image.fromarray(np.round(np.clip(values, 0.0, 1.0) * 255).astype(np.uint8), mode="L")
    elif img.mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    return img.convert(mode)

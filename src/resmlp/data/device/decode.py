"""Workers read, the device decodes: encoded records to decoded uint8 images where the model runs.

A DataLoader worker (`EncodedDataset`) reads a record and looks only at its header (PIL's lazy open): the size
bound against decompression bombs (resmlp.data.images.check_image_size), and whether torchvision's JPEG decoder
gives exactly what resmlp.data.images.decode_image would: a baseline or progressive JPEG in RGB or grey without
an EXIF rotation. Those go on as their encoded bytes. Anything else (PNG, WebP, CMYK JPEGs, 16-bit images, an
EXIF-rotated photo, in-memory arrays) is decoded by `decode_image` in the worker, the timm path's own decoding,
and goes on as pixels: the fallback, counted. An unreadable record is None, skipped and counted as on the timm
path.

The training process (`decode_batch`) decodes a batch's JPEGs with one torchvision.io.decode_jpeg call on the
model's device (nvJPEG on CUDA, libjpeg-turbo on the CPU: the same call); the batch's bytes travel as one
page-locked buffer. A JPEG whose header was fine but whose data is not falls back to PIL there, or is skipped;
a batch in which no image decodes is a DataError (one line), not an empty batch.

What a batch decodes on the device is bounded: each image's share of DEVICE_BATCH_PIXELS (the dataset's
`share`, set by DevicePipeline.loader from the batch size). A JPEG over it is decoded by the worker at a
reduced DCT scale (`reduced_jpeg`), a fallback image reduced to it (`within_share`): the per-image bound
(check_image_size) alone let 256 huge headers ask the device for ~60 GB.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from resmlp.data.images import check_image_size, decode_image, max_image_pixels
from resmlp.data.loading.samplers import sample_seed
from resmlp.data.records import Unreadable, readable, skip_unreadable
from resmlp.errors import DataError
from resmlp.runtime import copy_to

DEVICE_BATCH_PIXELS = 2 ** 28  # decoded pixels a batch may bring to the device: 0.8 GB of RGB uint8
DCT_SCALES = (2, 4, 8)  # the reduced scales libjpeg decodes at (PIL's draft)
JPEG_MODES = ("RGB", "L")  # what decode_jpeg(mode=RGB) turns into the RGB that PIL's convert('RGB') gives
EXIF_ORIENTATION = 0x0112


def device_decodable(payload: bytes, what: str, max_pixels: int | None = None) -> tuple[bool, tuple[int, int]]:
    """(whether torchvision's JPEG decoder reproduces decode_image for it, (height, width)) from the header
    alone; DataError when the header is unreadable or the size is over the bound."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(payload)) as img:
                check_image_size(img.width, img.height, f"image {what}", max_pixels or max_image_pixels())
                # a JPEG cut short (no end-of-image marker) is decoded here, where its failure names its file
                plain = (img.format == "JPEG" and img.mode in JPEG_MODES
                         and img.getexif().get(EXIF_ORIENTATION, 1) in (0, 1) and _ends_whole(payload))
                return plain, (img.height, img.width)
    except DataError:
        raise
    except Exception as e:  # PIL raises many types for damaged headers
        raise DataError(f"cannot read image {what}: {type(e).__name__}: {e}") from None


JPEG_END = b"\xff\xd9"  # the end-of-image marker (ITU T.81, B.2.1)


def _ends_whole(payload: bytes) -> bool:
    """Whether the JPEG ends with its end-of-image marker (trailing zero padding allowed): a file cut short
    doesn't, and the device decoder would take it with its file name lost (decode_batch sees bytes only)."""
    return bytes(payload[-4096:]).rstrip(b"\0").endswith(JPEG_END)


def pixels(payload: Any, in_chans: int, max_pixels: int | None, what: str,
           share: int | None = None) -> np.ndarray:
    """The fallback: a payload decoded as the timm path decodes it, (H, W) or (H, W, 3) uint8; over `share`
    pixels, reduced to within it (`within_share`)."""
    if isinstance(payload, np.ndarray):
        return payload
    mode_chans = 1 if in_chans == 1 else 3
    return np.asarray(within_share(decode_image(payload, mode_chans, max_pixels, what=what), share))


def within_share(img: Image.Image, share: int | None) -> Image.Image:
    """`img` reduced by the smallest whole factor (PIL's box-filter reduce) that brings it to `share` pixels."""
    if share is None or img.width * img.height <= share:
        return img
    return img.reduce(math.ceil(math.sqrt(img.width * img.height / share)))


def reduced_jpeg(payload: bytes, in_chans: int, share: int, what: str) -> np.ndarray:
    """A plain JPEG (device_decodable) over the device's per-image share decoded by PIL at the DCT scale (1/2,
    1/4 or 1/8: libjpeg decodes fewer coefficients, not all pixels then a resize) that brings it within
    `share`, and reduced further if 1/8 is not enough: (H, W) or (H, W, 3) uint8."""
    mode = "L" if in_chans == 1 else "RGB"
    try:
        with Image.open(io.BytesIO(payload)) as img:
            w, h = img.size
            scale = next((s for s in DCT_SCALES if math.ceil(w / s) * math.ceil(h / s) <= share), DCT_SCALES[-1])
            # PIL's draft picks the largest scale s with size // requested >= s: ask for size // scale
            img.draft(mode, (max(1, w // scale), max(1, h // scale)))
            return np.asarray(within_share(img.convert(mode), share))
    except Exception as e:  # PIL raises many types for damaged data
        raise DataError(f"cannot read image {what}: {type(e).__name__}: {e}") from None


def encoded_item(payload: Any, label: int, key: tuple, what: str, in_chans: int, max_pixels: int | None,
                 share: int | None = None):
    """One record as a worker hands it over: (payload, on_device, label, seed), payload the JPEG's bytes
    (on_device True) or the decoded fallback pixels; None when unreadable (warned). A JPEG over `share`
    pixels (the device's per-image share of DEVICE_BATCH_PIXELS) is decoded here at a reduced scale."""
    try:
        if isinstance(payload, (bytes, bytearray)):
            plain, (h, w) = device_decodable(payload, what, max_pixels)
            if plain and (share is None or h * w <= share):
                return bytes(payload), True, int(label), sample_seed(key)
            if plain:
                return reduced_jpeg(bytes(payload), in_chans, share, what), False, int(label), sample_seed(key)
        return pixels(payload, in_chans, max_pixels, what, share), False, int(label), sample_seed(key)
    except DataError as e:
        return skip_unreadable(what, e)


class EncodedDataset(torch.utils.data.Dataset):
    """Map records (resmlp.data.sources) read by sampler key: `encoded_item`s."""

    def __init__(self, records: Any, in_chans: int, max_pixels: int | None = None) -> None:
        self.records, self.in_chans, self.max_pixels = records, in_chans, max_pixels
        self.share: int | None = None  # the device's per-image share of pixels (DevicePipeline.loader sets it)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: tuple[int, int, int, int]):
        index = key[3]
        what = self.records.name(index)
        try:
            payload, label = self.records[index]
        except DataError as e:
            return skip_unreadable(what, e)
        return encoded_item(payload, label, key, what, self.in_chans, self.max_pixels, self.share)


class EncodedStream(torch.utils.data.IterableDataset):
    """A stream's records (WebDataset shards, streamed Hugging Face datasets) as `encoded_item`s, in the order
    and with the keys of `stream` (a resmlp.data.per_image.decoded.DecodedStream: the trainer's StreamPosition sets its
    plan each epoch, read here when the workers start)."""

    def __init__(self, stream: Any, in_chans: int, max_pixels: int | None = None) -> None:
        self.stream, self.in_chans, self.max_pixels = stream, in_chans, max_pixels
        self.share: int | None = None  # as EncodedDataset's

    def __iter__(self):
        for key, payload, label in self.stream.records.samples(self.stream.plan):
            if isinstance(payload, Unreadable):
                yield skip_unreadable(key[3], payload)
                continue
            yield encoded_item(payload, label, key, str(key[3]), self.in_chans, self.max_pixels, self.share)


@dataclass
class EncodedBatch:
    """A batch as the workers hand it over: the JPEGs' bytes in one buffer, the fallback pixels, labels, seeds."""

    buffer: torch.Tensor  # uint8, every JPEG's bytes back to back
    lengths: list[int]  # per image: its byte count (JPEG) or -1 (pixels in `decoded`)
    decoded: list[torch.Tensor]  # the fallback images, in order
    labels: torch.Tensor
    seeds: list[int]
    skipped: int

    def pin_memory(self) -> EncodedBatch:
        """The DataLoader's pin_memory hook: one page-locked buffer for all the bytes."""
        return EncodedBatch(self.buffer.pin_memory(), self.lengths, [t.pin_memory() for t in self.decoded],
                            self.labels.pin_memory(), self.seeds, self.skipped)


def collate_encoded(batch: list) -> EncodedBatch:
    """EncodedDataset items -> EncodedBatch; unreadable ones (None) dropped and counted."""
    good = readable(batch)
    jpegs = [payload for payload, on_device, _, _ in good if on_device]
    buffer = torch.from_numpy(np.frombuffer(b"".join(jpegs), dtype=np.uint8).copy())
    lengths = [len(payload) if on_device else -1 for payload, on_device, _, _ in good]
    decoded = [torch.from_numpy(np.array(payload, copy=True)) for payload, on_device, _, _ in good
               if not on_device]
    return EncodedBatch(buffer, lengths, decoded, torch.tensor([label for _, _, label, _ in good]),
                        [seed for _, _, _, seed in good], len(batch) - len(good))


def decode_batch(batch: EncodedBatch, device: torch.device, in_chans: int = 3,
                 ) -> tuple[list[torch.Tensor], list[int], int]:
    """(decoded uint8 images (C, H, W) on `device` in batch order, the positions kept, PIL fallbacks made here).
    A JPEG that decode_jpeg refuses is decoded by PIL, or dropped (warned) when PIL can't read it either."""
    at, chunks = 0, []
    for length in batch.lengths:
        if length >= 0:
            chunks.append(batch.buffer[at:at + length])
            at += length
    jpegs = _decode_jpegs(chunks, device)
    images, kept, fallbacks, jpeg_at, pixel_at = [], [], 0, 0, 0
    for position, length in enumerate(batch.lengths):
        if length >= 0:
            image = jpegs[jpeg_at]
            if image is None:
                image = _pil_fallback(chunks[jpeg_at], in_chans, device)
                fallbacks += image is not None
            jpeg_at += 1
        else:
            image = _chw(copy_to(batch.decoded[pixel_at], device))
            pixel_at += 1
        if image is not None:
            images.append(image)
            kept.append(position)
    if not images:
        raise DataError(f"no image of a batch of {len(batch.lengths)} could be decoded (decode_jpeg and PIL both "
                        "refused every one; see the warnings above); check the dataset files")
    return images, kept, fallbacks


def _decode_jpegs(chunks: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor | None]:
    """decode_jpeg on the whole list; if it refuses (one corrupt file fails the call), image by image."""
    if not chunks:
        return []
    with warnings.catch_warnings():
        # torchvision 0.29 marks its image codecs deprecated in favour of TorchCodec, which has no batched
        # device JPEG decoder for uint8 byte tensors yet; the call is what the issue asks for, the note is noise
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return list(decode_jpeg(list(chunks), mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            out = []
            for chunk in chunks:
                try:
                    out.append(decode_jpeg(chunk, mode=ImageReadMode.RGB, device=device))
                except RuntimeError:
                    out.append(None)
            return out


def _pil_fallback(chunk: torch.Tensor, in_chans: int, device: torch.device) -> torch.Tensor | None:
    try:
        array = pixels(chunk.numpy().tobytes(), in_chans, None, "record")
    except DataError as e:
        return skip_unreadable("(a JPEG whose data decode_jpeg and PIL both refuse)", e)
    return _chw(copy_to(torch.from_numpy(np.array(array, copy=True)), device))


def _chw(image: torch.Tensor) -> torch.Tensor:
    return image.unsqueeze(0) if image.dim() == 2 else image.permute(2, 0, 1)

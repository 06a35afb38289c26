"""A tar's listing (resmlp.data.sources.imagenet_tar) and its form in the index cache
(resmlp.data.sources.index_cache): names packed as the folder source's are, offsets and sizes as int64 arrays.

Listing ILSVRC2012_img_train.tar reads 1.28 M headers spread over the whole archive; the cached listing is a few
arrays. A cached listing is input like the tar itself: every name is checked (relative, no `..`), every member
must lie inside the tar, or the cache is ignored and the tar listed again. A cache is keyed by the tar's size and
modification time, which a rewrite can keep (cp -p, rsync, touch -d): each read also reads the member's header
block and compares its name and size (imagenet_tar.TarRecords), so no record is read at another member's offset.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field

import numpy as np

from resmlp.data.sources.imagenet import PackedNames
from resmlp.data.sources.index_cache import safe_names

BLOCK = tarfile.BLOCKSIZE  # every member's data follows its header block


@dataclass
class TarListing:
    """The members of a tar, its top-level folder stripped: {name: (offset, size)} of regular files, and the
    folders (directory members, and every file's parent folders)."""

    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    folders: set[str] = field(default_factory=set)
    prefix: str = ""


def listing_arrays(listing: TarListing) -> dict[str, np.ndarray]:
    """The listing as the arrays the index cache stores."""
    names = PackedNames.pack(list(listing.files))
    folders = PackedNames.pack(sorted(listing.folders))
    prefix = PackedNames.pack([listing.prefix])
    where = np.asarray(list(listing.files.values()), dtype=np.int64).reshape(-1, 2)
    return {"buffer": names.buffer, "offsets": names.offsets, "data_offsets": where[:, 0], "sizes": where[:, 1],
            "folder_buffer": folders.buffer, "folder_offsets": folders.offsets, "prefix_buffer": prefix.buffer,
            "prefix_offsets": prefix.offsets}


def restore_listing(saved: dict[str, np.ndarray] | None, tar_size: int) -> TarListing | None:
    """The listing `listing_arrays` made, if it is whole and safe for a tar of `tar_size` bytes; else None."""
    try:
        names = (saved["buffer"], saved["offsets"])
        folders = (saved["folder_buffer"], saved["folder_offsets"])
        prefix = (saved["prefix_buffer"], saved["prefix_offsets"])
        data_offsets, sizes = saved["data_offsets"], saved["sizes"]
    except (KeyError, TypeError):  # TypeError: no cache (None)
        return None
    if not all(safe_names(*packed) for packed in (names, folders, prefix)) or len(prefix[1]) != 2:
        return None
    if data_offsets.dtype != np.int64 or sizes.dtype != np.int64 or not len(data_offsets) == len(sizes) == len(
            names[1]) - 1:
        return None
    if len(sizes) and (data_offsets.min() < BLOCK or sizes.min() < 0 or (data_offsets + sizes).max() > tar_size):
        return None
    files = dict(zip(_unpack(*names), zip(data_offsets.tolist(), sizes.tolist(), strict=True), strict=True))
    return TarListing(files, set(_unpack(*folders)), _unpack(*prefix)[0])


def _unpack(buffer: np.ndarray, offsets: np.ndarray) -> list[str]:
    """Every name of packed names at once (one bytes object sliced: PackedNames[i] per name is slower)."""
    data, bounds = buffer.tobytes(), offsets.tolist()
    return [data[a:b].decode("utf-8", "surrogateescape") for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

"""The listing cache of folder and tar sources: `OUTPUT/data_index/`, numpy arrays per split or tar.

A folder of 1.28 M images takes seconds to list, a tar of them a minute (one pass over every header), at
every start of a run. The listing is kept in the run's folder and used again while what it lists is unchanged
(its folders' modification times, a tar's size and modification time: resmlp.data.sources.imagenet and
resmlp.data.sources.imagenet_tar decide). The cache is data a process reads back, so it is treated as input:
- `data_index/` is made with resmlp.fileio.guarded_subfolder: a symlink planted there (pointing the cache,
  and its writes, somewhere else) is refused in one line;
- files are written atomically (resmlp.fileio.atomic_write), never through a planted link;
- every cached name is checked before use (no absolute name, no `..` component, no NUL, offsets that fit the
  buffer): a damaged or planted cache can't make a reader open a file outside the dataset. A cache that fails a
  check, or can't be read, is ignored and the source listed again.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import zipfile
from pathlib import Path

import numpy as np

from resmlp.errors import OutputError
from resmlp.fileio import atomic_write, guarded_subfolder

CACHE_FOLDER = "data_index"
_PARENT_COMPONENT = re.compile(rb"(?=\.\.)")  # overlapping: `x.` then `../y` packed is `x.../y`


def index_path(cache: str | Path, stem: str, key: str) -> Path | None:
    """The cache file of `stem` (a split, a tar's name) under the identity `key`, in `cache`/data_index/ (made
    here; OutputError if it is a symlink or a file); None where the folder can't be made (read-only: no cache)."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:16]
    try:
        folder = guarded_subfolder(Path(cache) / CACHE_FOLDER)
    except OutputError:
        raise
    except OSError:
        return None
    return folder / f"{stem}-{digest}.npz"


def load_index(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays saved at `path`, or None when there are none or they can't be read (pickles refused)."""
    if path.is_symlink():
        return None
    try:
        with np.load(path, allow_pickle=False) as saved:
            return {name: saved[name] for name in saved.files}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None


def save_index(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """`arrays` saved at `path` atomically; a folder that can't be written leaves no cache, the listing stands."""
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as file:  # a file object: np.savez would append .npz to a path
            np.savez(file, **arrays)

    with contextlib.suppress(OSError):
        atomic_write(path, write)


def safe_names(buffer: np.ndarray, offsets: np.ndarray) -> bool:
    """Whether packed names (resmlp.data.sources.imagenet.PackedNames' arrays) are well formed and each a
    relative path inside its folder: offsets from 0 to the buffer's end, never decreasing; no NUL; no name
    starting with '/'; no `..` component. Vectorised over the buffer: 1.28 M names check in milliseconds."""
    if buffer.dtype != np.uint8 or offsets.dtype != np.int64 or buffer.ndim != 1 or offsets.ndim != 1:
        return False
    if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(buffer) or np.any(np.diff(offsets) < 0):
        return False
    starts = offsets[:-1][np.diff(offsets) > 0]
    if np.any(buffer == 0) or np.any(buffer[starts] == ord("/")):
        return False
    data, boundaries = buffer.tobytes(), set(offsets.tolist())
    for found in _PARENT_COMPONENT.finditer(data):  # rare in real names: checked one by one
        start = found.start()
        end = start + 2
        opens = start in boundaries or data[start - 1:start] == b"/"
        closes = end in boundaries or data[end:end + 1] == b"/"
        if opens and closes:
            return False
    return True

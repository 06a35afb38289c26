"""The project's own error types, and the one-line message a user sees for each mistake.

Every error that a user's input or environment can cause (a bad file, flag, folder, a full disk) is either
one of these types or an OSError / yaml / PIL error that `user_message` turns into one line; anything
else is a bug and keeps its traceback.

Compatibility: CheckpointError, ConfigError and DataError are also ValueErrors, as the project's errors
were before this module existed, so `except ValueError` (and `pytest.raises(ValueError)`) keeps catching
them. OutputError is an OSError instead: it is about the place being written (a locked, missing or
read-only output folder), and code that already guards its writes with `except OSError` catches it.
"""

from __future__ import annotations

import errno
import re
import traceback
from pathlib import Path


class ResmlpError(Exception):
    """Base of the errors a user can cause and fix; the message says what is wrong and what to do."""


class CheckpointError(ResmlpError, ValueError):
    """A checkpoint file that can't be read or doesn't fit the model."""


class ConfigError(ResmlpError, ValueError):
    """A recipe, --set override, flag value or metadata field that is malformed or out of range."""


class DataError(ResmlpError, ValueError):
    """A data file or folder that can't be read safely (a corrupt or oversized image, a refused pickle)."""


class OutputError(ResmlpError, OSError):
    """An output folder or file that can't be written (locked by another run, not a folder, read-only)."""


class InstallError(ResmlpError, ImportError):
    """A package this project uses that is installed but fails to import (a damaged or half-upgraded install)."""


# what to do about an OSError, by errno: the part of the message the operating system doesn't say
_OS_ADVICE = {
    errno.ENOSPC: "the disk is full; free space or write elsewhere",
    errno.EDQUOT: "the disk quota is exhausted; free space or write elsewhere",
    errno.EFBIG: "the file would exceed the largest file this process may write (ulimit -f, or the file system's "
                 "limit); raise the limit or write elsewhere",
    errno.EACCES: "permission denied; choose a path you can write/read",
    errno.EPERM: "operation not permitted; choose another path",
    errno.EROFS: "read-only file system; write elsewhere",
    errno.ENOTDIR: "a component of the path is a file, not a folder",
    errno.EISDIR: "the path is a folder, a file was expected",
    errno.ENOENT: "no such file or folder",
    errno.EEXIST: "it already exists (a file where a folder is needed?)",
    errno.ENAMETOOLONG: "the file name is too long",
    errno.EMFILE: "too many open files; lower the number of data workers",
}
_PACKAGE_DIR = Path(__file__).resolve().parent


def user_message(exc: BaseException) -> str | None:
    """The message to print for an error a user caused (bad input, full disk...), or None for a bug.

    Project errors and ValueErrors keep their text; an OSError gets its errno explained and its file
    named; YAML syntax errors and PIL's refusals (decompression bombs, unidentified images) become one line.
    A RuntimeError counts as a user error only when a `raise` of this package raised it (e.g. "no CUDA GPU
    is visible") or memory ran out; from inside torch it is a bug.
    """
    import yaml

    if isinstance(exc, (ResmlpError, ValueError)):
        return _worker_message(str(exc)) or type(exc).__name__
    if isinstance(exc, yaml.YAMLError):
        return f"invalid YAML: {_one_line(str(exc))}"
    if _is_pil_refusal(exc):
        return _one_line(str(exc))
    if isinstance(exc, OSError):
        return _os_message(exc)
    if _is_out_of_memory(exc):
        return _memory_message(exc)
    if isinstance(exc, RuntimeError) and _raised_here(exc):
        return str(exc) or type(exc).__name__
    return None


# how torch's allocators word a failed allocation (CPU: c10's DefaultCPUAllocator; CUDA: the caching allocator)
_ALLOCATION_FAILURES = ("can't allocate memory", "CUDA out of memory", "out of memory", "Cannot allocate memory")


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":  # torch.OutOfMemoryError: CUDA
        return True
    return isinstance(exc, RuntimeError) and any(words in str(exc) for words in _ALLOCATION_FAILURES)


def _memory_message(exc: BaseException) -> str:
    """What ran out (GPU or main memory), how much was asked for when torch says, and what to change."""
    text = _one_line(str(exc))
    gpu = "CUDA" in text or "GPU" in text or type(exc).__name__ == "OutOfMemoryError"
    asked = re.search(r"(?:tried to allocate|allocate) ([\d.]+ ?[KMGT]?i?B|\d+ bytes)", text)
    size = asked.group(1) if asked else ""
    if size.endswith(" bytes"):
        size = f"{int(size.split()[0]) / 2**30:.1f} GiB"
    amount = f" (an allocation of {size} failed)" if size else ""
    where = "GPU memory" if gpu else "main memory"
    return (f"out of {where}{amount}; lower the batch size (--batch-size; in training, or raise "
            "train.grad_accum), the image size or the model size"
            + ("" if gpu else ", or the data workers (data.num_workers)"))


def _os_message(exc: OSError) -> str:
    advice = _OS_ADVICE.get(exc.errno or -1)
    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    if advice is None:
        return _one_line(str(exc))
    return f"{where}: {advice} ({exc.strerror})" if where else f"{advice} ({exc.strerror})"


def _is_pil_refusal(exc: BaseException) -> bool:
    from PIL import Image, UnidentifiedImageError

    return isinstance(exc, (Image.DecompressionBombError, UnidentifiedImageError))


def _raised_here(exc: BaseException) -> bool:
    """Whether a `raise` statement of this package raised it (not torch, whose C++ errors show up as if
    raised by the line of our code that called it)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    return Path(last.filename).resolve().is_relative_to(_PACKAGE_DIR) and (last.line or "").startswith("raise")


def _worker_message(text: str) -> str:
    """The error's own message when a DataLoader worker raised it: torch re-raises it in the main process with the
    worker's traceback as its text ("Caught DataError in DataLoader worker process 0. Original Traceback ...")."""
    if not text.startswith("Caught ") or "Original Traceback" not in text:
        return text
    last = text.rstrip().splitlines()[-1]
    return re.sub(r"^[\w.]+: ", "", last)


def _one_line(text: str) -> str:
    return " ".join(text.split())

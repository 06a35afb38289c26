"""The node-local shard cache (data.cache_dir): each remote shard fetched once per node, read locally after.

- An entry is named by a digest of the shard's URL and of its size and ETag as listed: a shard changed in
  the store has another name, so a stale copy is never used (and ages out).
- Fetched through resmlp.data.sources.remote (ranges, retries, If-Match), written to a temporary file and
  renamed into place (resmlp.fileio.atomic_write); before the rename every range must have come whole (over
  HTTP under If-Match) and the object must still have the listed size and ETag (an ETag is not always the
  MD5 of the bytes: multipart uploads, SSE-KMS). Before each use the entry's size is checked against the
  listing. A reader never sees a partial or unverified file.
- The node's processes share it: one lock file per entry (fcntl.flock), so a shard that eight workers ask
  for at once is fetched once, the others waiting and then reading the copy.
- Bounded: after each fetch, the least recently used entries (by modification time, which every use
  refreshes) are removed until the cache holds at most data.cache_bytes, never the entry just fetched. A
  reader that still has a removed file open keeps reading it (POSIX).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from resmlp.data.records import Payload, Unreadable
from resmlp.data.sources.remote import (
    CHUNK,
    ObjectStat,
    RemoteError,
    RemoteOptions,
    check_unchanged,
    open_object,
    read_range,
)
from resmlp.errors import DataError
from resmlp.fileio import atomic_write

ENTRY_SUFFIX = ".shard"


def entry_name(obj: ObjectStat) -> str:
    """The cache file of an object as listed (see the module doc)."""
    where = hashlib.sha256(obj.url.encode()).hexdigest()[:24]
    what = hashlib.sha256(f"{obj.size}\0{obj.etag}".encode()).hexdigest()[:12]
    return f"{where}-{what}{ENTRY_SUFFIX}"


@contextlib.contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def cached(obj: ObjectStat, options: RemoteOptions) -> Path:
    """The local copy of `obj` in options.cache_dir, fetched (and verified) if not there yet."""
    folder = Path(options.cache_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / entry_name(obj)
    if _usable(path, obj):
        return path
    with _locked(folder / f".{path.name}.lock"):
        if not _usable(path, obj):  # another process may have fetched it while this one waited
            atomic_write(path, lambda tmp: _fetch(obj, tmp, options))
    evict(folder, options.cache_bytes, keep=path)
    return path


def _usable(path: Path, obj: ObjectStat) -> bool:
    """An entry of the listed size, its use recorded (LRU)."""
    try:
        if path.is_symlink() or path.stat().st_size != obj.size:
            return False
        os.utime(path)
        return True
    except OSError:
        return False


def _fetch(obj: ObjectStat, tmp: Path, options: RemoteOptions) -> None:
    with open(tmp, "wb") as out:
        for start in range(0, obj.size, CHUNK):
            out.write(read_range(obj, start, min(obj.size, start + CHUNK), options))
    check_unchanged(obj, options)


def evict(folder: Path, limit: int, keep: Path | None = None) -> list[Path]:
    """Remove the least recently used entries until `folder` holds at most `limit` bytes of them; the removed."""
    with _locked(folder / ".evict.lock", blocking=False) as held:
        if not held:  # another process is evicting
            return []
        entries = []
        for entry in os.scandir(folder):
            if entry.name.endswith(ENTRY_SUFFIX) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    stat = entry.stat(follow_symlinks=False)
                    entries.append((stat.st_mtime_ns, stat.st_size, Path(entry.path)))
        total, removed = sum(size for _, size, _ in entries), []
        for _, size, path in sorted(entries, key=lambda e: e[0]):
            if total <= limit:
                break
            if keep is not None and path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed.append(path)
            total -= size
        return removed


def shard_records(obj: ObjectStat, options: RemoteOptions,
                  read: Callable[[BinaryIO, str], Iterator[tuple[str, Payload, int]]]) -> Iterator[
        tuple[str, Payload, int]]:
    """The records `read(stream, url)` finds in the object: from the cache (fetched first) where
    options.cache_dir is set, else streamed, checked unchanged at its end (and at its start where ranges can't
    carry If-Match: S3, GCS). A shard that fails for good is
    skipped with a warning naming it and one Unreadable record (counted in the run's summary), or, with
    options.on_error == "stop", ends the run in one line."""
    try:
        if options.cache_dir:
            with open(cached(obj, options), "rb") as stream:
                yield from read(stream, obj.url)
            return
        if not obj.url.lower().startswith(("http://", "https://")):  # HTTP: every range under If-Match
            check_unchanged(obj, options)
        with open_object(obj, options) as stream:
            yield from read(stream, obj.url)
        check_unchanged(obj, options)
    except (RemoteError, FileNotFoundError) as error:
        reason = str(error.args[0]) if error.args else str(error)  # webdataset appends its own to args
        if options.on_error == "stop":
            raise DataError(f"shard {obj.url} can't be read: {reason} (data.shard_errors=skip skips such a "
                            "shard, counted)") from None
        warnings.warn(f"skipping shard {obj.url}: {reason}", stacklevel=2)
        yield obj.url, Unreadable(f"its shard was skipped: {reason}"), -1

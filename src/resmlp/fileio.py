"""Writing files safely: atomic writes nobody can redirect, strict JSON, one run per output folder.

- `atomic_write` writes into a fresh temporary file that it alone created (O_CREAT|O_EXCL via
  tempfile.mkstemp, random name, in the target's folder), fsyncs it, renames it over the target and fsyncs
  the folder: a crash or a full disk leaves the previous file intact, and a symlink planted at a
  predictable name has nothing to redirect. os.replace swaps the directory entry, so a symlink *at the
  target name* is replaced, never written through.
- `remove_stale_temporaries` clears temporaries that a killed process left behind (on resume).
- `write_json` writes strict JSON (NaN and infinities become null), so summary files always parse.
- `RunLock` makes an output folder belong to one run at a time; `output_lock` is the one every command that
  writes into a folder takes (nothing when no folder is given). Its lock file is opened without following a
  symlink and refused when it is a hard link or not a regular file, before anything is written into it.
- `guarded_subfolder` makes a folder inside an output folder, never through a symlink planted there: every
  write of a run stays inside its folder; `held_subfolder` also opens it, for writers that take a path.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from resmlp.command_files import check_target
from resmlp.errors import OutputError

_TMP_SUFFIX = ".tmp"
_STALE_NAME = re.compile(r"^\..+\.tmp\d*$")  # .NAME.RANDOM.tmp (mkstemp) and .NAME.tmp<pid> (older)
LOCK_NAME = ".lock"


def _current_umask() -> int:
    # os.umask can only be read by setting it; done once, at import, before any worker threads exist
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call `write(tmp)` on a fresh temporary file, then rename it over `path`; returns `path`.

    `write` may replace the (empty) temporary file or write into it. On any failure (including a full
    disk) the temporary is removed and the previous `path`, if any, is left untouched.

    Refused (OutputError): an input of the running command (resmlp.command_files), a block device, a socket. A
    character device or a FIFO at `path` (/dev/null, a pipe), or a symlink to a FIFO, a terminal or /dev/null
    (/dev/stdout), is written in place, never replaced by a rename.
    """
    path = Path(path)
    check_target(path)
    special = _special_file(path)
    if special is not None:
        return _write_in_place(path, write, through=special == "through")
    _make_folder(path.parent)
    try:
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=_TMP_SUFFIX)
    except OSError as e:  # name the file the user asked for, not our temporary
        raise type(e)(e.errno, e.strerror, str(path)) from None
    tmp = Path(name)
    try:
        # mkstemp makes the file private (0600); a finished file gets the usual permissions
        os.fchmod(fd, 0o666 & ~_UMASK)
        os.close(fd)
        fd = -1
        try:
            write(tmp)
        except Exception as e:
            raise _as_disk_error(e, path, tmp) from e
        _finish(tmp)
        os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)
    return path


def _special_file(path: Path) -> str | None:
    """"here" for a character device or a FIFO at `path` itself, "through" for a symlink to one (/dev/stdout,
    /dev/fd/63 of `>(cmd)`), None for anything else (a symlink to a file is replaced, as any file); OutputError for
    a block device or a socket, which no output of this project may be."""
    import stat

    try:
        mode = os.lstat(path).st_mode
        target = os.stat(path).st_mode if stat.S_ISLNK(mode) else mode
    except (OSError, ValueError):
        return None
    if stat.S_ISCHR(target) or stat.S_ISFIFO(target):
        return "through" if stat.S_ISLNK(mode) else "here"
    if stat.S_ISBLK(target) or stat.S_ISSOCK(target):
        what = "a block device" if stat.S_ISBLK(target) else "a socket"
        raise OutputError(f"{path} is {what}, not a file; choose a file (or /dev/null, a FIFO) as the output")
    return None


_DEV_NULL = os.makedev(1, 3)


def _write_in_place(path: Path, write: Callable[[Path], None], through: bool = False) -> Path:
    """`write` into a private temporary file, then its bytes into the device or FIFO at `path` (opened without
    creating or truncating; a FIFO without a reader is refused rather than waited on). `through`: `path` is a
    symlink, followed only to a FIFO, a terminal or /dev/null (a link planted in an output folder can't point a
    write at another device)."""
    import shutil
    import stat

    try:
        out = os.open(path, os.O_WRONLY | os.O_NONBLOCK | (0 if through else os.O_NOFOLLOW))
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OutputError(f"{path} is a FIFO that nobody reads; start its reader first or choose a file") \
                from None
        raise type(e)(e.errno, e.strerror, str(path)) from None
    try:
        info = os.fstat(out)
        if not (stat.S_ISCHR(info.st_mode) or stat.S_ISFIFO(info.st_mode)):
            raise OutputError(f"{path} was replaced while it was opened; choose another output path")
        if through and stat.S_ISCHR(info.st_mode) and info.st_rdev != _DEV_NULL and not os.isatty(out):
            raise OutputError(f"{path} is a symlink to a device ({os.path.realpath(path)}); name the device itself "
                              "if it is meant, or choose a file")
        os.set_blocking(out, True)
        with tempfile.TemporaryDirectory(prefix="resmlp-out-") as folder:
            tmp = Path(folder) / path.name
            tmp.touch(mode=0o600)
            try:
                write(tmp)
            except Exception as e:
                raise _as_disk_error(e, path, tmp) from e
            with open(tmp, "rb") as src, os.fdopen(os.dup(out), "wb") as dst:
                shutil.copyfileobj(src, dst)
    finally:
        os.close(out)
    return path


def _finish(tmp: Path) -> None:
    """Durable, with the process's usual permissions: some writers (safetensors) replace our temporary with a
    file of their own, mode 0600, so the mode is set on what is there now (never through a symlink)."""
    fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        _refuse_shared_file(fd, tmp)  # a writer that replaced our temporary made a fresh file: one name only
        os.fchmod(fd, 0o666 & ~_UMASK)
        os.fsync(fd)
    finally:
        os.close(fd)


_OS_ERROR_CODE = re.compile(r"\(os error (\d+)\)")  # how Rust libraries (safetensors) quote errno
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
LOW_SPACE_BYTES = 1 << 20
NEAR_SIZE_LIMIT_BYTES = 64 << 20  # torch.save's last write before the failure may be this far below the limit


def _as_disk_error(exc: Exception, path: Path, tmp: Path | None = None) -> Exception:
    """A writer's failure as OSError(ENOSPC/EDQUOT/EFBIG, path) when the disk, the quota or the file size limit
    ran out, else unchanged.

    Writers report these in their own ways: an OSError (Python), "(os error 28)" inside a SafetensorError, or no
    reason at all (torch.save: "unexpected pos"); for the last, a folder with less than LOW_SPACE_BYTES left
    after the failure counts as full, and a temporary within NEAR_SIZE_LIMIT_BYTES of the process's file size
    limit (`ulimit -f`; Python ignores SIGXFSZ, so the write fails instead) as too large.
    """
    if isinstance(exc, OSError):
        return exc if exc.errno not in _DISK_ERRNOS or exc.filename else type(exc)(exc.errno, exc.strerror, str(path))
    found = _OS_ERROR_CODE.search(str(exc))
    code = int(found.group(1)) if found else None
    if code is None:
        code = _reasonless_failure_code(path, tmp)
    if code not in _DISK_ERRNOS:
        return exc
    return OSError(code, os.strerror(code), str(path))


def _reasonless_failure_code(path: Path, tmp: Path | None) -> int | None:
    import resource

    try:
        stats = os.statvfs(path.parent)
        if stats.f_bavail * stats.f_frsize < LOW_SPACE_BYTES:
            return errno.ENOSPC
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if tmp is not None and limit != resource.RLIM_INFINITY \
                and os.stat(tmp).st_size + NEAR_SIZE_LIMIT_BYTES >= limit:
            return errno.EFBIG
    except OSError:
        return None
    return None


def guarded_subfolder(folder: str | Path) -> Path:
    """`folder` (inside an output folder the caller holds), created if missing; refused when it is a symlink
    or not a folder, so that a writer given this path (TensorBoard's) can't be sent elsewhere."""
    folder = Path(folder)
    _make_folder(folder.parent)
    with contextlib.suppress(FileExistsError):
        folder.mkdir()
    if folder.is_symlink() or not folder.is_dir():
        what = f"a symlink to {os.readlink(folder)}" if folder.is_symlink() else "not a folder"
        raise OutputError(f"{folder} is {what}; a run writes only inside its output folder: remove it or choose "
                          "another output folder")
    return folder


def held_subfolder(folder: str | Path) -> tuple[int, Path]:
    """`guarded_subfolder(folder)`, opened: (a descriptor of it, a path naming that very folder). The path is
    /proc/self/fd/N where the system has it, so a writer given it (TensorBoard's, which opens files by path)
    writes into the folder that was checked even if a symlink is swapped in at its name afterwards; O_NOFOLLOW
    refuses one swapped in between the check and the open. Close the descriptor when the writer is done."""
    folder = guarded_subfolder(folder)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:  # ELOOP (a symlink now) or ENOTDIR (a file now): replaced since the check
        raise OutputError(f"{folder} was replaced while the run started ({e.strerror}); a run writes only inside "
                          "its output folder: check who else writes there") from None
    held = Path(f"/proc/self/fd/{fd}")
    return fd, held if held.is_dir() else folder


def output_lock(folder: str | Path | None) -> contextlib.AbstractContextManager:
    """The RunLock of the output folder a command writes into; nothing when it writes no folder."""
    return RunLock(folder) if folder is not None else contextlib.nullcontext()


def _make_folder(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{folder} is a file, not a folder; choose another output location")
    folder.mkdir(parents=True, exist_ok=True)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable; some file systems can't fsync a folder, which is fine to skip."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files that interrupted atomic writes left in `folder` (not its sub-folders).

    Call it only while holding the folder's `RunLock`: a running writer's temporary looks the same.
    Also removes the names of earlier versions of this module (.NAME.tmp<pid>).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale = [p for p in folder.iterdir()
             if _STALE_NAME.match(p.name) and (p.is_symlink() or p.is_file())]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def to_strict_json(value: Any) -> Any:
    """`value` with NaN and infinities replaced by None and numpy scalars/arrays by Python values."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: to_strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_strict_json(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy scalars and arrays, torch tensors
        return to_strict_json(value.tolist())
    return value


MAX_JSON_BYTES = 1 << 20  # a run's config.json or summary.json is a few kB
MAX_JSON_DEPTH = 32


def read_json_object(path: str | Path, what: str = "file") -> dict[str, Any]:
    """The JSON object in `path` (a run folder's config.json...), read strictly: at most MAX_JSON_BYTES, nested at
    most MAX_JSON_DEPTH levels, an object with string keys at the top; ConfigError naming `what` and the file
    for anything else."""
    from resmlp.errors import ConfigError

    path = Path(path)
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ConfigError(f"{what} {path} holds {path.stat().st_size} bytes, more than {MAX_JSON_BYTES}; "
                          "this project writes a few kB there: the file was replaced")
    try:
        value = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigError(f"{what} {path} is not valid JSON ({type(e).__name__}: {str(e)[:100]}); restore it "
                          "or start a new run") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{what} {path} holds a {type(value).__name__}, not a JSON object; restore it or start "
                          "a new run")
    if _depth(value) > MAX_JSON_DEPTH:
        raise ConfigError(f"{what} {path} is nested more than {MAX_JSON_DEPTH} levels deep; restore it or start "
                          "a new run")
    return value


def _depth(value: Any) -> int:
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return 1 + max((_depth(c) for c in children), default=0)


def write_json(path: str | Path, data: Any) -> Path:
    """Write `data` as indented, strictly valid JSON (NaN/inf -> null), atomically."""
    text = json.dumps(to_strict_json(data), indent=2, allow_nan=False) + "\n"
    return atomic_write(path, lambda tmp: tmp.write_text(text))


class RunLock:
    """An exclusive lock on an output folder for the length of a run: `with RunLock(out): ...`.

    An advisory lock (fcntl.flock) on FOLDER/.lock, whose content names the holder (PID, host, start
    time) for the message a second run gets. The kernel releases the lock when its process exits,
    however it exits, so a lock file left behind by a killed run is never an obstacle: there is no
    stale state to detect or clean up. The file itself stays (deleting it would let a run waiting on the
    old file and a run creating a new one both hold "the" lock). POSIX only; on NFS, Linux maps flock to
    byte-range locks, which hold across hosts.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        import fcntl

        _make_folder(self.folder)
        # O_NOFOLLOW: a symlink planted at .lock must not make us truncate the file it points to; O_NONBLOCK: a
        # FIFO planted there must not hang the open (it is refused below)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        try:
            _refuse_shared_file(fd, self.path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe_holder(fd)
            os.close(fd)
            raise OutputError(f"output folder {self.folder} is in use by another run ({holder}); wait for it "
                              "to finish or choose another output folder") from None
        except BaseException:
            os.close(fd)
            raise
        owner = dict(pid=os.getpid(), host=socket.gethostname(), started=time.strftime("%Y-%m-%d %H:%M:%S"))
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def _refuse_shared_file(fd: int, path: Path) -> None:
    """OutputError unless the open file is a regular file with no other name: a hard link planted at a lock's
    or a temporary's name makes its target, anywhere on the file system, what a write would truncate."""
    import stat

    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise OutputError(f"{path} is not a regular file (a FIFO or device?); a run writes only inside its output "
                          "folder: remove it or choose another output folder")
    if info.st_nlink > 1:
        raise OutputError(f"{path} is a hard link ({info.st_nlink} names share its content), so writing it would "
                          "overwrite a file elsewhere; remove it (rm only removes this name) or choose another "
                          "output folder")


def _describe_holder(fd: int) -> str:
    try:
        owner = json.loads(os.pread(fd, 4096, 0).decode())
        return f"pid {owner['pid']} on {owner['host']}, since {owner['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"

"""What one command reads and writes, so that no output replaces an input or another output of the same command.

`resmlp.cli.main` opens a `command_scope` around each command: it notes every argument naming an existing file as
an input and claims every output-file argument (--results, --output FILE, --json, --plot); commands claim the files
they write into their folders (eval: OUT/summary.json) and readers note the files they resolve (a run folder's
best.safetensors). `resmlp.fileio.atomic_write` asks `check_target` before it writes: an input of the command
(the same inode, whatever name reaches it) is refused, and so is a second output claimed at one path. Outside a
scope (library use) nothing is recorded and nothing refused. Lowest layer: no torch.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from resmlp.errors import OutputError

_SCOPE: list[_Files] = []


class _Files:
    def __init__(self) -> None:
        self.inputs: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) of a file read -> the name it was given
        self.outputs: dict[str, str] = {}  # the real path of a file written -> what writes it (--results, summary)


@contextlib.contextmanager
def command_scope(inputs: Iterable[str | Path] = (), outputs: Mapping[str, str | Path | None] | None = None
                  ) -> Iterator[None]:
    """Record a command's inputs and claim its outputs for the length of the `with` (nested scopes stack)."""
    _SCOPE.append(_Files())
    try:
        note_inputs(*inputs)
        claim_outputs(outputs or {})
        yield
    finally:
        _SCOPE.pop()


def note_inputs(*paths: str | Path | None) -> None:
    """Remember the regular files at `paths` (symlinks followed) as inputs of the running command."""
    if not _SCOPE:
        return
    for path in paths:
        if path is None or str(path) == "":
            continue
        try:
            info = os.stat(path)
        except (OSError, ValueError):  # missing, unreadable, a NUL in the name: nothing there to protect
            continue
        if stat.S_ISREG(info.st_mode):
            _SCOPE[-1].inputs.setdefault((info.st_dev, info.st_ino), str(path))


MAX_FOLDER_ENTRIES = 100_000  # a folder of shards or tars, not one of images (those are not written over)


def note_folder_inputs(folder: str | Path) -> None:
    """Note the regular files directly inside `folder` (at most MAX_FOLDER_ENTRIES looked at) as inputs: a
    command reading shards or tars there (`resmlp data shards wds:DIR DIR`) may not write over them."""
    if not _SCOPE:
        return
    try:
        with os.scandir(folder) as entries:
            for count, entry in enumerate(entries):
                if count >= MAX_FOLDER_ENTRIES:
                    break
                note_inputs(entry.path)
    except (OSError, ValueError):
        return


def claim_outputs(outputs: Mapping[str, str | Path | None]) -> None:
    """Claim `outputs` ({what writes it: path}) for the running command: OutputError when one is an input of the
    command or when two claims name one file."""
    if not _SCOPE:
        return
    files = _SCOPE[-1]
    for what, path in outputs.items():
        if path is None or str(path) == "":
            continue
        check_target(path)
        key = _real(path)
        other = files.outputs.setdefault(key, what)
        if other != what:
            raise OutputError(f"{path} is both {other} and {what} of this command: one would replace the other; "
                              "choose another path for one of them")


def check_target(path: str | Path) -> None:
    """OutputError when writing `path` would replace an input of the running command (the file at that name,
    not through a symlink: atomic_write replaces a symlink, never its target)."""
    if not _SCOPE:
        return
    try:
        info = os.lstat(path)
    except (OSError, ValueError):
        return
    given = _SCOPE[-1].inputs.get((info.st_dev, info.st_ino))
    if given is not None:
        same = "" if _real(given) == _real(path) else f" (the same file as {given})"
        raise OutputError(f"{path} is an input of this command{same}: writing it would replace what is being "
                          "read; choose another output path")


def _real(path: str | Path) -> str:
    """The path with its folder's symlinks resolved (not its last part: a symlink there is replaced, not followed)."""
    path = Path(os.path.abspath(path))
    return str(Path(os.path.realpath(path.parent)) / path.name)

"""Finding files in folders and glob patterns, bounded: regular files only, no symlink loops, no hang.

torchvision's ImageFolder and Python's recursive glob follow symlinks to folders, so two links to `..` make
a walk exponential (or endless); and a FIFO named `x.png` passes every suffix test, then blocks the first
`open` forever. Here:
- folders are walked without following symlinks to folders below the folder named (a symlink to a file is
  followed), so every folder is visited once;
- only regular files are returned (FIFOs, sockets and devices are not), decided by `os.stat`, never by
  opening them;
- a walk stops with a DataError after MAX_WALK_ENTRIES entries (a pattern such as `/proc/self/**/*.png`
  or a mistaken `/`).
"""

from __future__ import annotations

import glob
import os
import re
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from resmlp.errors import DataError

# twice ImageNet-21k's images (fall11_whole.tar: 14,197,122 images in 21,841 classes, image-net.org): past this,
# the folder is not a dataset
MAX_WALK_ENTRIES = 30_000_000


def is_regular_file(path: str | Path) -> bool:
    """Whether `path` is (or links to) a regular file: not a FIFO, socket or device, which `open` could block
    on or read forever."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def regular_files(top: str | Path, keep: Callable[[str], bool] = lambda _: True,
                  max_entries: int = MAX_WALK_ENTRIES) -> Iterator[Path]:
    """The regular files under `top` whose name `keep` accepts, folder symlinks below `top` not followed;
    DataError past `max_entries` entries. In torchvision's order (folders sorted by path, then names), so an
    image folder lists its samples as ImageFolder did."""
    seen, folders = 0, []
    for folder, dirs, files in os.walk(top, followlinks=False):
        seen += len(dirs) + len(files)
        if seen > max_entries:
            raise DataError(f"{top} holds more than {max_entries} entries; name a smaller folder or pattern")
        folders.append((folder, files))
    for folder, files in sorted(folders):
        for name in sorted(files):
            path = os.path.join(folder, name)
            if keep(name) and is_regular_file(path):
                yield Path(path)


def expand_pattern(pattern: str, max_entries: int = MAX_WALK_ENTRIES) -> list[Path]:
    """The regular files a glob pattern names, sorted; `**` matches any folders (walked by `regular_files`,
    so without symlink loops and bounded), other wildcards one path component as in `glob`."""
    if "**" not in pattern:
        return sorted(Path(f) for f in glob.glob(pattern) if is_regular_file(f))
    base = _literal_prefix(pattern)
    regex = _pattern_regex(pattern)
    return [p for p in regular_files(base, max_entries=max_entries) if regex.fullmatch(str(p))]


def _literal_prefix(pattern: str) -> str:
    """The folder part of `pattern` before its first wildcard ('.' for a relative pattern without one)."""
    parts = pattern.split(os.sep)
    literal = []
    for part in parts[:-1]:
        if glob.has_magic(part):
            break
        literal.append(part)
    return os.sep.join(literal) or ("/" if pattern.startswith(os.sep) else ".")


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A glob pattern as a regular expression over whole paths: `**/` any folders (or none), `*` and `?` within
    one component, `[...]` a character class."""
    if pattern.startswith("." + os.sep) and _literal_prefix(pattern) == ".":
        pattern = pattern[2:]
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2:]:
            end = pattern.index("]", i + 2)
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body).replace("\\", "\\\\") + "]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    prefix = "(?:\\./)?" if not pattern.startswith(os.sep) else ""
    return re.compile(prefix + "".join(out))


def list_files(top: str | Path, keep: Callable[[str], bool], max_entries: int = MAX_WALK_ENTRIES,
               folders: list[str] | None = None) -> list[str]:
    """The names (relative to `top`, '/'-separated) of the files under `top` that `keep` accepts, in
    `regular_files`' order, listed with `os.scandir` and without one `os.stat` per file: the folder entries'
    own types decide (a FIFO or socket is left out, a symlink is listed and checked when it is read, as every
    reader does: `resmlp.data.images`). Folder symlinks below `top` are not followed (no loops); DataError past
    `max_entries` entries. At 1.28 M files a stat each is minutes on network storage; this is one readdir per
    folder."""
    seen, found, pending = 0, [], [""]
    while pending:
        rel = pending.pop()
        try:
            with os.scandir(os.path.join(top, rel) if rel else top) as entries:
                listed = list(entries)
        except OSError as e:
            raise DataError(f"cannot list {os.path.join(top, rel)}: {e.strerror or e}") from None
        seen += len(listed)
        if seen > max_entries:
            raise DataError(f"{top} holds more than {max_entries} entries; name a smaller folder or pattern")
        files = []
        for entry in listed:
            name = rel + "/" + entry.name if rel else entry.name
            if entry.is_dir(follow_symlinks=False):
                pending.append(name)
            elif (entry.is_file(follow_symlinks=False) or entry.is_symlink()) and keep(entry.name):
                files.append(name)
        found.append((rel, sorted(files)))
        if folders is not None:
            folders.append(rel)
    # torchvision's order: sorted(os.walk(...)) sorts the folders by their paths, then each folder's names
    return [name for _, files in sorted(found, key=lambda item: os.path.join(top, item[0])) for name in files]

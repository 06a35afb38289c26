"""A tar of an ImageNet-layout folder, read in place: the `folder:FILE.tar` source.

The archive holds what `folder:DIR` reads (resmlp.data.sources.imagenet), `DIR` archived: members
`train/<class>/<image>`, `val/<class>/<image>` (split synonyms as for folders), or the raw flat val folder with
`LOC_val_solution.csv` / `val.txt` inside the tar (beside the images or at the top); optionally all under one
top-level folder (`imagenet/train/...`, as `tar cf imagenet.tar imagenet` makes). Class names, labels and the
order of the records are those of the extracted folder: the folder source's own functions decide them.

Python's tarfile lists the members once, one sequential pass over the headers (no extraction); each image's
name, data offset and size are kept in numpy arrays (shared by DataLoader workers after fork without copying,
as the folder source's names are), and a record is read with one `os.pread` at its offset through a file
descriptor each process opens for itself on first use (a descriptor is never shared across a fork). The tar
must be uncompressed: a compressed one can't be read at an offset, and is refused in one line.

timm reads tars too (its ImageDataset over a tar); it follows none of the checks below. Here:
- only regular-file members are records; a symlink, hard link, device or FIFO member where an image would be
  is refused in one line (its target is never followed), other non-file members are ignored;
- a member named with `..` or an absolute path is refused (a hostile archive);
- a truncated archive (a member's data past the end, or no end-of-archive block) is refused when listed;
  a member that can't be read later (the file changed) is skipped and counted like an unreadable file;
- empty class folders, a flat val folder without ground truth, and class lists that disagree are refused as
  for folders; an image member above resmlp.data.images.MAX_IMAGE_FILE_BYTES is unreadable (skipped and
  counted), and decoding bounds the pixels as for every image.
"""

from __future__ import annotations

import os
import tarfile
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from resmlp.data.images import MAX_IMAGE_FILE_BYTES
from resmlp.data.records import MapRecords, Source, SourceSpec
from resmlp.data.sources.imagenet import (
    MAX_GROUND_TRUTH_BYTES,
    SPLIT_NAMES,
    PackedNames,
    is_image_name,
    label_class_files,
    label_flat_files,
    parse_ground_truth,
    read_class_map,
    split_names,
)
from resmlp.data.sources.walk import MAX_WALK_ENTRIES
from resmlp.errors import DataError

# magic numbers of the compressions tarfile could open but not at an offset: gzip, bzip2, xz, zstd
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
BLOCK = tarfile.BLOCKSIZE


class TarRecords(MapRecords):
    """Image members of an uncompressed tar: names (relative to `prefix`, the split folder inside the tar),
    data offsets and sizes in numpy arrays; the payload is the member's bytes, read at its offset."""

    def __init__(self, tar: str, prefix: str, names: PackedNames, offsets: np.ndarray, sizes: np.ndarray,
                 labels: np.ndarray, class_names: list[str]) -> None:
        super().__init__(labels, class_names)
        self.tar, self.prefix, self.names = tar, prefix, names
        self.offsets, self.sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
        self._fd: int | None = None
        self._pid = -1

    def _descriptor(self) -> int:
        # opened lazily by each process (a DataLoader worker after fork reopens): no descriptor is shared
        if self._pid != os.getpid():
            self._fd, self._pid = os.open(self.tar, os.O_RDONLY), os.getpid()
        return self._fd

    def payload(self, index: int) -> bytes:
        size, offset = int(self.sizes[index]), int(self.offsets[index])
        if size > MAX_IMAGE_FILE_BYTES:
            raise DataError(f"image {self.name(index)} is larger than {MAX_IMAGE_FILE_BYTES} bytes; no dataset "
                            "image is")
        try:
            data = os.pread(self._descriptor(), size, offset)
        except OSError as e:
            raise DataError(f"cannot read image {self.name(index)}: {type(e).__name__}: {e}") from None
        if len(data) != size:
            raise DataError(f"image {self.name(index)} is truncated: {len(data)} of {size} bytes (the tar changed?)")
        return data

    def name(self, index: int) -> str:
        return f"{self.tar}:{self.prefix}{self.names[index]}"

    def subset(self, indices: np.ndarray) -> TarRecords:
        return TarRecords(self.tar, self.prefix, self.names.subset(indices), self.offsets[indices],
                          self.sizes[indices], self.labels[indices], self.class_names)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fd": None, "_pid": -1}  # a spawned worker opens its own

    def __del__(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)


@dataclass
class TarListing:
    """The members of a tar, its top-level folder stripped: {name: (offset, size)} of regular files, and the
    folders (directory members, and every file's parent folders)."""

    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    folders: set[str] = field(default_factory=set)
    prefix: str = ""


def tar_source(spec: SourceSpec, class_map: str | None = None) -> Source:
    """The splits inside the tar `spec.arg` (see the module doc), listed now, read when asked for."""
    tar = str(spec.arg)
    listing = list_tar(tar)
    tops = {name.split("/")[0] for name in listing.folders if "/" not in name}
    splits = split_names(tops, tar)
    if not splits:
        raise DataError(f"{tar} has no train/ folder (nor training/, val/, validation/ or test/) inside; expected "
                        "members train/<class>/<image>.JPEG and val/<class>/<image>.JPEG (tar cf x.tar -C DIR .)")
    classes: list[str] = []

    def class_names() -> list[str]:
        if not classes:
            first = splits.get("train") or next(iter(splits.values()))
            classes.extend(read_class_map(class_map) if class_map else _class_folders(listing, first))
            if not classes:
                raise ValueError(f"{tar}: {listing.prefix}{first}/ has no class sub-folders; expected members "
                                 f"{listing.prefix}{first}/<class>/<image>.JPEG")
        return classes

    def records(split: str) -> TarRecords:
        return _split_records(tar, listing, split, splits[split], class_names(), bool(class_map))

    return Source(spec, {split: (lambda s=split: records(s)) for split in splits})


def list_tar(tar: str) -> TarListing:
    """One pass over the tar's headers; DataError (one line) for a compressed, truncated or hostile archive."""
    try:
        with open(tar, "rb") as file:
            magic = file.read(6)
            kind = next((k for m, k in COMPRESSED.items() if magic.startswith(m)), None)
            if kind:
                raise DataError(f"{tar} is {kind}-compressed; its images are read at their offsets, so it must be "
                                f"a plain tar: decompress it first (e.g. {'gunzip' if kind == 'gzip' else kind} -d)")
            file.seek(0)
            return _members(tar, file, os.fstat(file.fileno()).st_size)
    except tarfile.TarError as e:
        raise DataError(f"{tar} is not a readable tar ({e}): folder: takes a folder or an uncompressed tar of one; "
                        "a truncated tar reads so too (make it again: tar cf)") from None
    except OSError as e:
        raise DataError(f"cannot read {tar}: {e.strerror or e}") from None


def _members(tar: str, file: Any, size: int) -> TarListing:
    archive = tarfile.open(fileobj=file, mode="r:")  # noqa: SIM115 (the caller closes `file`, all it holds)
    listing, links = TarListing(), []
    while (member := archive.next()) is not None:
        archive.members.clear()  # tarfile keeps every TarInfo otherwise: 1.28 M objects at ImageNet's size
        if len(listing.files) + len(listing.folders) > MAX_WALK_ENTRIES:
            raise DataError(f"{tar} holds more than {MAX_WALK_ENTRIES} members; it is not one dataset")
        name = _safe_name(tar, member.name)
        if member.isreg():
            if member.offset_data + member.size > size:
                raise DataError(f"{tar} is truncated: member {name} ends at byte {member.offset_data + member.size} "
                                f"of a {size}-byte file; copy or make the tar again")
            listing.files[name] = (member.offset_data, member.size)  # a later member of one name wins, as extracted
            _add_folders(listing.folders, name.rpartition("/")[0])
        elif member.isdir():
            _add_folders(listing.folders, name)
        elif is_image_name(name):
            links.append(name)
    file.seek(archive.offset)
    if file.read(BLOCK) != bytes(BLOCK):  # tarfile stops quietly at a cut header; a whole tar ends in zero blocks
        raise DataError(f"{tar} is truncated: it ends without the end-of-archive block after its last whole member "
                        f"(at byte {archive.offset}); copy or make the tar again")
    if links:
        raise DataError(f"{tar}: member {links[0]} (and {len(links) - 1} more) is a link, device or FIFO, not an "
                        "image file; a tar is read as regular files only: make it with links dereferenced "
                        "(tar -h --hard-dereference)")
    return _strip_top_folder(listing)


def _safe_name(tar: str, name: str) -> str:
    """`name` without `.` and empty components (`./train/x` is `train/x`); refused if absolute or with `..`."""
    parts = name.split("/")
    if name.startswith("/") or ".." in parts:
        raise DataError(f"{tar}: member {name!r} names a path outside the archive (absolute or with '..'); "
                        "refused: a dataset tar holds relative names only")
    return "/".join(part for part in parts if part not in ("", "."))


def _add_folders(folders: set[str], folder: str) -> None:
    """`folder` and its parents (string operations: this runs once per member)."""
    while folder and folder not in folders:
        folders.add(folder)
        folder = folder.rpartition("/")[0]


def _strip_top_folder(listing: TarListing) -> TarListing:
    """The listing without its one top-level folder (`imagenet/train/...`), when it has one and nothing else."""
    tops = {name.split("/")[0] for name in [*listing.files, *listing.folders]}
    split_synonyms = {name for names in SPLIT_NAMES.values() for name in names}
    if len(tops) != 1 or tops & split_synonyms or next(iter(tops)) in listing.files:
        return listing
    top = next(iter(tops)) + "/"
    cut = len(top)
    return TarListing({name[cut:]: where for name, where in listing.files.items()},
                      {name[cut:] for name in listing.folders if name.startswith(top)}, top)


def _class_folders(listing: TarListing, split_dir: str) -> list[str]:
    inside = split_dir + "/"
    return sorted({name[len(inside):] for name in listing.folders
                   if name.startswith(inside) and "/" not in name[len(inside):]})


def _torchvision_order(names: list[str]) -> list[str]:
    """The folder listing's order (resmlp.data.sources.walk.list_files): folders by path, then names within each."""
    return sorted(names, key=lambda name: name.rpartition("/")[::2])


def _split_records(tar: str, listing: TarListing, split: str, split_dir: str, classes: list[str],
                   mapped: bool) -> TarRecords:
    inside = split_dir + "/"
    present = _class_folders(listing, split_dir)
    where = f"{tar}:{listing.prefix}{split_dir}"
    if present:
        by_class: dict[str, list[str]] = {name: [] for name in present}
        for name in listing.files:
            parts = name[len(inside):].split("/", 1) if name.startswith(inside) else []
            if len(parts) == 2 and is_image_name(name):
                by_class[parts[0]].append(parts[1])
        names, labels = label_class_files(where, split, {c: _torchvision_order(f) for c, f in by_class.items()},
                                          classes, mapped)
    else:
        files = sorted(name[len(inside):] for name in listing.files
                       if name.startswith(inside) and "/" not in name[len(inside):] and is_image_name(name))
        names, labels = label_flat_files(files, _ground_truth(tar, listing, split, split_dir, classes, files),
                                         f"the ground truth of {where}", where)
    where_of = [listing.files[inside + name] for name in names]
    return TarRecords(tar, listing.prefix + inside, PackedNames.pack(names), np.asarray([o for o, _ in where_of]),
                      np.asarray([s for _, s in where_of]), labels, classes)


def _ground_truth(tar: str, listing: TarListing, split: str, split_dir: str, classes: list[str],
                  files: list[str]) -> dict[str, int]:
    """The flat folder's labels from LOC_<split>_solution.csv or <split>.txt inside the tar, beside the images
    or at the top, as for a folder."""
    for folder in (split_dir + "/", ""):
        for name in {split_dir, split}:
            for candidate in (f"LOC_{name}_solution.csv", f"{name}.txt"):
                if folder + candidate in listing.files:
                    offset, size = listing.files[folder + candidate]
                    what = f"{tar}:{listing.prefix}{folder}{candidate}"
                    if size > MAX_GROUND_TRUTH_BYTES:
                        raise DataError(f"{what} is larger than {MAX_GROUND_TRUTH_BYTES} bytes; a ground-truth file "
                                        "is a few MB")
                    with open(tar, "rb") as file:
                        text = os.pread(file.fileno(), size, offset).decode("utf-8", errors="replace")
                    return parse_ground_truth(text, candidate.endswith(".csv"), what, classes)
    where = f"{tar}:{listing.prefix}{split_dir}"
    if not files:
        raise ValueError(f"{where}/ has no class sub-folders; expected members {where}/<class>/<image>.JPEG")
    raise DataError(f"{where}/ holds {len(files)} images but no class folders and no ground-truth file: add "
                    f"LOC_{split_dir}_solution.csv or {split_dir}.txt (`name label` per line) to the tar, or sort the "
                    f"images into {split_dir}/<class>/")

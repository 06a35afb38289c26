"""A tar of an ImageNet-layout folder, read in place: the `folder:FILE.tar` source.

The archive holds what `folder:DIR` reads (resmlp.data.sources.imagenet), `DIR` archived: members
`train/<class>/<image>`, `val/<class>/<image>` (split synonyms as for folders), or the raw flat val folder with
`LOC_val_solution.csv` / `val.txt` inside the tar (beside the images or at the top); optionally all under one
top-level folder (`imagenet/train/...`, as `tar cf imagenet.tar imagenet` makes). Class names, labels and the
order of the records are those of the extracted folder: the folder source's own functions decide them.

ImageNet's downloads as they ship are read in place too: `ILSVRC2012_img_train.tar` (`folder:FILE.tar`, or a
`folder:DIR` holding it) is a tar of 1,000 class tars `nXXXXXXXX.tar`, each a tar of that class's JPEGs: it is
listed as `train/<class>/<image>`, each image's offset that of its bytes inside the class tar inside the outer
tar. `ILSVRC2012_img_val.tar` (flat JPEGs) in the same `DIR` is the val split, labelled by `LOC_val_solution.csv`
or `val.txt` beside it (downloads_source).

Python's tarfile lists the members once, one sequential pass over the headers (no extraction); each image's
name, data offset and size are kept in numpy arrays (shared by DataLoader workers after fork without copying,
as the folder source's names are), and a record is read with one `os.pread` at its offset through a file
descriptor each process opens for itself on first use (a descriptor is never shared across a fork). The tar
must be uncompressed: a compressed one can't be read at an offset, and is refused in one line.

timm reads tars too (its ImageDataset over a tar); it follows none of the checks below. Here:
- only regular-file members are records; a symlink, hard link, device or FIFO member where an image or a
  (class) folder would be is refused in one line (its target is never followed), other non-file members are
  ignored; a GNU sparse member (its bytes not in one piece) is refused by name;
- a member named with `..` or an absolute path is refused (a hostile archive), and a name longer than
  PATH_MAX or deeper than MAX_MEMBER_DEPTH folders before it is split into its folders;
- a class tar's headers are read within its member only (a truncated one can't run on into the next);
- the listing is cached in the run's data_index/ (resmlp.data.sources.index_cache), keyed by the tar's path,
  size and modification time, and checked when read back (resmlp.data.sources.tar_listing);
- a truncated archive (a member's data past the end, or no end-of-archive block) is refused when listed;
  a member that can't be read later (the file changed) is skipped and counted like an unreadable file;
- empty class folders, a flat val folder without ground truth, and class lists that disagree are refused as
  for folders; an image member above resmlp.data.images.MAX_IMAGE_FILE_BYTES is unreadable (skipped and
  counted), and decoding bounds the pixels as for every image.
"""

from __future__ import annotations

import os
import tarfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.data.images import MAX_IMAGE_FILE_BYTES
from resmlp.data.records import MapRecords, Source, SourceSpec, check_class_names
from resmlp.data.sources.imagenet import (
    MAX_GROUND_TRUTH_BYTES,
    SPLIT_NAMES,
    PackedNames,
    decode_ground_truth,
    is_image_name,
    label_class_files,
    label_flat_files,
    parse_ground_truth,
    read_class_map,
    read_ground_truth,
    split_folders,
    split_names,
)
from resmlp.data.sources.index_cache import index_path, load_index, save_index
from resmlp.data.sources.tar_listing import TarListing, listing_arrays, restore_listing
from resmlp.data.sources.walk import MAX_WALK_ENTRIES
from resmlp.errors import ConfigError, DataError

# magic numbers of the compressions tarfile could open but not at an offset: gzip, bzip2, xz, zstd
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
BLOCK = tarfile.BLOCKSIZE
# ImageNet's downloads, by split (image-net.org's ILSVRC2012 file names); Kaggle's class list in their order
DOWNLOADS = {"train": "ILSVRC2012_img_train.tar", "val": "ILSVRC2012_img_val.tar"}
SYNSET_MAPPING = "LOC_synset_mapping.txt"
GROUND_TRUTH_FILES = ("LOC_val_solution.csv", "val.txt")
MAX_MEMBER_NAME_CHARS = 4096  # PATH_MAX on Linux: no extracted file could have a longer name
IMAGENET_1K_CLASSES = 1000  # the class tars of ILSVRC2012_img_train.tar (image-net.org's ILSVRC2012 download)
MAX_MEMBER_DEPTH = 64  # folders deep; ImageNet's names are 2-3 deep (train/<class>/<image>)


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
        try:  # the member's header block with its data: one read
            data = os.pread(self._descriptor(), size + BLOCK, offset - BLOCK)
        except OSError as e:
            raise DataError(f"cannot read image {self.name(index)}: {type(e).__name__}: {e}") from None
        if len(data) != size + BLOCK:
            raise DataError(f"image {self.name(index)} is truncated: {len(data) - BLOCK} of {size} bytes (the tar "
                            "changed?)")
        self._check_header(index, data[:BLOCK], size, offset)
        return data[BLOCK:]

    def _check_header(self, index: int, block: bytes, size: int, offset: int) -> None:
        """ConfigError unless the header before the data is this record's member (its name and size): a listing,
        fresh or cached by size and time, read at offsets where the tar now holds other members (a tar rewritten
        in place with its size and time kept, an altered cache) would give images another's label."""
        name = f"{self.prefix}{self.names[index]}"
        try:
            member = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError:
            member = None
        stored = "" if member is None else "/".join(p for p in member.name.split("/") if p not in ("", "."))
        # a name of 99+ characters may be cut in the header block (its whole form precedes it): the size decides;
        # a pax tar writes a name outside ASCII there with "?" for each such character: compared in that form
        cut = member is not None and len(member.name.encode("utf-8", "surrogateescape")) >= 99  # bytes, not chars
        stored, name_ = (_ascii(stored), _ascii(name))
        if member is None or member.size != size or not (cut or name_ == stored or name_.endswith("/" + stored)):
            found = "no member header" if member is None else f"member {member.name!r} ({member.size} bytes)"
            raise ConfigError(f"{self.tar}: byte {offset - BLOCK} holds {found}, not {name} ({size} bytes) as listed: "
                              "the tar was rewritten since it was listed (its size and time kept) or its cached "
                              "listing (data_index/tar-*.npz) was altered; delete the run's data_index/ to list it "
                              "again")

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


def _ascii(name: str) -> str:
    return name.encode("ascii", "replace").decode("ascii")


def tar_source(spec: SourceSpec, class_map: str | None = None, index_cache: str | Path | None = None) -> Source:
    """The splits inside the tar `spec.arg` (see the module doc), listed now (or read from `index_cache`), read
    when asked for."""
    tar = str(spec.arg)
    if os.path.isdir(tar):
        return downloads_source(spec, class_map, index_cache)
    listing = list_tar(tar, index_cache)
    tops = {name.split("/")[0] for name in listing.folders if "/" not in name}
    splits = split_names(tops, tar)
    if not splits and os.path.basename(tar) == DOWNLOADS["val"]:
        raise DataError(f"{tar} is ImageNet's validation download (flat images): name the folder that holds it and "
                        f"its ground truth (LOC_val_solution.csv or val.txt), folder:{os.path.dirname(tar) or '.'}")
    if not splits:
        raise DataError(f"{tar} has no train/ folder (nor training/, val/, validation/ or test/) inside; expected "
                        "members train/<class>/<image>.JPEG and val/<class>/<image>.JPEG (tar cf x.tar -C DIR .)")
    classes: list[str] = []

    def class_names() -> list[str]:
        if not classes:
            first = splits.get("train") or next(iter(splits.values()))
            classes.extend(read_class_map(class_map) if class_map else _checked_class_folders(tar, listing, first))
            if not classes:
                raise ValueError(f"{tar}: {listing.prefix}{first}/ has no class sub-folders; expected members "
                                 f"{listing.prefix}{first}/<class>/<image>.JPEG")
        return classes

    def records(split: str) -> TarRecords:
        return _split_records(tar, listing, split, splits[split], class_names(), bool(class_map))

    return Source(spec, {split: (lambda s=split: records(s)) for split in splits})


def reads_in_place(path: Path) -> bool:
    """Whether `folder:PATH` is read from tars by this module: a tar, or a folder with ImageNet's downloads
    (ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar) and no split folders."""
    if path.is_file():
        return True
    return path.is_dir() and not split_folders(path) and any((path / name).is_file() for name in DOWNLOADS.values())


def downloads_source(spec: SourceSpec, class_map: str | None = None,
                     index_cache: str | Path | None = None) -> Source:
    """`folder:DIR`, DIR holding ImageNet's downloads as they ship: ILSVRC2012_img_train.tar (a tar of class
    tars) and ILSVRC2012_img_val.tar (the flat images) with their ground truth beside them
    (LOC_val_solution.csv or val.txt). Each split is listed when first read (from `index_cache` when the tar is
    unchanged). Classes: the class map, else Kaggle's LOC_synset_mapping.txt in DIR, else the training tar's
    class tars, sorted: the extracted folder's classes in every case."""
    root = Path(spec.arg)
    present = {split: root / name for split, name in DOWNLOADS.items() if (root / name).is_file()}
    listings: dict[str, TarListing] = {}
    classes: list[str] = []

    def listing(split: str) -> TarListing:
        if split not in listings:
            listings[split] = _as_split(list_tar(str(present[split]), index_cache), split)
        return listings[split]

    def class_names() -> list[str]:
        if not classes:
            mapping = class_map or ((root / SYNSET_MAPPING) if (root / SYNSET_MAPPING).is_file() else None)
            if mapping is None and "train" not in present:
                raise DataError(f"{root} has {DOWNLOADS['val']} but neither {DOWNLOADS['train']} nor "
                                f"{SYNSET_MAPPING} to name the classes; add one, or give data.class_map")
            classes.extend(read_class_map(mapping) if mapping else
                           _checked_class_folders(str(present["train"]), listing("train"), "train"))
        return classes

    def records(split: str) -> TarRecords:
        truth = None if split == "train" else _truth_beside(root, present[split], listing(split))
        return _split_records(str(present[split]), listing(split), split, split, class_names(),
                              bool(class_map) or (root / SYNSET_MAPPING).is_file(), truth)

    return Source(spec, {split: (lambda s=split: records(s)) for split in present})


def _as_split(listing: TarListing, split: str) -> TarListing:
    """A download's listing as the split folder `split` (the class tars already are train/<class>/...)."""
    if split in listing.folders:
        return listing
    return TarListing({f"{split}/{name}": where for name, where in listing.files.items()},
                      {split} | {f"{split}/{name}" for name in listing.folders}, listing.prefix)


def _truth_beside(root: Path, tar: Path, listing: TarListing) -> Path | None:
    """The ground truth of a flat val download: LOC_val_solution.csv or val.txt in DIR (None for class folders)."""
    if _class_folders(listing, "val"):
        return None
    for name in GROUND_TRUTH_FILES:
        if (root / name).is_file():
            return root / name
    raise DataError(f"{tar} holds the flat validation images but {root} has no ground truth: add "
                    f"{' or '.join(GROUND_TRUTH_FILES)} (Kaggle's LOC_val_solution.csv, or `name label` lines) to it")


def list_tar(tar: str, cache: str | Path | None = None) -> TarListing:
    """The tar's listing (see the module doc), from `cache`/data_index/ when the tar's size and modification
    time are those it was listed at; else one pass over its headers (and over each class tar's, for
    ILSVRC2012_img_train.tar's tar of tars), then cached. DataError (one line) for a compressed, truncated or
    hostile archive."""
    try:
        stat = os.stat(tar)
    except OSError as e:
        raise DataError(f"cannot read {tar}: {e.strerror or e}") from None
    path = None if cache is None else index_path(cache, "tar", f"{os.path.realpath(tar)}\0{stat.st_size}\0"
                                                 f"{stat.st_mtime_ns}")
    cached = None if path is None else restore_listing(load_index(path), stat.st_size)
    if cached is not None:
        return cached
    listing = _read_listing(tar)
    if path is not None:
        save_index(path, listing_arrays(listing))
    return listing


def _read_listing(tar: str) -> TarListing:
    try:
        with open(tar, "rb") as file:
            magic = file.read(6)
            kind = next((k for m, k in COMPRESSED.items() if magic.startswith(m)), None)
            if kind:
                raise DataError(f"{tar} is {kind}-compressed; its images are read at their offsets, so it must be "
                                f"a plain tar: decompress it first (e.g. {'gunzip' if kind == 'gzip' else kind} -d)")
            size = os.fstat(file.fileno()).st_size
            listing = _strip_top_folder(_members(tar, file, 0, size))
            return _class_tars_inside(tar, file, listing) if is_tar_of_class_tars(listing) else listing
    except tarfile.TarError as e:
        raise DataError(f"{tar} is not a readable tar ({e}): folder: takes a folder or an uncompressed tar of one; "
                        "a truncated tar reads so too (make it again: tar cf)") from None
    except OSError as e:
        raise DataError(f"cannot read {tar}: {e.strerror or e}") from None


def _members(tar: str, file: Any, start: int, end: int, within: str = "") -> TarListing:
    """The members of the tar at bytes [start, end) of `file` (the whole file, or a member tar `within` it)."""
    file.seek(start)
    archive = tarfile.open(fileobj=file, mode="r:")  # noqa: SIM115 (the caller closes `file`, all it holds)
    listing, links = TarListing(), []
    where = f"{tar}:{within}" if within else tar
    while (member := _next_member(archive, where, end)) is not None:
        archive.members.clear()  # tarfile keeps every TarInfo otherwise: 1.28 M objects at ImageNet's size
        if len(listing.files) + len(listing.folders) > MAX_WALK_ENTRIES:
            raise DataError(f"{where} holds more than {MAX_WALK_ENTRIES} members; it is not one dataset")
        name = _safe_name(where, member.name)
        if member.sparse is not None or any(key.startswith("GNU.sparse.") for key in member.pax_headers):
            raise DataError(f"{where}: member {name} is a GNU sparse file, whose bytes are not stored in one piece; "
                            "make the tar without --sparse (-S)")
        if member.isreg():
            if member.offset_data + member.size > end:
                raise DataError(f"{where} is truncated: member {name} ends at byte {member.offset_data + member.size}"
                                f" of a {end - start}-byte {'member tar' if within else 'file'}; copy or make the tar "
                                "again")
            listing.files[name] = (member.offset_data, member.size)  # a later member of one name wins, as extracted
            _add_folders(listing.folders, name.rpartition("/")[0])
        elif member.isdir():
            _add_folders(listing.folders, name)
        else:
            links.append(name)
    file.seek(archive.offset)
    if archive.offset + BLOCK > end or file.read(BLOCK) != bytes(BLOCK):  # tarfile stops quietly at a cut header
        raise DataError(f"{where} is truncated: it ends without the end-of-archive block after its last whole member "
                        f"(at byte {archive.offset - start}); copy or make the tar again")
    _refuse_links(where, links, listing)
    return listing


def _next_member(archive: tarfile.TarFile, where: str, end: int) -> tarfile.TarInfo | None:
    """The next member, its name bounded before anything splits it (a 60,000-component name is refused, not
    expanded into 60,000 folders), and never past `end` (a member tar's headers stop at its own end)."""
    if archive.offset >= end:
        return None
    member = archive.next()
    if member is not None and member.offset >= end:
        return None
    if member is not None and (len(member.name) > MAX_MEMBER_NAME_CHARS or
                               member.name.count("/") >= MAX_MEMBER_DEPTH):
        raise DataError(f"{where}: member {member.name[:60]!r}... has a name of {len(member.name):,} characters and "
                        f"{member.name.count('/') + 1:,} components; a dataset's names are under "
                        f"{MAX_MEMBER_NAME_CHARS} characters and {MAX_MEMBER_DEPTH} folders deep")
    return member


def _refuse_links(where: str, links: list[str], listing: TarListing) -> None:
    """Links, devices and FIFOs are never followed: one where an image, a folder or a class folder would be
    (a name without a suffix) is refused in one line; others (a README link) are ignored."""
    # in a tar of class tars (only .tar files, no folders: ILSVRC2012_img_train.tar), a linked `<class>.tar` is a
    # class folder linked: refused as one, not dropped with its class
    class_tars = not listing.folders and all(name.endswith(".tar") for name in listing.files)
    refused = [name for name in links if is_image_name(name) or name in listing.folders
               or "." not in name.rpartition("/")[2] or (class_tars and name.endswith(".tar"))]
    if refused:
        raise DataError(f"{where}: member {refused[0]} (and {len(refused) - 1} more) is a link, device or FIFO, not "
                        "an image file or folder (a class tar included); a tar is read as regular files and folders "
                        "only: make it with links dereferenced (tar -h --hard-dereference)")


def is_tar_of_class_tars(listing: TarListing) -> bool:
    """Whether the listing is ILSVRC2012_img_train.tar's: only `<class>.tar` files, no folders (split_names
    finds no split in it)."""
    return bool(listing.files) and not listing.folders and all(name.endswith(".tar") for name in listing.files)


def _class_tars_inside(tar: str, file: Any, outer: TarListing) -> TarListing:
    """ImageNet's training download, `<class>.tar` members each a tar of that class's images, listed as the
    extracted folder `train/<class>/<image>` is, the offsets those of the images inside the outer file."""
    listing = TarListing(folders={"train"})
    for class_tar, (offset, size) in sorted(outer.files.items()):
        inner = _members(tar, file, offset, offset + size, within=class_tar)
        folder = "train/" + class_tar[:-len(".tar")]
        listing.folders.add(folder)
        listing.folders.update(f"{folder}/{name}" for name in inner.folders)
        listing.files.update((f"{folder}/{name}", where) for name, where in inner.files.items())
    return listing


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


def _checked_class_folders(tar: str, listing: TarListing, split_dir: str) -> list[str]:
    """The class folders of a split inside the tar, bounded as every class list (check_class_names)."""
    found = _class_folders(listing, split_dir)
    if found and os.path.basename(tar) == DOWNLOADS["train"] and len(found) != IMAGENET_1K_CLASSES:
        warnings.warn(f"{tar} carries the name of ImageNet-1k's training download but holds {len(found):,} class "
                      f"tars, not ImageNet-1k's {IMAGENET_1K_CLASSES:,}: the run has {len(found):,} classes",
                      stacklevel=2)
    return check_class_names(found, f"{tar}:{listing.prefix}{split_dir}/") if found else found


def _class_folders(listing: TarListing, split_dir: str) -> list[str]:
    inside = split_dir + "/"
    return sorted({name[len(inside):] for name in listing.folders
                   if name.startswith(inside) and "/" not in name[len(inside):]})


def _torchvision_order(names: list[str]) -> list[str]:
    """The folder listing's order (resmlp.data.sources.walk.list_files): folders by path, then names within each."""
    return sorted(names, key=lambda name: name.rpartition("/")[::2])


def _split_records(tar: str, listing: TarListing, split: str, split_dir: str, classes: list[str],
                   mapped: bool, truth_file: Path | None = None) -> TarRecords:
    """The records of one split folder inside the tar: class folders, or flat images labelled by the ground
    truth inside the tar or, when given, by `truth_file` beside it (ImageNet's val download)."""
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
        truth = (read_ground_truth(truth_file, classes) if truth_file is not None
                 else _ground_truth(tar, listing, split, split_dir, classes, files))
        names, labels = label_flat_files(files, truth, str(truth_file or f"the ground truth of {where}"), where)
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
                        text = decode_ground_truth(os.pread(file.fileno(), size, offset))
                    return parse_ground_truth(text, candidate.endswith(".csv"), what, classes)
    where = f"{tar}:{listing.prefix}{split_dir}"
    if not files:
        raise ValueError(f"{where}/ has no class sub-folders; expected members {where}/<class>/<image>.JPEG")
    raise DataError(f"{where}/ holds {len(files)} images but no class folders and no ground-truth file: add "
                    f"LOC_{split_dir}_solution.csv or {split_dir}.txt (`name label` per line) to the tar, or sort the "
                    f"images into {split_dir}/<class>/")

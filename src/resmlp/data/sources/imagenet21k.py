"""ImageNet-21k in its download forms, read in place: the `imagenet21k:PATH` source (a training set: one split,
`train`; a run carves its validation images from it, data.val_size).

PATH is any of:
- the full download, `fall11_whole.tar` or `winter21_whole.tar` (or a folder holding it): a tar of 21,841
  (fall11; 19,167 in winter21) per-class tars `nXXXXXXXX.tar`, the shape of ILSVRC2012_img_train.tar at 14 M
  images. It is read as that file is (resmlp.data.sources.imagenet_tar): one pass over every header, the listing
  kept in the run's data_index/ and read back at the next start while the tar is unchanged. A compressed
  download (`winter21_whole.tar.gz`) is refused in one line: decompress it first (images are read at offsets);
- the download extracted once: a folder of the class tars `nXXXXXXXX.tar`, each read in place (ClassTarRecords);
  the listing of all of them is cached as one, valid while every class tar keeps its size and modification time;
- the download extracted fully: a folder of class folders `nXXXXXXXX/<image>.JPEG` (or a folder with train/,
  read as `folder:DIR`), listed and cached as the folder source's splits are.
Classes: the class tars' or folders' names (WordNet ids), sorted, unless a class map names them (data.class_map,
e.g. timm's imagenet22k_synsets.txt order); the bounds are the project's (resmlp.data.records.MAX_CLASSES,
resmlp.data.sources.walk.MAX_WALK_ENTRIES), both above ImageNet-21k's 21,841 classes and 14.2 M images.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.data.images import MAX_IMAGE_FILE_BYTES
from resmlp.data.records import MAX_CLASSES, MapRecords, Source, SourceSpec, check_class_names
from resmlp.data.sources.imagenet import (
    PackedNames,
    cached_records,
    folder_source,
    is_image_name,
    read_class_map,
    split_folders,
    split_records,
)
from resmlp.data.sources.imagenet_tar import list_tar, tar_source
from resmlp.data.sources.index_cache import index_path, load_index, safe_names, save_index
from resmlp.errors import DataError

DOWNLOADS = ("fall11_whole.tar", "winter21_whole.tar")
OPEN_TARS = 64  # class tars a process keeps open at once (a shuffled epoch reads from all 21,841)
LAYOUT = ("fall11_whole.tar or winter21_whole.tar (a tar of class tars nXXXXXXXX.tar), a folder of those class "
          "tars, or a folder of class folders nXXXXXXXX/<image>.JPEG")


def imagenet21k_source(spec: SourceSpec, class_map: str | None = None,
                       index_cache: str | Path | None = None) -> Source:
    """ImageNet-21k at `spec.arg` in any of the module doc's forms."""
    path = Path(spec.arg)
    if path.is_file():
        return tar_source(SourceSpec("folder", str(path)), class_map, index_cache)
    if not path.is_dir():
        raise FileNotFoundError(f"ImageNet-21k {path} does not exist; expected {LAYOUT}")
    for name in DOWNLOADS:
        if (path / name).is_file():
            return tar_source(SourceSpec("folder", str(path / name)), class_map, index_cache)
    if split_folders(path):
        return folder_source(SourceSpec("folder", str(path)), class_map, index_cache)
    tars, folders = _entries(path)
    if tars and folders:
        raise DataError(f"{path} holds both class tars ({tars[0]}...) and class folders ({folders[0]}/...); keep one "
                        "form (a half-extracted download?)")
    if not tars and not folders:
        raise DataError(f"{path} holds no class tars nor class folders; expected {LAYOUT}")
    names = [t[:-len(".tar")] for t in tars] or folders
    classes = read_class_map(class_map) if class_map else check_class_names(names, str(path))

    def records() -> MapRecords:
        if tars:
            return class_tar_records(path, tars, classes, index_cache)
        if index_cache is None:
            return split_records(path, path, "train", classes, bool(class_map))
        return cached_records(path, path, "train", classes, bool(class_map), Path(index_cache))

    return Source(spec, {"train": records})


def _entries(path: Path) -> tuple[list[str], list[str]]:
    """The folder's class tars (`*.tar` files) and class folders, each sorted; bounded by MAX_CLASSES."""
    tars, folders = [], []
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir():
                folders.append(entry.name)
            elif entry.name.endswith(".tar") and entry.is_file():
                tars.append(entry.name)
            if len(tars) + len(folders) > MAX_CLASSES:
                raise DataError(f"{path} holds more than {MAX_CLASSES:,} class tars or folders; ImageNet-21k has "
                                "21,841")
    return sorted(tars), sorted(folders)


class ClassTarRecords(MapRecords):
    """Images inside many class tars: per record its tar (an index into `tars`), name, data offset and size, all
    numpy arrays; a record is one `os.pread`. Each process opens tars itself, at most OPEN_TARS at once."""

    def __init__(self, root: Path, tars: PackedNames, tar_index: np.ndarray, names: PackedNames,
                 offsets: np.ndarray, sizes: np.ndarray, labels: np.ndarray, class_names: list[str]) -> None:
        super().__init__(labels, class_names)
        self.root, self.tars, self.names = str(root), tars, names
        self.tar_index = np.asarray(tar_index, np.int64)
        self.offsets, self.sizes = np.asarray(offsets, np.int64), np.asarray(sizes, np.int64)
        self._open: OrderedDict[int, int] = OrderedDict()
        self._pid = -1

    def _descriptor(self, tar: int) -> int:
        if self._pid != os.getpid():  # a forked worker: the parent's descriptors are not this process's to use
            self._open, self._pid = OrderedDict(), os.getpid()
        if tar in self._open:
            self._open.move_to_end(tar)
            return self._open[tar]
        if len(self._open) >= OPEN_TARS:
            os.close(self._open.popitem(last=False)[1])
        self._open[tar] = os.open(os.path.join(self.root, self.tars[tar]), os.O_RDONLY)
        return self._open[tar]

    def payload(self, index: int) -> bytes:
        size, offset = int(self.sizes[index]), int(self.offsets[index])
        if size > MAX_IMAGE_FILE_BYTES:
            raise DataError(f"image {self.name(index)} is larger than {MAX_IMAGE_FILE_BYTES} bytes; no dataset "
                            "image is")
        try:
            data = os.pread(self._descriptor(int(self.tar_index[index])), size, offset)
        except OSError as e:
            raise DataError(f"cannot read image {self.name(index)}: {type(e).__name__}: {e}") from None
        if len(data) != size:
            raise DataError(f"image {self.name(index)} is truncated: {len(data)} of {size} bytes (the tar changed?)")
        return data

    def name(self, index: int) -> str:
        return f"{os.path.join(self.root, self.tars[int(self.tar_index[index])])}:{self.names[index]}"

    def subset(self, indices: np.ndarray) -> ClassTarRecords:
        return ClassTarRecords(Path(self.root), self.tars, self.tar_index[indices], self.names.subset(indices),
                               self.offsets[indices], self.sizes[indices], self.labels[indices], self.class_names)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": OrderedDict(), "_pid": -1}

    def __del__(self) -> None:
        if self._pid == os.getpid():
            for fd in self._open.values():
                os.close(fd)


def class_tar_records(root: Path, tars: list[str], classes: list[str],
                      cache: str | Path | None) -> ClassTarRecords:
    """Every image of the class tars in `root`, labelled by its tar's class; the listing from `cache` when every tar
    is as it was listed, else one pass over each tar's headers (then cached)."""
    index = {name: i for i, name in enumerate(classes)}
    unknown = [t for t in tars if t[:-len(".tar")] not in index]
    if unknown:
        raise DataError(f"{root}: class tar {unknown[0]} is not a class of the class map; the lists must agree")
    stats = [os.stat(root / t) for t in tars]
    sizes_now = np.asarray([s.st_size for s in stats], dtype=np.int64)
    key = f"{root.resolve()}\0{classes}\0" + "\0".join(f"{t}:{s.st_size}:{s.st_mtime_ns}" for t, s in zip(
        tars, stats, strict=True))
    path = None if cache is None else index_path(cache, "class-tars", key)
    restored = None if path is None else _restore(load_index(path), root, tars, sizes_now, classes)
    if restored is not None:
        return restored
    tar_index, names, offsets, sizes, labels = [], [], [], [], []
    for position, tar in enumerate(tars):
        listing = list_tar(str(root / tar))
        images = sorted(n for n in listing.files if is_image_name(n))
        if not images:
            raise DataError(f"{root / tar} holds no images; remove it or download it again")
        for name in images:
            offset, size = listing.files[name]
            tar_index.append(position)
            names.append(listing.prefix + name)
            offsets.append(offset)
            sizes.append(size)
        labels.extend([index[tar[:-len(".tar")]]] * len(images))
    packed_tars, packed = PackedNames.pack(tars), PackedNames.pack(names)
    records = ClassTarRecords(root, packed_tars, np.asarray(tar_index), packed, np.asarray(offsets),
                              np.asarray(sizes), np.asarray(labels, dtype=np.int64), classes)
    if path is not None:
        save_index(path, {"tar_buffer": packed_tars.buffer, "tar_offsets": packed_tars.offsets,
                          "tar_index": records.tar_index, "buffer": packed.buffer, "offsets": packed.offsets,
                          "data_offsets": records.offsets, "sizes": records.sizes, "labels": records.labels})
    return records


def _restore(saved: dict[str, np.ndarray] | None, root: Path, tars: list[str], tar_sizes: np.ndarray,
             classes: list[str]) -> ClassTarRecords | None:
    """The cached listing if it is whole, its names safe, its tars today's, every member inside its tar and every
    label in range; else None (list again)."""
    try:
        tar_names = (saved["tar_buffer"], saved["tar_offsets"])
        names = (saved["buffer"], saved["offsets"])
        tar_index, offsets, sizes, labels = (saved[k] for k in ("tar_index", "data_offsets", "sizes", "labels"))
    except (KeyError, TypeError):  # TypeError: no cache (None)
        return None
    if not (safe_names(*tar_names) and safe_names(*names)) or len(tar_names[1]) - 1 != len(tars):
        return None
    packed_tars = PackedNames(*tar_names)
    if [packed_tars[i] for i in range(len(tars))] != tars:
        return None
    count = len(names[1]) - 1
    if any(a.dtype != np.int64 or len(a) != count for a in (tar_index, offsets, sizes, labels)) or not count:
        return None
    if tar_index.min() < 0 or tar_index.max() >= len(tars) or labels.min() < 0 or labels.max() >= len(classes):
        return None
    if offsets.min() < 0 or sizes.min() < 0 or np.any(offsets + sizes > tar_sizes[tar_index]):
        return None
    return ClassTarRecords(root, packed_tars, tar_index, PackedNames(*names), offsets, sizes, labels,
                           classes)

"""Records: the form every data source hands its images in, below the sources (resmlp.data.sources).

A `Source` hands out, per split, *records*: `(payload, label)` where the payload is the image exactly as
stored -- the encoded file's `bytes` (JPEG, PNG, WebP...) or, for in-memory datasets, a uint8 numpy array
(H, W) or (H, W, 3). Nothing is decoded here; consumers decode (resmlp.data.per_image, resmlp.data.device).

Record collections come in two forms, both with `class_names`:
- `MapRecords` (map-style, a torch Dataset): `records[i] -> (payload, label)`, `len(records)`, `labels` (an
  int64 array of every label, read without touching the images), `subset(indices)`, `name(i)` (the record's
  file or key, for messages). Shard it with resmlp.data.loading.samplers.ResumableSampler: its keys
  `(seed, epoch, position, index)` pick `records[index]` and seed the augmentation (sample_seed(key)), so a
  sample's augmentation is the same whatever the processes, workers or restarts.
- `StreamRecords` (WebDataset shards, streamed Hugging Face datasets): `samples(plan)`, called inside a
  DataLoader worker, yields that worker's `(key, payload, label)`; the `StreamPlan` names the epoch, seed,
  rank, workers, batch and the samples of this rank already consumed (a resume). The key is
  `(seed, epoch, global position, name)`: sample_seed(key) seeds the augmentation as for map records, and
  `name` (shard and member) names the record in messages. Shards are split across DDP ranks and DataLoader
  workers (each shard read by one worker of one rank per epoch; resmlp.data.sources.streams states the
  contract); `epoch_length(plan)` is the per-rank epoch length. A payload of type `Unreadable` is a record
  that could not be read (its text says why): skip and count it.

A record that can't be read (a missing or truncated file, a corrupt tar member) raises DataError when it is
read; consumers skip and count it (resmlp.data.loading.samplers.collate_skipping).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from resmlp.errors import ConfigError, DataError

SPLITS = ("train", "val", "test")

# The most classes a dataset's own files may declare (a class map, a folder's class folders, a shard index's or
# a Hub dataset's label names). The largest public classification label sets are well below it: ImageNet-21k
# (fall11) has 21,841 synsets (Ridnik et al. 2021, "ImageNet-21K Pretraining for the Masses", table 1),
# iNaturalist 2021 has 10,000 species (Van Horn et al. 2021). A file declaring more is malformed or hostile,
# and is refused before a model head or a label table of that size is allocated.
MAX_CLASSES = 100_000
# The longest class name (characters) a data file may declare; WordNet glosses in ImageNet's class lists
# (e.g. LOC_synset_mapping.txt) are under 200 characters.
MAX_CLASS_NAME_CHARS = 1_000
Key = tuple[int, int, int, int]  # (seed, epoch, global position, index): resmlp.data.loading.samplers
Payload = bytes | np.ndarray


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source name: its kind and argument (a folder, pattern or None)."""

    kind: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.kind if self.arg is None else f"{self.kind}:{self.arg}"


def check_class_names(names: Sequence[str], what: str) -> list[str]:
    """`names` as a list if it is a usable class list: 1..MAX_CLASSES non-empty strings of at most
    MAX_CLASS_NAME_CHARS characters, no name twice (checked with a set: linear, not quadratic). Otherwise one
    DataError line naming `what` (the file or folder the names came from) and the first offending name."""
    if len(names) > MAX_CLASSES:  # before anything is copied: a hostile list may be huge
        raise DataError(f"{what}: {len(names):,} classes, more than the {MAX_CLASSES:,} this project accepts "
                        f"(the largest public label sets have ~22k); check the file")
    names = list(names)
    if not names:
        raise DataError(f"{what}: no class names; expected at least one")
    seen: set[str] = set()
    for position, name in enumerate(names):
        if not isinstance(name, str) or not name or len(name) > MAX_CLASS_NAME_CHARS:
            shown = repr(name)[:80]
            raise DataError(f"{what}: class {position} is {shown}; expected a non-empty name of at most "
                            f"{MAX_CLASS_NAME_CHARS} characters")
        if name in seen:
            raise DataError(f"{what}: class name {name[:80]!r} appears more than once; each class must be listed "
                            f"once")
        seen.add(name)
    return names


class MapRecords(Dataset):
    """Map-style records; see the module doc. Subclasses implement `payload(i)` and `name(i)`."""

    def __init__(self, labels: np.ndarray, class_names: Sequence[str]) -> None:
        self.labels = np.asarray(labels, dtype=np.int64)
        self.class_names = list(class_names)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Payload, int]:
        return self.payload(index), int(self.labels[index])

    def payload(self, index: int) -> Payload:
        raise NotImplementedError

    def name(self, index: int) -> str:
        return f"record {index}"

    def subset(self, indices: np.ndarray) -> MapRecords:
        raise NotImplementedError


class ArrayRecords(MapRecords):
    """In-memory uint8 images (N, H, W) or (N, H, W, 3) with their labels."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, class_names: Sequence[str]) -> None:
        super().__init__(labels, class_names)
        if len(images) != len(self.labels):
            raise ValueError(f"{len(images)} images but {len(self.labels)} labels")
        self.images = images

    def payload(self, index: int) -> np.ndarray:
        return self.images[index]

    def subset(self, indices: np.ndarray) -> ArrayRecords:
        return ArrayRecords(self.images[indices], self.labels[indices], self.class_names)


class Unreadable(str):
    """The payload of a streamed record that can't be read (a corrupt tar member, a member without a label, a
    label out of range, a shard that ended early): the string says why. Consumers skip and count it."""


def skip_unreadable(what: object, why: object) -> None:
    """None, the item of a record that can't be read, after the one warning that names it and says why: every
    reader (the per-image path, the device path's workers and its decoder) skips unreadable records here."""
    warnings.warn(f"skipping unreadable image {what}: {why}", stacklevel=3)


def readable(batch: list) -> list:
    """The items of a batch that could be read (not None); DataError when none could (a dataset gone bad,
    not a few bad files). The batch's skip count is len(batch) - len(readable(batch))."""
    good = [item for item in batch if item is not None]
    if not good:
        raise DataError(f"every image of a batch ({len(batch)}) was unreadable (see the warnings above); check the "
                        "dataset files")
    return good


@dataclass
class StreamPlan:
    """What one pass over a stream is: the epoch and run seed, this rank's place, the DataLoader's workers and
    batch, the samples of this rank already consumed (`skip`, a resume), and whether it trains (shuffled,
    every worker the same number of whole batches) or evaluates (in order, every record exactly once)."""

    seed: int = 0
    epoch: int = 0
    skip: int = 0
    world_size: int = 1
    rank: int = 0
    num_workers: int = 0
    batch_size: int = 1
    train: bool = True
    repeats: int = 1  # repeated augmentation (DeiT's RASampler): each record several times, 1/repeats of them


class StreamRecords:
    """Streamed records (resmlp.data.sources.streams.ShardedRecords); see the module doc. Stateless: the pass is
    described by a StreamPlan, so a training stream and an evaluation stream over the same records coexist."""

    class_names: list[str]

    def samples(self, plan: StreamPlan) -> Iterator[tuple[Key, Payload, int]]:
        """This DataLoader worker's (key, payload, label) of the pass `plan`; call inside the worker."""
        raise NotImplementedError

    def epoch_length(self, plan: StreamPlan) -> int:
        """Samples this rank trains on in one epoch of a training plan."""
        raise NotImplementedError

    def __len__(self) -> int:
        """Records in the split (all ranks)."""
        raise NotImplementedError


Records = MapRecords | StreamRecords


class Source:
    """A dataset's splits as records. `splits` lists those it has (resmlp.data.splits decides the rest);
    `stats` names its default normalisation (resmlp.data.dataset_stats)."""

    def __init__(self, spec: SourceSpec, splits: dict[str, Any], stats: str = "imagenet") -> None:
        self.spec, self._splits, self.stats = spec, splits, stats

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(s for s in SPLITS if s in self._splits)

    def records(self, split: str) -> Records:
        """The records of `split`, built on first use (a folder is listed only when its split is read)."""
        if split not in self._splits:
            raise ValueError(f"{self.spec} has no {split} split (it has {', '.join(self.splits)})")
        made = self._splits[split]
        if callable(made):
            made = self._splits[split] = made()
        return made


def optional_module(name: str) -> Any:
    """The module `name` of the `data` extra (webdataset, datasets), or one line naming how to install it."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(f"this data source needs the {name} package: pip install 'resmlp[data]'") from None

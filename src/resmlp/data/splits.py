"""The one place that decides which records train, validate and test a run, for every source.

- The source's own val split validates when it has one (a folder's val/, synthetic's).
- Else `val_size` records are carved from train (class-stratified, seeded by `val_seed`) for validation:
  Fashion-MNIST, CIFAR, a folder without val/. Model selection never looks at the test split.
- Else (val_size 0) the test split validates, and the summary says so.
The test split is the source's test split (or `test`, given apart: data.test_dir), if any.
"""

from __future__ import annotations

from dataclasses import dataclass

from resmlp.data.arrays import stratified_split
from resmlp.data.records import MapRecords, Records, Source


@dataclass
class Splits:
    train: Records
    val: Records
    test: Records | None
    validation: str  # where the validation records come from, for summary.json


def decide_splits(source: Source, val_size: int, val_seed: int, test: Records | None = None) -> Splits:
    """The run's train, val and test records from `source` (see the module doc)."""
    has = source.splits
    if "train" not in has:
        raise ValueError(f"{source.spec} has no train split (it has {', '.join(has) or 'none'}); a run trains on one")
    train = source.records("train")
    test = test if test is not None else (source.records("test") if "test" in has else None)
    if "val" in has:
        return Splits(train, source.records("val"), test, "the dataset's val split")
    if val_size:
        if not isinstance(train, MapRecords):
            raise ValueError(f"{source.spec} has no val split, and none can be carved from a stream of records: "
                             "give the source a val split (e.g. shards named val-*.tar)")
        if not 0 < val_size < len(train):
            raise ValueError(f"data.val_size={val_size}: the validation split carved from the training set must "
                             f"be smaller than it ({len(train)} images); set --set data.val_size=N with N "
                             f"below {len(train)}, or add a val split")
        kept, held = stratified_split(train.labels, val_size, val_seed)
        return Splits(train.subset(kept), train.subset(held), test,
                      f"{val_size} images carved from train (class-stratified, seed {val_seed})")
    if test is None:
        where = (f"{source.spec.arg} has no val/ folder: add {source.spec.arg}/val/<class>/"
                 if source.spec.kind == "folder" else f"{source.spec} has no val split: add one")
        raise ValueError(f"{where} or carve a validation split from train with --set data.val_size=N")
    return Splits(train, test, test, "the test split (data.val_size 0: model selection sees the test set)")


def heldout_split(source: Source) -> str:
    """The split a trained model is scored on: test where the source has one, else val."""
    return "test" if "test" in source.splits else "val"

"""What timm's validate.py adds to an accuracy, for `resmlp eval` and resmlp.evaluation.evaluate:

- ImageNet-ReaL (Beyer et al. 2020, "Are we done with ImageNet?"): `real.json`, a list holding, for each image
  of the split in sorted file-name order (ImageNet's val files ILSVRC2012_val_00000001.JPEG...), the list of its
  valid labels. Top-k ReaL accuracy as timm's RealLabelsImagenet computes it (timm/data/real_labels.py): an
  image is right when any of its top-k predictions is one of its labels; images with no label are left out.
  timm's class reads predictions batch by batch on the host; here the top-k indices are kept on the device and
  read once at the end, so it is rewritten (and tested against timm's class).
- A valid-label subset (timm's --valid-labels, as for ImageNet-A/R's 200 classes): a file of model class
  indices, one per line; the logits are restricted to those columns, in that order, and column j is the data's
  class j.
- A per-image results file: CSV with each image's file, its label and its top-k classes and probabilities.
"""

from __future__ import annotations

import csv
import io
import json
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from resmlp.data.records import MAX_CLASSES
from resmlp.errors import ConfigError, DataError
from resmlp.fileio import atomic_write

MAX_LABEL_FILE_BYTES = 64 << 20  # ImageNet-ReaL's real.json is under 1 MB
REAL_TOPK = (1, 5)  # timm's RealLabelsImagenet default
MAX_TOPK = 100  # classes per image in the results file


def read_real_labels(path: str | Path) -> list[list[int]]:
    """real.json: a JSON list of lists of class indices, one per image (ImageNet-ReaL's file)."""
    value = _read_json(path, "--real-labels")
    if not isinstance(value, list) or not all(
            isinstance(labels, list) and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c < MAX_CLASSES
                                             for c in labels) for labels in value):
        raise DataError(f"--real-labels {path}: expected a JSON list with, per image, a list of class indices "
                        f"(from 0, below {MAX_CLASSES:,}: ImageNet-ReaL's real.json)")
    if value and not any(value):
        raise DataError(f"--real-labels {path}: none of its {len(value):,} images has a valid label, so there is no "
                        "ReaL score to give; name ImageNet-ReaL's real.json")
    return value


def read_valid_labels(path: str | Path) -> list[int]:
    """A class-index file (timm's --valid-labels, e.g. ImageNet-A's or -R's 200 indices): one integer a line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--valid-labels {path} does not exist; name a file of class indices, one per line")
    _check_size(path, "--valid-labels")
    lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    if not lines or not all(line.isdigit() for line in lines):
        bad = next((line for line in lines if not line.isdigit()), "(empty)")
        raise DataError(f"--valid-labels {path}: expected one class index (a non-negative integer) per line, got "
                        f"{bad[:40]!r}")
    indices = [int(line) for line in lines]
    if len(set(indices)) != len(indices):
        raise DataError(f"--valid-labels {path}: a class index appears twice; list each class once")
    return indices


def check_valid_labels(indices: Sequence[int], model_classes: int, data_classes: int, path: str | Path) -> None:
    """The subset fits the model (indices below its class count) and the data (one index per data class)."""
    if max(indices) >= model_classes:
        raise DataError(f"--valid-labels {path}: index {max(indices)} but the model predicts {model_classes} "
                        "classes")
    if len(indices) != data_classes:
        raise DataError(f"--valid-labels {path}: {len(indices)} classes but the data has {data_classes}; the file "
                        "names one model class per data class, in the data's class order")


class ValidLabels(nn.Module):
    """The model with its logits restricted to `indices` (timm validate.py's `output[:, valid_labels]`)."""

    def __init__(self, model: nn.Module, indices: Sequence[int]) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("indices", torch.tensor(list(indices), dtype=torch.long), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images).index_select(1, self.indices)


class TopKRecorder(nn.Module):
    """The model, recording each batch's top-k class indices and softmax probabilities on the device (read once,
    by `read`, after the evaluation)."""

    def __init__(self, model: nn.Module, k: int) -> None:
        super().__init__()
        self.model, self.k = model, k
        self.indices: list[torch.Tensor] = []
        self.probs: list[torch.Tensor] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        logits = self.model(images)
        probs, indices = logits.float().softmax(dim=1).topk(min(self.k, logits.shape[1]), dim=1)
        self.indices.append(indices)
        self.probs.append(probs)
        return logits

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """(indices, probabilities), each (images, k), in the order the images were evaluated: one copy from the
        device (float64 holds the class indices exactly)."""
        both = torch.cat([torch.cat(self.indices).double(), torch.cat(self.probs).double()], dim=1).cpu().numpy()
        k = both.shape[1] // 2
        return both[:, :k].astype(np.int64), both[:, k:].astype(np.float32)


VAL_NUMBER = re.compile(r"ILSVRC2012_val_(\d{8})\b")  # ImageNet's val file names, the numbers real.json follows


def real_order(names: Sequence[str], path: str | Path = "real.json") -> np.ndarray:
    """For each of real.json's entries, the dataset index of its image: by the number in the file name
    (ILSVRC2012_val_%08d, entry number - 1, as timm's RealLabelsImagenet matches them) where every name carries
    one, else the files sorted by file name. DataError when the numbers are not each entry once."""
    numbers = [VAL_NUMBER.search(Path(name).name) for name in names]
    if not names or not all(numbers):
        return np.argsort([Path(name).name for name in names], kind="stable")
    entry = np.asarray([int(m.group(1)) - 1 for m in numbers], dtype=np.int64)
    order = np.full(len(names), -1, dtype=np.int64)
    inside = (entry >= 0) & (entry < len(names))
    order[entry[inside]] = np.nonzero(inside)[0]
    if not inside.all() or (order < 0).any():
        bad = next((Path(n).name for n, ok in zip(names, inside, strict=True) if not ok), None)
        raise DataError(f"--real-labels {path} has an entry per image ILSVRC2012_val_00000001 to _{len(names):08d}, "
                        f"but the split's file names " + (f"include {bad}" if bad else "repeat a number") +
                        "; evaluate ImageNet's val split as it ships, named by its numbers")
    return order


def real_accuracy(top: np.ndarray, labels_per_image: Sequence[Sequence[int]], num_classes: int,
                  path: str | Path) -> dict[str, float | None]:
    """Top-1 and top-5 ReaL accuracy (percent) of `top` (images, k) predictions, with labels_per_image in the
    same image order; top-5 None where fewer than 6 classes (as the project's top-5)."""
    if len(labels_per_image) != len(top):
        raise DataError(f"--real-labels {path} lists {len(labels_per_image)} images but the split has {len(top)}; "
                        "the file has one entry per image of the split")
    rows = np.repeat(np.arange(len(top)), [len(labels) for labels in labels_per_image])
    cols = np.fromiter((c for labels in labels_per_image for c in labels), dtype=np.int64, count=len(rows))
    if len(cols) and cols.max() >= num_classes:
        raise DataError(f"--real-labels {path}: class {cols.max()} but the model predicts {num_classes} classes")
    # per (image, valid label) pair, where it stands in the image's top-k: images x k cells, never images x classes
    hits = np.zeros(top.shape, dtype=bool)
    np.logical_or.at(hits, rows, top[rows] == cols[:, None])
    scored = np.asarray([bool(labels) for labels in labels_per_image], dtype=bool)  # no label: left out
    n = max(int(scored.sum()), 1)
    return {f"real_top{k}": (100.0 * float(hits[scored, :k].any(axis=1).sum()) / n
                             if k < num_classes or k == 1 else None) for k in REAL_TOPK}


def write_results(path: str | Path, files: Sequence[str], labels: Sequence[str], top: np.ndarray,
                  probs: np.ndarray, class_names: Sequence[str]) -> Path:
    """The per-image CSV: file, label, class_1, prob_1, ... class_k, prob_k (most probable first)."""
    text = io.StringIO()
    writer = csv.writer(text)
    k = top.shape[1]
    writer.writerow(["file", "label", *[f"{column}_{i}" for i in range(1, k + 1) for column in ("class", "prob")]])
    for file, label, indices, row_probs in zip(files, labels, top, probs, strict=True):
        writer.writerow([file, label, *[value for c, p in zip(indices, row_probs, strict=True)
                                        for value in (class_names[c], f"{p:.6f}")]])
    return atomic_write(path, lambda tmp: tmp.write_text(text.getvalue()))


def _read_json(path: str | Path, flag: str):
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{flag} {path} does not exist; name ImageNet-ReaL's real.json")
    _check_size(path, flag)
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:
        raise DataError(f"{flag} {path} is not valid JSON ({type(e).__name__}); expected ImageNet-ReaL's "
                        "real.json") from None


def _check_size(path: Path, flag: str) -> None:
    if path.stat().st_size > MAX_LABEL_FILE_BYTES:
        raise DataError(f"{flag} {path}: {path.stat().st_size} bytes, more than {MAX_LABEL_FILE_BYTES}; a label "
                        "file is small")


@dataclass
class EvalExtras:
    """The extras one evaluation asks for (each None: not asked), read and checked before the model is loaded."""

    real_labels: Path | None = None
    valid_labels: Path | None = None
    results: Path | None = None
    topk: int = 5  # classes per image in the results file
    real: list[list[int]] | None = None
    valid: list[int] | None = None
    recorder: TopKRecorder | None = None

    @classmethod
    def read(cls, real_labels: str | Path | None = None, valid_labels: str | Path | None = None,
             results: str | Path | None = None, topk: int = 5) -> EvalExtras:
        if not 1 <= topk <= MAX_TOPK:
            raise ConfigError(f"--topk {topk}: give 1 to {MAX_TOPK} classes per image")
        return cls(real_labels and Path(real_labels), valid_labels and Path(valid_labels), results and Path(results),
                   topk, read_real_labels(real_labels) if real_labels else None,
                   read_valid_labels(valid_labels) if valid_labels else None)

    @property
    def per_image(self) -> bool:
        """Whether an extra pairs each image with its predictions (ReaL, the results file)."""
        return self.real is not None or self.results is not None

    def check_valid(self, model_classes: int, data_classes: int) -> None:
        """The subset fits the model and the data (before any image is read)."""
        check_valid_labels(self.valid, model_classes, data_classes, self.valid_labels)

    def wrap(self, model: nn.Module) -> nn.Module:
        """The model as evaluated: restricted to the subset, its top-k recorded where a per-image extra asks."""
        if self.valid is not None:
            model = ValidLabels(model, self.valid)
        if self.per_image:
            model = self.recorder = TopKRecorder(model, max(self.topk, max(REAL_TOPK) if self.real else 1))
        return model

    def finish(self, files: Sequence[str] | None, labels: Sequence[int], class_names: Sequence[str],
               model_classes: int, skipped: int) -> dict[str, object]:
        """The summary's extra entries (ReaL scores, the results file) once every batch was evaluated. files:
        each image's file (None where the data has no per-image names: a stream)."""
        if self.recorder is None:
            raise ValueError("EvalExtras.finish before wrap: no predictions were recorded")
        if files is None or skipped:
            why = f"{skipped} unreadable images were skipped" if skipped else "streamed data has no image order"
            raise DataError(f"--real-labels and --results pair each image with its row, but {why}; evaluate a "
                            "folder whose images all read")
        top, probs = self.recorder.read()
        out: dict[str, object] = {}
        if self.real is not None:
            model_top = np.asarray(self.valid)[top] if self.valid is not None else top  # real.json's indices
            if len(self.real) != len(files):
                raise DataError(f"--real-labels {self.real_labels} lists {len(self.real)} images but the split has "
                                f"{len(files)}; the file has one entry per image of the split")
            per_image: list[list[int]] = [[] for _ in files]
            for entry, index in zip(self.real, real_order(files, self.real_labels), strict=True):
                per_image[index] = entry
            out.update(real_accuracy(model_top[:, :max(REAL_TOPK)], per_image, model_classes, self.real_labels))
            left_out = sum(not labels for labels in per_image)
            out["real_left_out"] = left_out  # images without a valid label: not in the ReaL scores (timm's rule)
            if left_out:
                warnings.warn(f"ImageNet-ReaL: {left_out:,} of {len(per_image):,} images have no valid label in "
                              f"{self.real_labels} and are left out of the ReaL scores (as timm does)", stacklevel=2)
        if self.results is not None:
            k = min(self.topk, top.shape[1])
            out["results"] = str(write_results(self.results, files, [class_names[i] for i in labels], top[:, :k],
                                               probs[:, :k], class_names).resolve())
        return out

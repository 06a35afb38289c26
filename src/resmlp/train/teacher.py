"""Distillation teachers: built from the model grammar, checked to predict the data's classes in the data's order,
and fed their own preprocessing.

Class order: logit i of the teacher is taken as the data's class i, so the teacher's class names must be the
data's, in order. They are read from the teacher's checkpoint, or from the weights file of a timm:/torchvision:
teacher, stored as a list, a string (JSON, or one name per line / comma-separated), or a dict (index -> name, or
timm's and torchvision's class_to_idx, name -> index). A teacher whose order cannot be read is refused unless the
user vouches for it (`distill.classes_match`, `--teacher-classes-match`); a random teacher has no order to check.

Preprocessing: a teacher whose checkpoint records its own (resolution, mean, std) gets the student's batch
un-normalised, resized to its resolution and normalised with its statistics, on the batch's device
(`TeacherInput`); its accuracy in summary.json is measured as `resmlp eval` measures it, with its own evaluation
transform. A teacher that records none is fed the student's batch as it is, and the run says so.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from resmlp.build import build_model, parse_model_name
from resmlp.preprocess import Preprocess

log = logging.getLogger("resmlp.train")


def load_teacher(spec: str, num_classes: int, in_chans: int, weights: str | None = None,
                 allow_random: bool = False) -> nn.Module:
    """A teacher in the model grammar: a checkpoint file, or timm:NAME / torchvision:NAME with a weights file
    (without one only when `allow_random`: a random teacher teaches nothing, so it must be asked for)."""
    name = parse_model_name(spec)
    if name.kind == "preset":
        raise ValueError(f"distill.teacher {spec!r} is an untrained preset; name a checkpoint file, or timm:NAME / "
                         "torchvision:NAME with --teacher-weights")
    if name.kind in ("timm", "torchvision") and weights is None and not allow_random:
        raise ValueError(f"distill.teacher {spec} has no weights: pass --teacher-weights FILE (distill.weights), or "
                         "--allow-random-teacher (distill.allow_random_teacher) to distil from random weights")
    try:
        return build_model(name, num_classes=num_classes, in_chans=in_chans if name.kind != "file" else None,
                           weights=weights)
    except ValueError as e:
        raise ValueError(f"distill.teacher: {e}; a teacher must predict the dataset's {num_classes} classes") from None


def check_teacher(teacher: nn.Module, spec: str, num_classes: int, in_chans: int, img_size: int,
                  device: torch.device) -> None:
    """One forward on a dummy batch: the teacher takes the data's images and predicts its classes."""
    with torch.no_grad():
        try:
            out = teacher(torch.zeros(2, in_chans, img_size, img_size, device=device))
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"distillation teacher {spec} cannot take {in_chans}x{img_size}x{img_size} images: "
                             f"{e}") from None
    if out.ndim != 2 or out.shape[1] != num_classes:
        raise ValueError(f"distillation teacher {spec} predicts {out.shape[-1]} classes but the dataset has "
                         f"{num_classes}; distil from a teacher trained on this dataset")


# ------------------------------------------------------------------------------------------ what its file records
def teacher_file(spec: str, weights: str | None) -> str | None:
    """The file that holds the teacher's weights (and so its records): its checkpoint, or its weights file."""
    name = parse_model_name(spec)
    return name.name if name.kind == "file" else weights  # a run folder: its best.safetensors


def file_metadata(path: str | Path) -> dict[str, Any]:
    """What a weights file records beside its tensors: our `extra` metadata, or the top-level entries of a torch
    file (a training script's class_names / class_to_idx). {} where it records nothing readable."""
    from resmlp.checkpoint import read_header
    from resmlp.checkpoint_reader import read_torch_file
    from resmlp.errors import CheckpointError

    try:
        if str(path).endswith(".safetensors"):
            return read_header(path).get("extra", {})
        obj = read_torch_file(path)
    except (CheckpointError, OSError, ValueError):
        return {}
    if not isinstance(obj, dict):
        return {}
    extra = obj.get("extra") if isinstance(obj.get("extra"), dict) else {}
    return {**{k: obj[k] for k in ("class_names", "class_to_idx") if k in obj}, **extra}


def stored_class_names(value: Any) -> list[str] | None:
    """Class names in logit order from what a file stores; None where no order can be read from it."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = None
        if isinstance(decoded, (list, dict)):
            return stored_class_names(decoded)
        separator = "\n" if "\n" in value else ","
        names = [n.strip() for n in value.strip().split(separator)]
        return names if all(names) else None
    if isinstance(value, (list, tuple)):
        return [str(n) for n in value] if all(isinstance(n, (str, int)) for n in value) else None
    if isinstance(value, dict) and value:
        keys, values = list(value), list(value.values())
        if all(_is_index(k) for k in keys) and all(isinstance(v, str) for v in values):  # index -> name
            order = {int(k): v for k, v in value.items()}
        elif all(isinstance(k, str) for k in keys) and all(_is_index(v) for v in values):  # name -> index
            order = {int(v): k for k, v in value.items()}
        else:
            return None
        return [order[i] for i in range(len(order))] if sorted(order) == list(range(len(value))) else None
    return None


def _is_index(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value.isdigit())


def check_teacher_classes(spec: str, weights: str | None, class_names: list[str], vouched: bool = False,
                          random: bool = False) -> None:
    """The teacher's logit i must mean the data's class i: its recorded class names are the data's, in order.

    `vouched` (distill.classes_match): the user says the order is the data's; it admits a teacher that records
    no order or other names, never one that records the data's classes in another order."""
    if random:  # random weights: no order to check
        return
    source = teacher_file(spec, weights)
    meta = file_metadata(source) if source else {}
    stored = meta.get("class_names", meta.get("class_to_idx"))
    theirs = stored_class_names(stored) if stored is not None else None
    if theirs is None:
        if vouched:
            return
        found = ("records no class names" if stored is None else
                 f"records class names in a form not read ({stored!r:.60})")
        where = f" ({source})" if source and source != spec else ""
        raise ValueError(f"distillation teacher {spec}{where} {found}, so "
                         "its logit order is unknown; if its logit i is the data's class i (the data's classes "
                         f"{', '.join(class_names[:5])}{' ...' if len(class_names) > 5 else ''}), add "
                         "--teacher-classes-match (distill.classes_match=true)")
    if theirs == list(class_names):
        return
    reordered = sorted(theirs) == sorted(class_names)
    if vouched and not reordered:
        return
    how = "the same classes in another order" if reordered else "other classes"
    raise ValueError(f"distillation teacher {spec} was trained on {how} ({', '.join(theirs[:5])}"
                     f"{' ...' if len(theirs) > 5 else ''}) than the data's ({', '.join(class_names[:5])}"
                     f"{' ...' if len(class_names) > 5 else ''}); its logit i must mean the data's class i: "
                     "distil from a teacher trained on this dataset"
                     + ("" if reordered else " (or add --teacher-classes-match if only the names differ)"))


# ------------------------------------------------------------------------------------------ its preprocessing
def teacher_preprocess(spec: str, weights: str | None, teacher: nn.Module, dataset: str | None) -> Preprocess | None:
    """The teacher's own evaluation preprocessing as `resmlp eval` reads it (the checkpoint's metadata, else the
    dataset's statistics at the model's size for a ResMLP file); None where its file records none."""
    source = teacher_file(spec, weights)
    if source is None:
        return None
    meta = file_metadata(source)
    try:
        if parse_model_name(spec).kind == "file":
            return Preprocess.from_metadata(meta, teacher, dataset=dataset)
        if meta.get("preprocess"):
            made = Preprocess._from_fields(meta["preprocess"])
            made.check()
            return made
    except ValueError:
        return None
    return None


def same_input(a: Preprocess, b: Preprocess) -> bool:
    """The same pixels in: resolution and normalisation (the crop only matters to evaluation)."""
    return (a.img_size, tuple(a.mean), tuple(a.std)) == (b.img_size, tuple(b.mean), tuple(b.std))


class TeacherInput(nn.Module):
    """A teacher fed from the student's normalised batch: un-normalised, resized to the teacher's resolution with
    its interpolation (antialiased, as PIL resizes), normalised with its statistics; all on the batch's device."""

    def __init__(self, teacher: nn.Module, student: Preprocess, own: Preprocess) -> None:
        super().__init__()
        self.teacher, self.size = teacher, own.img_size
        self.mode = own.interpolation
        for name, values in (("student_mean", student.mean), ("student_std", student.std), ("mean", own.mean),
                             ("std", own.std)):
            self.register_buffer(name, torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        pixels = images.float() * self.student_std + self.student_mean
        if pixels.shape[-2:] != (self.size, self.size):
            smooth = self.mode != "nearest"
            pixels = F.interpolate(pixels, size=(self.size, self.size), mode=self.mode, antialias=smooth,
                                   **({"align_corners": False} if smooth else {}))
        return self.teacher((pixels - self.mean) / self.std)

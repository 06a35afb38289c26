"""A checkpoint history: the N best epochs' checkpoints of a run, as timm's `--checkpoint-hist N` keeps them.

RUN/checkpoint-EPOCH.safetensors holds an epoch's evaluated weights (with the metadata best.safetensors has);
RUN/checkpoints.json lists the kept ones, best first, and is the only truth about them. Each epoch, in an
order a crash at any point leaves consistent: (1) the new checkpoint is written atomically, (2) the list is
rewritten atomically, (3) the files the list no longer names are deleted. A crash after (1) leaves a file the
list does not name, after (2) files it no longer names: either is deleted at the next epoch; the list never
names a file that is not there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn

from resmlp.checkpoint import save
from resmlp.fileio import read_json_object, write_json

INDEX = "checkpoints.json"
FILE_NAME = re.compile(r"checkpoint-[0-9]+\.safetensors")


def checkpoint_name(epoch: int) -> str:
    return f"checkpoint-{epoch}.safetensors"


def kept_checkpoints(out: str | Path) -> list[dict[str, Any]]:
    """The history's entries (epoch, score, file), best first; [] before its first write."""
    index = Path(out) / INDEX
    if not index.is_file():
        return []
    entries = read_json_object(index, "checkpoint history").get("checkpoints")
    return [e for e in entries if isinstance(e, dict) and FILE_NAME.fullmatch(str(e.get("file")))] \
        if isinstance(entries, list) else []


def keep_best(out: str | Path, keep: int, model: nn.Module, metadata: dict[str, Any], epoch: int,
              score: float) -> list[dict[str, Any]]:
    """Add epoch `epoch` (validation score `score`) to the history of the `keep` best, writing its checkpoint if
    it is among them; returns the kept entries, best first. A redone epoch (after a resume) replaces its entry."""
    out = Path(out)
    entries = [e for e in kept_checkpoints(out) if e["epoch"] < epoch]
    ranked = sorted(entries, key=lambda e: -e["score"])  # ties: the earlier epoch stays first (stable sort)
    if len(ranked) < keep or score > ranked[keep - 1]["score"]:
        entry = dict(epoch=epoch, score=score, file=checkpoint_name(epoch))
        save(model, out / entry["file"], metadata)  # (1)
        ranked = sorted([*ranked, entry], key=lambda e: -e["score"])
    ranked = ranked[:keep]
    write_json(out / INDEX, dict(keep=keep, metric="the task's validation score (val_top1; DINO: knn_top1)",
                                 checkpoints=ranked))  # (2)
    named = {e["file"] for e in ranked}
    for path in out.iterdir():  # (3) dropped entries, and files a crash left before (2)
        if FILE_NAME.fullmatch(path.name) and path.name not in named:
            path.unlink(missing_ok=True)
    return ranked

"""A checkpoint history: the N best epochs' checkpoints of a run, as timm's `--checkpoint-hist N` keeps them.

RUN/checkpoint-EPOCH.safetensors holds an epoch's evaluated weights (with the metadata best.safetensors has);
RUN/checkpoints.json lists the kept ones, best first, and is the only truth about them. Each epoch, in an
order a crash at any point leaves consistent: (1) the new checkpoint is written atomically, (2) the list is
rewritten atomically, (3) the files the list no longer names are deleted. A crash after (1) leaves a file the
list does not name, after (2) files it no longer names: either is deleted at the next epoch; the list never
names a file that is not there.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from torch import nn

from resmlp.checkpoint import save
from resmlp.errors import CheckpointError
from resmlp.fileio import read_json_object, write_json

INDEX = "checkpoints.json"
FILE_NAME = re.compile(r"checkpoint-[0-9]+\.safetensors")


def checkpoint_name(epoch: int) -> str:
    return f"checkpoint-{epoch}.safetensors"


def kept_checkpoints(out: str | Path) -> list[dict[str, Any]]:
    """The history's entries (epoch, score, file), best first; [] before its first write. An entry this package
    would not have written (a missing epoch, a string or NaN score, a file not named after its epoch) is refused
    in one line: the list decides which files are deleted, so a guess could delete the best checkpoint."""
    index = Path(out) / INDEX
    if not index.is_file():
        return []
    entries = read_json_object(index, "checkpoint history").get("checkpoints")
    if not isinstance(entries, list):
        raise CheckpointError(f"{index}: expected a list under \"checkpoints\"; delete the file to start the "
                              "history again (the checkpoint files stay until the next epoch replaces them)")
    return [_checked_entry(entry, index, i) for i, entry in enumerate(entries)]


def _checked_entry(entry: Any, index: Path, position: int) -> dict[str, Any]:
    epoch = entry.get("epoch") if isinstance(entry, dict) else None
    score = entry.get("score") if isinstance(entry, dict) else None
    if not (type(epoch) is int and epoch >= 0 and type(score) in (int, float) and math.isfinite(score)
            and entry.get("file") == checkpoint_name(epoch)):
        raise CheckpointError(f"{index}: entry {position} ({str(entry)[:80]}) is not {{\"epoch\": N, \"score\": "
                              "a finite number, \"file\": \"checkpoint-N.safetensors\"}; fix it or delete the file")
    return dict(epoch=epoch, score=float(score), file=entry["file"])


def keep_best(out: str | Path, keep: int, model: nn.Module, metadata: dict[str, Any], epoch: int,
              score: float) -> list[dict[str, Any]]:
    """Add epoch `epoch` (validation score `score`) to the history of the `keep` best, writing its checkpoint if
    it is among them; returns the kept entries, best first. A redone epoch (after a resume) replaces its entry."""
    out = Path(out)
    entries = [e for e in kept_checkpoints(out) if e["epoch"] < epoch]
    ranked = sorted(entries, key=lambda e: -e["score"])  # ties: the earlier epoch stays first (stable sort)
    # a non-finite score (a diverged run) ranks below every kept one and is never kept: NaN compares false
    # against everything, and JSON has no NaN for the list
    if math.isfinite(score) and (len(ranked) < keep or score > ranked[keep - 1]["score"]):
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

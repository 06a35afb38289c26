"""Checkpoint averaging, as fairseq's scripts/average_checkpoints.py: the element-wise mean of the model parameters
of the last N checkpoints of a run.

Ott et al. (the setup paper section 3.6 follows) evaluate averaged checkpoints, as Vaswani et al. did ("for the base
models, we used a single model obtained by averaging the last 5 checkpoints", section 6.1). A run with
`--average-last N` keeps the weights of its last N checkpoints as ``checkpoint_STEP.pt`` beside ``checkpoint.pt``
(older ones are deleted as new ones are written, so the folder holds at most N), and decodes its test split with
their mean; `resmlp translate average RUN --last N` writes that mean as ``checkpoint_avgN.pt``, which `translate
eval` and `decode` read like ``checkpoint.pt``.

Differences from fairseq, and why: the kept checkpoints hold the model only (fairseq keeps full ones: here the
resumable state is ``checkpoint.pt``, so N copies of the optimizer's state would only take disk); the sum is
accumulated in float64 and the mean stored in the parameters' dtype (fairseq sums in float32), so the mean does
not depend on the order of the files.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from resmlp.errors import CheckpointError
from resmlp.fileio import atomic_write
from resmlp.seq2seq.runfolder import checkpoint_model_config, read_translation_checkpoint

# fairseq names update checkpoints checkpoint_EPOCH_UPDATE.pt; a step is an update here. Only the name
# keep_checkpoint writes (no leading zero, ASCII digits): checkpoint_06.pt beside checkpoint_6.pt is not a second
# checkpoint of step 6, and \d would take non-ASCII digits int() reads as another step
KEPT = re.compile(r"checkpoint_(0|[1-9][0-9]{0,14})\.pt")


def kept_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """The (step, path) of the kept checkpoints of a run folder, oldest first (regular files only)."""
    run_dir = Path(run_dir)
    found = []
    for path in run_dir.iterdir() if run_dir.is_dir() else ():
        match = KEPT.fullmatch(path.name)
        if match and path.is_file() and not path.is_symlink():
            found.append((int(match.group(1)), path))
    return sorted(found)


def keep_checkpoint(run_dir: Path, model: torch.nn.Module, step: int, keep: int) -> None:
    """Write the model's weights as checkpoint_STEP.pt (atomically), then delete all but the last `keep`."""
    state = {"model": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
             "model_config": model.config.to_dict(), "step": step}
    atomic_write(run_dir / f"checkpoint_{step}.pt", lambda p: torch.save(state, p))
    for _, path in kept_checkpoints(run_dir)[:-keep]:
        path.unlink(missing_ok=True)


def drop_checkpoints_after(run_dir: Path, step: int) -> None:
    """A resume from `step` drops what a killed run kept after it: the resumed run writes those steps again."""
    for kept_step, path in kept_checkpoints(run_dir):
        if kept_step > step:
            path.unlink(missing_ok=True)


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of state dicts with the same names and shapes, in the first one's dtypes."""
    names = list(states[0])
    for state in states[1:]:
        if list(state) != names or any(state[k].shape != states[0][k].shape for k in names):
            raise CheckpointError("the checkpoints hold different models (names or shapes differ); they cannot be "
                                  "averaged")
    return {k: (sum(s[k].double() for s in states) / len(states)).to(states[0][k].dtype) for k in names}


def average_last(run_dir: str | Path, last: int, at_most: bool = False) -> dict[str, Any]:
    """A checkpoint whose model is the mean of the run's last `last` kept checkpoints (fewer with `at_most`, as
    many as there are), `averaged_steps` naming them; refused when they describe different models."""
    kept = kept_checkpoints(run_dir)[-last:]
    if not kept or (len(kept) < last and not at_most):
        raise CheckpointError(f"{run_dir} keeps {len(kept)} checkpoints (checkpoint_STEP.pt), fewer than --last "
                              f"{last}: train it with --average-last {last} or more, or average fewer")
    ckpts = [read_translation_checkpoint(path) for _, path in kept]
    configs = [checkpoint_model_config(c, path) for c, (_, path) in zip(ckpts, kept, strict=True)]
    if any(c != configs[0] for c in configs):
        raise CheckpointError(f"the checkpoints of {run_dir} describe different models; they cannot be averaged")
    return {"model": average_state_dicts([c["model"] for c in ckpts]), "model_config": configs[0].to_dict(),
            "step": kept[-1][0], "averaged_steps": [step for step, _ in kept]}


def write_average(run_dir: str | Path, last: int, at_most: bool = False) -> tuple[Path, dict[str, Any]]:
    """The averaged checkpoint written (atomically) as RUN/checkpoint_avgN.pt, beside the run's tokenizer."""
    averaged = average_last(run_dir, last, at_most)
    path = Path(run_dir) / f"checkpoint_avg{last}.pt"
    atomic_write(path, lambda p: torch.save(averaged, p))
    return path, averaged

"""The resumable training state (DIR/last.pth): everything needed to continue bit-for-bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from resmlp.checkpoint import torch_load
from resmlp.fileio import atomic_write

STATE_FILE = "last.pth"
STATE_VERSION = 2  # 2: task state under "task", the schedule rebuilt from the config
# what a resume may change: where and how fast it runs, how long (more epochs extend a finished run), the
# learning rate (lowered after a non-finite loss), and logging
RESUMABLE_CHANGES = ("schedule.epochs", "optim.lr", "train.device", "train.threads", "train.progress",
                     "train.checkpoint_every_steps", "train.deterministic", "data.num_workers", "data.dir")


def save_state(path: str | Path, state: dict[str, Any]) -> Path:
    """Write the training state atomically: a kill during the write leaves the previous file intact."""
    return atomic_write(path, lambda tmp: torch.save({"version": STATE_VERSION, **state}, tmp))


def load_state(path: str | Path) -> dict[str, Any]:
    """Read a training state written by save_state (weights_only=True: no code runs on load)."""
    state = torch_load(path)
    if not isinstance(state, dict) or "version" not in state:
        raise ValueError(f"{path} is not a resmlp training state (expected a file written by resmlp train); "
                         "to start from model weights instead fine-tune it (resmlp finetune)")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"{path} was written by another version of resmlp (state version {state['version']}, this "
                         f"one reads {STATE_VERSION}); finish it with that version or fine-tune from its weights")
    return state


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict) and key != "model":
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_resumable(path: str | Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse a resume whose config differs from the saved run's beyond RESUMABLE_CHANGES, naming every
    differing key with its old and new value."""
    old, new = _flatten(saved), _flatten(now)
    changed = [key for key in sorted(old.keys() | new.keys())
               if key != "recipe" and old.get(key) != new.get(key) and key not in RESUMABLE_CHANGES]
    if changed:
        lines = [f"  {key}: was {old.get(key)!r}, now {new.get(key)!r}" for key in changed]
        raise ValueError(f"{path} was trained with different settings:\n" + "\n".join(lines) + "\nresume with the "
                         f"same recipe and overrides; only {', '.join(RESUMABLE_CHANGES)} may change")
    if new["schedule.epochs"] < old["schedule.epochs"]:
        raise ValueError(f"--epochs {new['schedule.epochs']} is fewer than the run's {old['schedule.epochs']}; a "
                         "resume can extend a run, not shorten it")

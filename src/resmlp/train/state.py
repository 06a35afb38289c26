"""The resumable training state (DIR/last.pth): everything needed to continue bit-for-bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from resmlp.checkpoint import atomic_write, torch_load

STATE_FILE = "last.pth"
STATE_VERSION = 1


def save_state(path: str | Path, state: dict[str, Any]) -> Path:
    """Write the training state atomically: a kill during the write leaves the previous file intact."""
    return atomic_write(path, lambda tmp: torch.save({"version": STATE_VERSION, **state}, tmp))


def load_state(path: str | Path) -> dict[str, Any]:
    """Read a training state written by save_state (weights_only=True: no code runs on load)."""
    state = torch_load(path)
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"{path} is not a resmlp training state (expected a file written by resmlp train); "
                         "to start from model weights instead use model.checkpoint_path / fine-tuning")
    return state

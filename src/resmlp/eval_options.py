"""timm validate.py's model options of `resmlp eval`: --use-ema, --img-size, --interpolation, --torchcompile.

- use_ema: the checkpoint's weight EMA. timm's train.py keeps it as `state_dict_ema`, DeiT's main.py as
  `model_ema`, this project's training state (last.pth) as `ema`; a run of this project that kept an EMA
  (train.ema, --model-ema) saves the EMA itself as best/last.safetensors (resmlp.train.tasks model_to_save), so
  those files are used as they are, and a run without one is refused in one line.
- img_size: evaluate at another input size: the model is moved there (ResMLP's and timm's set_input_size resize
  the weights tied to the grid; convnets take any size) and the preprocessing resizes to it.
- interpolation: the evaluation resize's filter instead of the file's.
- torchcompile: torch.compile the model (timm's --torchcompile [BACKEND], inductor by default).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from resmlp.errors import CheckpointError

# where each code base's training checkpoint keeps its weight EMA: timm's train.py, DeiT's main.py, ours (last.pth)
EMA_KEYS = ("state_dict_ema", "model_ema", "ema")


def ema_checkpoint_key(path: str | Path) -> str | None:
    """--use-ema: the entry of torch file `path` that holds the EMA, or None where `path` is itself the EMA (a
    .safetensors of a run that kept one); a CheckpointError (one line) where there is none."""
    from resmlp.fileio import read_json_object

    path = Path(path)
    if path.suffix == ".safetensors":
        config = path.parent / "config.json"
        train = read_json_object(config, "run config").get("train", {}) if config.is_file() else None
        if isinstance(train, dict) and train.get("ema") is True:
            return None  # the run saved its EMA as its checkpoints
        why = ("its run kept no EMA (train.ema: false), so it holds the raw weights; train with --model-ema to keep "
               "one" if train is not None else "no run config.json beside it says its weights are an EMA")
        raise CheckpointError(f"--use-ema: {path} holds no weight EMA: {why}")
    from resmlp.checkpoint_reader import read_torch_file

    obj = read_torch_file(path)
    for key in EMA_KEYS:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict) and obj[key]:
            return key
    has = sorted(map(str, obj))[:8] if isinstance(obj, dict) else type(obj).__name__
    raise CheckpointError(f"--use-ema: {path} has no EMA entry ({', '.join(EMA_KEYS)}; it has {has})")


def apply_model_options(loaded: Any, img_size: int | None = None, interpolation: str | None = None,
                        torchcompile: str | None = None) -> None:
    """--img-size, --interpolation and --torchcompile on a resmlp.inference.LoadedModel, in place; its
    preprocessing note says what was changed."""
    pre, notes = loaded.preprocess, []
    if img_size is not None and img_size != pre.img_size:
        if img_size < 1:
            raise ValueError(f"--img-size {img_size}: expected a positive size")
        if hasattr(loaded.model, "set_input_size"):
            try:
                loaded.model.set_input_size(img_size=img_size)
            except (ValueError, TypeError, AssertionError) as e:
                raise ValueError(f"--img-size {img_size}: the model cannot take it ({' '.join(str(e).split())})"
                                 ) from None
        notes.append(f"input {img_size} px (--img-size) instead of {pre.img_size}")
        pre = replace(pre, img_size=img_size)
    if interpolation is not None and interpolation != pre.interpolation:
        from resmlp.preprocess import INTERPOLATIONS

        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"--interpolation {interpolation!r}: use one of {', '.join(INTERPOLATIONS)}")
        notes.append(f"{interpolation} resize (--interpolation) instead of {pre.interpolation}")
        pre = replace(pre, interpolation=interpolation)
    if notes:
        pre = replace(pre, note="; ".join(filter(None, [pre.note, "preprocessing: " + ", ".join(notes)])))
    loaded.preprocess = pre
    if torchcompile:
        import torch

        loaded.model = torch.compile(loaded.model, backend=torchcompile)

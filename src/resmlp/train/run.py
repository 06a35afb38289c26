"""The training front doors: `train` (any task from a recipe), `finetune` (a checkpoint on a recipe's data) and
`pretrain_dino`. Each resolves a config and hands it to the Trainer (resmlp.train.trainer) with its task."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from resmlp.fileio import RunLock, remove_stale_temporaries
from resmlp.runtime import adopt_slurm_ranks, init_distributed, process_settings, shutdown
from resmlp.train.config import TrainConfig, load_config, parse_overrides
from resmlp.train.preemption import stop_on_signals
from resmlp.train.task_registry import task_for
from resmlp.train.tasks import Task
from resmlp.train.trainer import Trainer


def train(recipe: str | Path | dict | TrainConfig = "fashion-mnist-quick", output_dir: str | Path = "runs/train",
          overrides: dict[str, Any] | list[str] | None = None, resume: bool | str | Path = False,
          task: Task | None = None, max_steps: int | None = None) -> dict[str, Any]:
    """Train from a recipe (name, YAML path, dict or TrainConfig); return summary.json's content.

    overrides: {"optim.lr": 1e-3} or ["optim.lr=1e-3"]. resume: True continues OUTPUT/last.pth, a path
    continues that state file. task: a Task instance replacing the config's (e.g. a custom loss).
    max_steps: stop after that many optimizer steps with a resumable state (a smoke run, resmlp.train.controls);
    the return value is then {stopped_at_step, state, epochs}. SIGTERM, SIGUSR1 (SLURM's warning) and Ctrl-C
    stop the same way at the next step boundary (resmlp.train.preemption), adding {signal: its name}; under
    torchrun or srun a signal to any rank stops every rank at the boundary they agree on.
    Launched by torchrun, every process calls this; only rank 0 writes files.
    """
    adopt_slurm_ranks()  # an srun launch: before validation, whose memory check counts the processes
    cfg = load_config(recipe, overrides)
    out = Path(output_dir)
    with process_settings(cfg.train.threads, cfg.train.deterministic):
        info = init_distributed(cfg.train.device)
        try:
            # one run owns its output folder: a second run (or resume) on it fails fast, naming the holder
            with RunLock(out) if info.is_main else contextlib.nullcontext():
                if info.is_main:  # a new run in a folder whose run was killed before its first state too
                    remove_stale_temporaries(out)  # left by a kill during an atomic write
                trainer = Trainer(cfg, out, info, resume, task or task_for(cfg), max_steps)
                with stop_on_signals(info):  # SIGTERM, SIGUSR1, Ctrl-C on any rank: a resumable stop on all
                    return trainer.fit()
        finally:
            shutdown(info)


def finetune(checkpoint: str | Path, recipe: str | Path | dict | TrainConfig, output_dir: str | Path,
             overrides: dict[str, Any] | list[str] | None = None, img_size: int | None = None,
             freeze: int | str | None = None, layer_decay: float | None = None,
             resume: bool | str | Path = False, max_steps: int | None = None) -> dict[str, Any]:
    """Fine-tune `checkpoint` (a file or a run folder) with `recipe`'s data, optimiser and schedule; returns
    summary.json's content.

    The run's model is the checkpoint (model.name = its path, the recipe's dropout kept): the finetune task.
    img_size: new resolution (ResMLP: cross-patch matrices resized; Mixer: block-diagonal expansion).
    freeze: number of leading blocks to freeze, or 'all-but-head'. layer_decay: e.g. 0.75.
    """
    raw = finetune_config(checkpoint, recipe, overrides, img_size, freeze, layer_decay).to_dict()
    return train(raw, output_dir, resume=resume, max_steps=max_steps)


def finetune_config(checkpoint: str | Path, recipe: str | Path | dict | TrainConfig,
                    overrides: dict[str, Any] | list[str] | None = None, img_size: int | None = None,
                    freeze: int | str | None = None, layer_decay: float | None = None,
                    check_memory: bool = True) -> TrainConfig:
    """The validated config of a fine-tuning run (see `finetune`)."""
    from resmlp.evaluation import resolve_checkpoint

    checkpoint = resolve_checkpoint(checkpoint)  # a file, or a run folder's best.safetensors (as eval takes)
    # the checkpoint replaces the recipe's model: its keys that do not apply are dropped with a note
    # a flag given wins; one not given keeps the recipe's value (a resumed run's own, from its config.json)
    given = {f"finetune.{k}": v for k, v in dict(img_size=img_size, freeze=freeze).items() if v is not None}
    extra = {"model.name": str(Path(checkpoint).resolve()), **given,
             **({"optim.layer_decay": layer_decay} if layer_decay is not None else {})}
    return load_config(recipe, {**parse_overrides(overrides), **extra}, check_memory)


def pretrain_dino(recipe: str | Path | dict = "dino-fashion-mnist", output_dir: str | Path = "runs/dino",
                  overrides: dict[str, Any] | list[str] | None = None,
                  resume: bool | str | Path = False, max_steps: int | None = None) -> dict[str, Any]:
    """DINO self-supervised pre-training from a recipe; returns summary.json's content (with knn_top1)."""
    return train(recipe, output_dir, {**parse_overrides(overrides), "task": "dino"}, resume, max_steps=max_steps)

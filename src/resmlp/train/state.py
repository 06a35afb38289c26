"""The resumable training state (DIR/last.pth) and the per-step seeding: everything needed to continue bit-for-bit."""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from resmlp.checkpoint import torch_load
from resmlp.checkpoint_reader import check_int, check_state_dict
from resmlp.data.loading.loaders import StreamPosition
from resmlp.data.loading.samplers import SAME_STEP, SPREAD, ResumableSampler
from resmlp.errors import CheckpointError
from resmlp.fileio import atomic_write
from resmlp.train.step import schedule_to

if TYPE_CHECKING:
    from resmlp.train.view import TrainerView

STATE_FILE = "last.pth"
STATE_VERSION = 2  # 2: task state under "task", the schedule rebuilt from the config
# what a resume may change: where and how fast it runs, how long (more epochs extend a finished run), the
# learning rate (lowered after a non-finite loss), the fused step (same arithmetic), logging, and the gradient
# accumulation (the global batch stays: a job resumed on fewer nodes accumulates what more nodes held at once)
RESUMABLE_CHANGES = ("schedule.epochs", "optim.lr", "train.device", "train.threads", "train.progress",
                     "train.fused_step", "train.checkpoint_every_steps", "train.deterministic", "data.num_workers",
                     "data.dir", "train.grad_accum", "train.compile", "train.log_every_steps", "train.checkpoint_hist",
                     "train.log_wandb", "train.log_mlflow", "train.experiment")


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
    for key, low in (("epoch", 0), ("step_in_epoch", 0), ("global_step", 0), ("best_epoch", -1), ("world_size", 1)):
        check_int(state.get(key), key, path, low, 1 << 62)  # -1: no epoch finished yet
    for key, kind in (("config", dict), ("model", dict), ("optimizer", dict), ("history", list)):
        if not isinstance(state.get(key), kind):
            raise CheckpointError(f"{path}: {key} is not a {kind.__name__}; the state file is damaged: resume from "
                                  "a copy or start a new run")
    check_state_dict(state["model"], path)
    return state


def _flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in config.items():
        if isinstance(value, dict):  # model too: a difference names model.drop_path_rate, not the whole section
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def check_resumable(path: str | Path, saved: dict[str, Any], now: dict[str, Any]) -> None:
    """Refuse a resume whose config differs from the saved run's beyond RESUMABLE_CHANGES, naming every
    differing key with its old and new value."""
    old, new = _flatten(saved), _flatten(now)
    from resmlp.train.sections import TrainConfig

    defaults = _flatten(TrainConfig().to_dict())  # a key added since the run was saved, at its default, is no change
    changed = [key for key in sorted(old.keys() | new.keys())
               if key != "recipe" and old.get(key) != new.get(key) and key not in RESUMABLE_CHANGES
               and not (key not in old and key in defaults and new.get(key) == defaults[key])
               and not (key == "data.pipeline" and new.get(key) == "auto")]  # auto: the state's path goes on
    if changed:
        lines = [f"  {key}: was {old.get(key)!r}, now {new.get(key)!r}" for key in changed]
        raise ValueError(f"{path} was trained with different settings:\n" + "\n".join(lines) + "\nresume with the "
                         f"same recipe and overrides; only {', '.join(RESUMABLE_CHANGES)} may change")
    if new["schedule.epochs"] < old["schedule.epochs"]:
        raise ValueError(f"--epochs {new['schedule.epochs']} is fewer than the run's {old['schedule.epochs']}; a "
                         "resume can extend a run, not shorten it")


def check_same_epochs(trainer: TrainerView, state: dict[str, Any]) -> None:
    """A resume may change the number of processes (a preempted cluster job coming back on fewer or more nodes):
    the global batch is the config's, and the sampler's global positions deal the same images to the steps
    whatever the process count. It is refused only where the epoch would get another number of steps: the
    training set padded to a multiple of the process count (torch's DistributedSampler) can add one."""
    saved = state.get("steps_per_epoch", trainer.steps_per_epoch)  # states written before it was recorded
    if saved != trainer.steps_per_epoch:
        raise ValueError(
            f"{trainer.state_path} was trained at {state['world_size']} process(es) with {saved} steps per epoch; at "
            f"{trainer.info.world_size} process(es) the {len(trainer.data.train)} training images make "
            f"{trainer.steps_per_epoch} steps of train.batch_size={trainer.cfg.train.batch_size}; resume at "
            f"{state['world_size']} process(es), or at a count that splits the epoch into {saved} steps too")


def check_same_stream_layout(trainer: TrainerView, state: dict[str, Any]) -> None:
    """A stream's position within an epoch is counted in its workers' batches (resmlp.data.sources.streams): a resume
    mid-epoch needs the same processes, data.num_workers and micro-batch, or it would repeat and skip images."""
    if not state.get("step_in_epoch") or not isinstance(getattr(trainer, "sampler", None), StreamPosition):
        return
    saved = (state["world_size"], state["config"]["data"]["num_workers"], state["config"]["train"]["grad_accum"])
    now = (trainer.info.world_size, trainer.cfg.data.num_workers, trainer.cfg.train.grad_accum)
    if saved != now:
        raise ValueError(f"{trainer.state_path} stopped mid-epoch reading a stream with {saved[0]} process(es), "
                         f"data.num_workers={saved[1]} and train.grad_accum={saved[2]}; "
                         "resume it with the same, or the epoch would repeat and skip images")


def _stream_shards(trainer: TrainerView) -> str | None:
    """The digest of the training stream's shards (resmlp.data.sources.streams), None for map-style data."""
    sampler = getattr(trainer, "sampler", None)
    return sampler.stream.records.fingerprint() if isinstance(sampler, StreamPosition) else None


def check_same_shards(trainer: TrainerView, state: dict[str, Any]) -> None:
    """A mid-epoch resume skips the records already trained on by position: over shards rewritten since (same
    counts and sizes, other records) it would skip and repeat other images, so another digest is refused."""
    saved = state.get("stream_shards")
    if state.get("step_in_epoch") and saved is not None and saved != _stream_shards(trainer):
        raise ValueError(f"{trainer.state_path} stopped mid-epoch over shards that have changed since (names, sizes, "
                         "modification times or a store's ETags differ); restore them (copies keep their times with "
                         "cp -p or rsync -a), or start a new run")


def check_same_shapes(trainer: TrainerView, saved: dict[str, Any]) -> None:
    """One line, not load_state_dict's traceback, when the model built for the data now differs from the saved
    one: the data's classes changed since the run started (a folder, a class map or a cached census altered)."""
    built = trainer.model.state_dict()
    for key, value in saved.items():
        if key in built and hasattr(value, "shape") and tuple(value.shape) != tuple(built[key].shape):
            raise ValueError(f"{trainer.state_path} holds a model whose {key} is {tuple(value.shape)}, but the one "
                             f"built for the data now is {tuple(built[key].shape)}: the data's classes changed "
                             "since the run started (a folder, a class map, or a cached listing in data_index/); "
                             "restore them, or start a new run")


def state_to_resume(out: Path, resume: bool | str | Path) -> Path | None:
    """The state file a run continues (resume True: OUT/last.pth), None for a new run; refuses to start a new
    run over an existing one."""
    existing = out / STATE_FILE
    if resume is False:
        if existing.exists():
            raise ValueError(f"{out} already holds a run ({existing}); continue it with --resume, or "
                             "choose another --output")
        return None
    path = existing if resume is True else Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"nothing to resume: {path} does not exist")
    return path


def _repeat_placement(trainer: TrainerView) -> str | None:
    """Where the epoch in progress puts repeated copies (resmlp.data.loading.samplers), None without them."""
    sampler = getattr(trainer, "sampler", None)
    return sampler.placement_of(trainer.epoch) if isinstance(sampler, ResumableSampler) else None


def keep_repeat_placement(trainer: TrainerView, state: dict[str, Any]) -> None:
    """A resume mid-epoch at another process count finishes the epoch with the placement it started with (the
    same images at the same global positions); the next epochs take the new count's."""
    saved, sampler = state.get("repeat_placement"), getattr(trainer, "sampler", None)
    if saved is None or not state["step_in_epoch"] or not isinstance(sampler, ResumableSampler):
        return
    if saved not in (SAME_STEP, SPREAD):
        raise CheckpointError(f"{trainer.state_path}: repeat_placement must be {SAME_STEP!r} or {SPREAD!r}, got "
                              f"{saved!r}; the file is damaged or was not written by resmlp train")
    sampler.resumed_placement = (state["epoch"], saved)


def snapshot(trainer: TrainerView) -> dict[str, Any]:
    """Everything a resume needs, from the trainer's public state."""
    return dict(
        config=trainer.cfg.to_dict(), model=trainer.model.state_dict(), optimizer=trainer.optimizer.state_dict(),
        ema=trainer.ema.state_dict() if trainer.ema else None,
        scaler=trainer.scaler.state_dict() if trainer.scaler else None, task=trainer.task.state_dict(),
        epoch=trainer.epoch,
        step_in_epoch=trainer.step_in_epoch, global_step=trainer.global_step, history=trainer.history,
        best_top1=trainer.best_top1, best_epoch=trainer.best_epoch, epoch_totals=trainer.epoch_totals.clone(),
        world_size=trainer.info.world_size, steps_per_epoch=trainer.steps_per_epoch,
        stream_shards=_stream_shards(trainer), repeat_placement=_repeat_placement(trainer),
        data_pipeline=trainer.train_batches.choice.to_dict() if trainer.train_batches.choice else None,
        wall_seconds=trainer.wall_before + time.perf_counter() - trainer.t0,
    )


def restore(trainer: TrainerView, state: dict[str, Any]) -> None:
    """Put a saved state back into a freshly built trainer (same config, or one check_resumable accepts)."""
    check_resumable(trainer.state_path, state["config"], trainer.cfg.to_dict())
    check_same_epochs(trainer, state)
    check_same_stream_layout(trainer, state)
    check_same_shards(trainer, state)
    check_same_shapes(trainer, state["model"])
    trainer.model.load_state_dict(state["model"])
    trainer.optimizer.load_state_dict(state["optimizer"])
    if trainer.ema is not None and state["ema"] is not None:
        trainer.ema.load_state_dict(state["ema"])
    if trainer.scaler is not None and state["scaler"] is not None:
        trainer.scaler.load_state_dict(state["scaler"])
    trainer.task.load_state_dict(state["task"])
    trainer.epoch, trainer.step_in_epoch = state["epoch"], state["step_in_epoch"]
    trainer.global_step, trainer.history = state["global_step"], state["history"]
    trainer.best_top1, trainer.best_epoch = state["best_top1"], state["best_epoch"]
    trainer.epoch_totals = state["epoch_totals"]
    keep_repeat_placement(trainer, state)
    # the data path the run was on (auto's measurement, or timm's after a device failure): no probe, exact
    trainer.train_batches.resume(state.get("data_pipeline"), state["config"]["data"].get("pipeline", "timm"))
    trainer.wall_before = state["wall_seconds"]
    # the schedule is a function of the config and the step, so it is rebuilt rather than loaded: a resume
    # may extend schedule.epochs or lower optim.lr (check_resumable says which keys may change)
    schedule_to(trainer.scheduler, trainer.cfg.schedule, trainer.global_step, trainer.epoch)


def seed_step(seed: int, step: int, rank: int) -> None:
    """Seed every RNG the step touches (dropout, drop-path, Mixup) from (seed, step, rank): exact resume."""
    # only ints: a str in the tuple would hash differently in every process (PYTHONHASHSEED); the 4-tuple
    # keeps step seeds apart from the per-image seeds (seed, epoch, position)
    step_seed = hash((seed, step, rank, 0)) & 0x7FFF_FFFF
    random.seed(step_seed)
    np.random.seed(step_seed)
    torch.manual_seed(step_seed)  # all devices: dropout and drop-path run where the model is

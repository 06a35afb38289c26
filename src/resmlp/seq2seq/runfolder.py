"""A translation run's folder, read as untrusted and written only through `resmlp.fileio`.

- config.json: at most CONFIG_MAX_BYTES, nested a few levels, a `TranslationConfig` (known keys, exact types,
  ranges), else a ConfigError naming the file;
- checkpoint.pt: read weights-only, then checked before anything is built from it: known keys of the types this
  project writes, step counts whole numbers in range, the model's tensors dense, contiguous (a stride-0 view can't
  claim more memory than its file holds), of float dtypes and finite, and its `model_config` in
  `model.LIMITS`; the model is built on PyTorch's meta device (no memory) and compared name by name, shape by
  shape, before it is built for real. Any mismatch is a CheckpointError naming the file;
- log.csv: rewritten whole through `atomic_write` at every row, so a symlink planted at its name is replaced,
  never written through; on resume, the rows up to the checkpoint's step are kept;
- a training's memory (weights, gradients, optimizer state, the largest activations) is estimated from its
  model built on the meta device, and refused before allocation when above this machine's memory.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

import torch

from resmlp.checkpoint import torch_load
from resmlp.errors import CheckpointError, ConfigError, DataError, OutputError
from resmlp.fileio import atomic_write, write_json
from resmlp.hostinfo import physical_memory_bytes
from resmlp.seq2seq.config import TranslationConfig
from resmlp.seq2seq.model import Seq2SeqBase, Seq2SeqConfig, build_translation_model

CHECKPOINT = "checkpoint.pt"
TOKENIZER = "tokenizer.model"
CONFIG = "config.json"
LOG = "log.csv"
CONFIG_MAX_BYTES = 1 << 20  # this project writes about 1 kB
LOG_MAX_BYTES = 64 << 20  # a row of ~60 bytes every log_every (50) steps: 100 000 steps log about 120 kB
_CONFIG_MAX_DEPTH = 3  # the config, its model_overrides, nothing deeper
# what `seq2seq.train.save_checkpoint` writes, and the type of each; the others are needed for a resume only
_CHECKPOINT_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": dict, "model_config": dict, "optimizer": dict, "scheduler": dict, "step": int, "epoch": int,
    "batch_in_epoch": int, "train_seconds": (int, float), "rng": torch.Tensor, "cuda_rng": torch.Tensor,
    "scaler": dict, "averaged_steps": list,
}
RESUME_KEYS = ("optimizer", "scheduler", "step", "epoch", "train_seconds")
_MAX_COUNT = 1 << 40  # steps, epochs, batches: more than any run makes


# ---------------------------------------------------------------------------------------- config.json
def read_run_config(run_dir: str | Path) -> TranslationConfig:
    """The validated config.json of a `resmlp translate train` output folder."""
    path = Path(run_dir) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; CHECKPOINT must be a `resmlp translate train` output")
    if path.stat().st_size > CONFIG_MAX_BYTES:
        raise ConfigError(f"{path} holds {path.stat().st_size} bytes; a run's config.json is about 1 kB: the file "
                          "was replaced or edited")
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); the run folder is damaged") from None
    except RecursionError:  # json's decoder recurses once per level of nesting
        raise ConfigError(f"{path} is nested thousands of levels deep; a run's config.json has two levels") from None
    if _depth(values) > _CONFIG_MAX_DEPTH:
        raise ConfigError(f"{path} is nested more than {_CONFIG_MAX_DEPTH} levels deep; a run's config.json has two")
    return TranslationConfig.from_dict(values, str(path))


def _depth(value: Any) -> int:
    """Nesting depth of JSON lists and objects, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, level = todo.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            todo += [(v, level + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def write_run_config(out: Path, cfg: TranslationConfig) -> None:
    write_json(out / CONFIG, dataclasses.asdict(cfg))


# ---------------------------------------------------------------------------------------- checkpoint.pt
def read_translation_checkpoint(path: str | Path, for_resume: bool = False) -> dict[str, Any]:
    """A `resmlp translate train` checkpoint, read weights-only (no code runs) onto the CPU and checked: the
    keys and types it holds, its step counts, its model's tensors (dense, contiguous, float, finite) and config.
    for_resume: the optimizer, scheduler and step counts must be there too."""
    path = Path(path)
    ckpt = torch_load(path)
    if not isinstance(ckpt, dict) or "model_config" not in ckpt or "model" not in ckpt:
        raise CheckpointError(f"{path} is not a `resmlp translate train` checkpoint (no model and model_config)")
    for key, value in ckpt.items():
        wanted = _CHECKPOINT_TYPES.get(key) if isinstance(key, str) else None
        if wanted is None:
            raise CheckpointError(f"{path}: unknown entry {key!r}; not a `resmlp translate train` checkpoint")
        if not isinstance(value, wanted) or isinstance(value, bool):
            raise CheckpointError(f"{path}: entry {key!r} is a {type(value).__name__}, not what resmlp writes there")
    missing = [key for key in RESUME_KEYS if key not in ckpt] if for_resume else []
    if missing:
        raise CheckpointError(f"{path} has no {', '.join(missing)}: it can be evaluated but not resumed")
    for key in ("step", "epoch", "batch_in_epoch"):
        if key in ckpt and not 0 <= ckpt[key] <= _MAX_COUNT:
            raise CheckpointError(f"{path}: {key}={ckpt[key]} is outside 0 to {_MAX_COUNT}")
    if "train_seconds" in ckpt and not (math.isfinite(ckpt["train_seconds"]) and ckpt["train_seconds"] >= 0):
        raise CheckpointError(f"{path}: train_seconds={ckpt['train_seconds']} is not a duration")
    _check_tensors(ckpt["model"], path)
    _check_layout(checkpoint_model_config(ckpt, path), ckpt["model"], path)
    return ckpt


def checkpoint_model_config(ckpt: dict[str, Any], path: str | Path = "checkpoint") -> Seq2SeqConfig:
    """The model config of a checkpoint, every field checked (types, model.LIMITS)."""
    try:
        return Seq2SeqConfig.from_dict(ckpt["model_config"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: its model_config is invalid ({e}); the file was edited or damaged") from None


def _check_tensors(tensors: dict[Any, Any], path: Path) -> None:
    """The model's weights as `save_checkpoint` writes them: named, dense, contiguous CPU tensors viewing only their
    own storage, float and finite. (With the shared checkpoint reader of issue 36, `checkpoint_reader.
    check_state_dict` covers all but the float and contiguity requirements.)"""
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{path}: model entry {name!r} is not a named tensor")
        dense = tensor.layout == torch.strided and tensor.device.type == "cpu" and not tensor.is_meta
        if not dense or not tensor.is_contiguous():
            raise CheckpointError(f"{path}: tensor {name!r} is not a dense contiguous tensor (layout {tensor.layout}, "
                                  f"device {tensor.device}, strides {tensor.stride()}); resmlp writes only those")
        if tensor.untyped_storage().nbytes() < (tensor.storage_offset() + tensor.numel()) * tensor.element_size():
            raise CheckpointError(f"{path}: tensor {name!r} claims more elements than its storage holds")
        if not tensor.is_floating_point():
            raise CheckpointError(f"{path}: tensor {name!r} is of dtype {tensor.dtype}; the model's weights are float")
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"{path}: tensor {name!r} holds NaN/infinite values; the weights are broken (a "
                                  "diverged run?): use an earlier checkpoint")


def _check_layout(config: Seq2SeqConfig, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """The file's tensors are exactly the model its config describes, compared on the meta device (no memory):
    a config that claims a larger model than its tensors is refused before anything is allocated."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in build_translation_model(config).state_dict().items()}
    found = {k: tuple(v.shape) for k, v in tensors.items()}
    if expected != found:
        wrong = sorted(k for k in expected.keys() | found.keys() if expected.get(k) != found.get(k))
        shown = ", ".join(f"{k}: config {expected.get(k)}, file {found.get(k)}" for k in wrong[:3])
        raise CheckpointError(f"{path}: its tensors are not the model its config describes ({len(wrong)} differ: "
                              f"{shown}); the file was edited or damaged")


def model_from_checkpoint(ckpt: dict[str, Any]) -> Seq2SeqBase:
    """The model of a checkpoint read by `read_translation_checkpoint` (already checked to fit), on the CPU."""
    model = build_translation_model(checkpoint_model_config(ckpt))
    model.load_state_dict(ckpt["model"])
    return model


def restore_training_state(path: Path, ckpt: dict[str, Any], model: torch.nn.Module, opt: torch.optim.Optimizer,
                           sched: torch.optim.lr_scheduler.LRScheduler, scaler: Any, device: torch.device) -> None:
    """A resumed run's state from its checkpoint (read by `read_translation_checkpoint`, for_resume) into the
    model, optimizer and schedule the run built from its own options: the file may bring back their state, not
    other settings (an edited eps or learning rate would train on silently), nor state of other shapes; the
    generator states are absent in files of earlier versions, then left as they are."""
    model.load_state_dict(ckpt["model"])
    scheduled = ("params", "lr", "initial_lr")
    settings = [{k: v for k, v in group.items() if k not in scheduled} for group in opt.param_groups]
    base_lrs = list(sched.base_lrs)
    try:
        opt.load_state_dict(ckpt["optimizer"])  # moves the state onto the parameters' device
        sched.load_state_dict(ckpt["scheduler"])
        if scaler is not None and "scaler" in ckpt:
            scaler.load_state_dict(ckpt["scaler"])
        if "rng" in ckpt:
            torch.set_rng_state(ckpt["rng"])
        if "cuda_rng" in ckpt and device.type == "cuda":
            torch.cuda.set_rng_state(ckpt["cuda_rng"], device)
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        raise _unfit(path, str(e).splitlines()[0][:200] if str(e) else type(e).__name__) from None
    for group, built in zip(opt.param_groups, settings, strict=True):
        changed = sorted(k for k in built if k in group and group[k] != built[k])
        if changed:
            raise _unfit(path, f"optimizer settings {', '.join(changed)} differ from the run's")
    if sched.base_lrs != base_lrs or sched.last_epoch != ckpt["step"]:
        raise _unfit(path, f"schedule at step {sched.last_epoch} with rates {sched.base_lrs}, run at step "
                           f"{ckpt['step']} with {base_lrs}")
    for param, state in opt.state.items():
        for key, value in state.items():
            fits = not torch.is_tensor(value) or value.dim() == 0 or value.shape == param.shape
            if not fits or (torch.is_tensor(value) and not bool(torch.isfinite(value).all())):
                raise _unfit(path, f"optimizer state {key!r} of shape {tuple(value.shape)} for a parameter of shape "
                                   f"{tuple(param.shape)}, or not finite")


def _unfit(path: Path, reason: str) -> CheckpointError:
    return CheckpointError(f"{path}: its optimizer, schedule or generator state does not fit this run ({reason}); "
                           "the file was edited or damaged")


# ---------------------------------------------------------------------------------------- memory
def check_training_memory(config: Seq2SeqConfig, max_tokens: int) -> None:
    """Refuse, before building it, a model whose training would not fit in this machine's memory: a lower
    estimate of fp32 weights, gradients and two optimizer moments, plus the logits of a batch of max_tokens
    (computed, cast to float and differentiated) and the layers' activations."""
    with torch.device("meta"):
        params = sum(p.numel() for p in build_translation_model(config).parameters())
    layers = config.encoder_layers + config.decoder_layers
    activations = max_tokens * (3 * config.vocab_size + layers * (4 * config.dim + config.hidden))
    need, have = 4 * (4 * params + activations), physical_memory_bytes()
    if have is not None and need > have:
        raise ConfigError(f"training this model ({params / 1e6:.0f}M parameters, vocabulary {config.vocab_size}, dim "
                          f"{config.dim}, {layers} layers) on batches of {max_tokens} tokens needs at least "
                          f"{need / 2**30:.1f} GiB, more than this machine's {have / 2**30:.1f} GiB; lower "
                          "--max-tokens, --vocab-size, --dim or the number of layers")


# ---------------------------------------------------------------------------------------- log.csv
class RunLog:
    """log.csv of a run: the rows kept in memory and the whole file rewritten by `atomic_write` at each row (a
    few thousand rows at most), so nothing is ever written through a symlink planted at its name."""

    FIELDS = ("step", "epoch", "train_loss", "valid_loss", "lr", "tokens_per_s", "train_seconds")

    def __init__(self, out: Path, resume_step: int | None) -> None:
        """resume_step: keep the rows of an earlier part of the run up to this step (None: a new log)."""
        self.path = out / LOG
        self.rows: list[dict[str, Any]] = []
        if resume_step is not None:
            self.rows = [row for row in self._read() if row["step"] <= resume_step]
        self._write()

    def _read(self) -> list[dict[str, Any]]:
        """The rows of the existing log (rows a kill damaged are dropped); never read through a symlink, nor from a
        FIFO or device (O_NONBLOCK: opening a FIFO would wait for a writer)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return []
        except OSError:  # ELOOP: a symlink
            raise OutputError(f"{self.path} is a symlink; a run reads and writes only inside its output folder: "
                              "remove it") from None
        with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise OutputError(f"{self.path} is not a regular file; remove it to resume")
            if info.st_size > LOG_MAX_BYTES:
                raise DataError(f"{self.path} holds more than {LOG_MAX_BYTES >> 20} MiB, far more than a run logs (a "
                                "row every few steps); it is not this run's log: move it away to resume")
            rows = list(csv.DictReader(f))
        kept = []
        for row in rows:
            try:
                kept.append({**row, "step": int(row["step"])})
            except (TypeError, ValueError, KeyError):
                continue
        return kept

    def append(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self._write()

    def _write(self) -> None:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, self.FIELDS, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        text = buf.getvalue()
        atomic_write(self.path, lambda p: p.write_text(text, encoding="utf-8"))

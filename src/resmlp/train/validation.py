"""Validation of a training config: each key's type (with YAML's coercions) and each value's meaning.

`validate` turns the raw mapping of a recipe plus overrides into a `TrainConfig` or raises one ConfigError (a
ValueError) that lists every problem, so a user fixes them all in one go: types, ranges (each naming the key, the
value, the allowed range and the value's source), the training memory against the machine's, and meanings.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from resmlp.build import build_model, check_constructor_keys, parse_model_name
from resmlp.errors import ConfigError
from resmlp.preprocess import INTERPOLATIONS
from resmlp.runtime import DEVICE_NAME
from resmlp.train import memory, value_checks
from resmlp.train.sections import CLIP_MODES, SECTIONS, TASKS, TRAINING_FIELDS, TrainConfig
from resmlp.train.value_checks import check_augmentation, check_keys_are_strings, check_teacher, input_shape

# the range of each numeric key that a real run could use (inclusive): past these a typo would allocate until
# memory runs out, or a zero would fail deep inside the run. The model's sizes are bounded by ResMLPConfig itself.
RANGES: dict[str, tuple[float, float]] = {
    "data.val_size": (0, 10_000_000), "data.color_jitter": (0, 10), "train.seed": (0, 2**32 - 1),
    "data.val_seed": (0, 2**32 - 1), "data.permute_seed": (0, 2**32 - 1), "data.synthetic_classes": (1, 100_000),
    "data.num_workers": (0, 256), "data.mixup": (0, 100), "data.cutmix": (0, 100),
    "data.mixup_prob": (0, 1), "data.recount": (1, 64), "optim.weight_decay": (0, 100),
    "schedule.warmup_epochs": (0, 100_000), "schedule.decay_epochs": (0, 100_000),
    "train.checkpoint_hist": (0, 100_000),
    "optim.lr": (0, 100), "optim.reference_batch": (1, 1 << 24), "optim.momentum": (0, 1), "optim.eps": (0, 1),
    "schedule.epochs": (1, 100_000), "schedule.warmup_lr": (0, 100), "schedule.min_lr": (0, 100),
    "schedule.decay_rate": (0, 1), "data.repeated_aug": (0, 64), "data.permute_patch": (1, 4096),
    "train.batch_size": (1, 1 << 20), "train.grad_accum": (1, 65536), "train.threads": (1, 4096),
    "train.checkpoint_every_steps": (0, 1 << 40), "train.log_every_steps": (0, 1 << 40), "train.clip_grad": (0, 1e9),
    "distill.tau": (1e-3, 1e3), "finetune.img_size": (1, 4096),
    "dino.out_dim": (1, 1 << 20), "dino.hidden_dim": (1, 65536), "dino.bottleneck_dim": (1, 65536),
    "dino.num_local": (0, 64), "dino.local_size": (1, 4096), "dino.knn_k": (1, 100_000),
    "dino.teacher_temp": (1e-4, 100), "dino.warmup_teacher_temp": (1e-4, 100), "dino.student_temp": (1e-4, 100),
    "dino.knn_temperature": (1e-4, 100), "dino.center_momentum": (0, 1),
    "dino.warmup_teacher_temp_epochs": (0, 100_000), "dino.freeze_last_layer_epochs": (0, 100_000),
}
SIZE_LISTS = {"data.synthetic_size": (1, 10_000_000)}  # every item of these lists


def validate(raw: dict[str, Any], sources: dict[str, str] | None = None, check_memory: bool = True) -> TrainConfig:
    """Check every section, key, type and value; raise one ConfigError listing all problems.

    `sources` names where a dotted key's value came from (a recipe file, the command line), for the messages;
    keys without one are named as the recipe's. check_memory=False: no refusal for this machine's memory (a
    dry run prints the estimate instead: its run may be meant for another machine).
    """
    check_keys_are_strings(raw)
    errors: list[str] = []
    known = {"recipe", "task", "model", *SECTIONS}
    for key in raw:
        if key not in known:
            errors.append(_unknown(key, known, "section"))
    sections = {}
    for name, cls in SECTIONS.items():
        values = raw.get(name) or {}
        if not isinstance(values, dict):
            errors.append(f"{name}: expected a mapping of keys, got {values!r}")
            values = {}
        sections[name] = _build_section(name, cls, values, errors)
    model = raw.get("model") or {}
    if not isinstance(model, dict) or "name" not in model:
        errors.append("model: expected a mapping with at least `name` (a preset such as resmlp_s12)")
        model = {"name": "resmlp_s12"}
    task = raw.get("task")
    if task is not None and task not in TASKS:
        errors.append(f"task: {task!r} is not one of {', '.join(TASKS)}")
        task = None
    model = {k: _coerce(v, float) if k in _MODEL_FLOATS and isinstance(v, str) and _coerce(v, float) is not _BAD
             else v for k, v in model.items()}  # YAML reads 1e-9 as a string
    cfg = TrainConfig(recipe=str(raw.get("recipe", "custom")), task=task, model=model, **sections)
    errors += (range_errors := _check_ranges(cfg, sources or {}, f"recipe {cfg.recipe}"))
    if not errors and check_memory:  # the memory estimate needs sizes that are each in range
        errors += memory.check_memory(cfg)
    errors += value_checks.once_per_key(range_errors, _check_values(cfg))  # every problem once; a key out of range once
    model_sources = (sorted({v for k, v in (sources or {}).items() if k.startswith("model.")})
                     or [f"recipe {cfg.recipe}"])
    errors = [f"{e} (model section from {' and '.join(model_sources)})" if e.startswith("model") else e
              for e in errors]
    if errors:
        raise ConfigError("invalid training config:\n  " + "\n  ".join(dict.fromkeys(errors)))
    return cfg


def _check_ranges(cfg: TrainConfig, sources: dict[str, str], default_source: str) -> list[str]:
    """Every float finite, every key of RANGES and SIZE_LISTS in its range; each error names the key, the
    value, the allowed range and where the value came from."""
    errors = []
    for section in SECTIONS:
        for key, value in dataclasses.asdict(getattr(cfg, section)).items():
            dotted = f"{section}.{key}"
            source = sources.get(dotted, default_source)
            items = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in items):
                errors.append(f"{dotted}={value!r} (from {source}): expected a finite number")
                continue
            low, high = RANGES.get(dotted) or SIZE_LISTS.get(dotted) or (None, None)
            if low is None or value is None:
                continue
            if any(not low <= v <= high for v in items):
                errors.append(f"{dotted}={value!r} (from {source}) is outside the allowed range [{low}, {high}]")
    for key, value in cfg.model_overrides.items():
        if isinstance(value, float) and not math.isfinite(value):
            errors.append(f"model.{key}={value!r} (from {sources.get(f'model.{key}', default_source)}): expected "
                          "a finite number")
    return errors


_MODEL_FLOATS = ("mlp_ratio", "layerscale_init", "drop_rate", "drop_path_rate")


def _unknown(key: str, known, what: str, where: str = "") -> str:
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f"; valid: {', '.join(sorted(known))}"
    return f"{where}unknown {what} {key!r}{hint}"


def _build_section(name: str, cls, values: dict, errors: list[str]):
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            errors.append(_unknown(key, hints, "key", f"{name}: "))
            continue
        coerced = _coerce(value, hints[key])
        if coerced is _BAD:
            errors.append(f"{name}.{key}: expected {_type_name(hints[key])}, got {value!r}")
            continue
        kwargs[key] = coerced
    return cls(**kwargs)


_BAD = object()


def _coerce(value: Any, hint: Any) -> Any:
    """`value` as type `hint` (int -> float allowed, YAML's '5e-3' strings parsed), or _BAD."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        for arg in typing.get_args(hint):
            if arg is not type(None) and (out := _coerce(value, arg)) is not _BAD:
                return out
        return _BAD
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            return _BAD
        items = [_coerce(v, item) for v in value]
        return _BAD if any(i is _BAD for i in items) else items
    if hint is bool:
        return value if isinstance(value, bool) else _BAD
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _BAD
    if hint is float:
        if isinstance(value, str):  # PyYAML reads 5e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                return _BAD
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _BAD
    if hint is str:
        return value if isinstance(value, str) else _BAD
    return value


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _check_model(cfg: TrainConfig) -> list[str]:
    try:
        name = cfg.model_name
    except ValueError as e:
        return [f"model.name: {e}"]
    if name.kind != "file":  # presets, timm and torchvision models built on the meta device: no memory
        try:
            with torch.device("meta"):
                cfg.model_config() if name.kind == "preset" else build_model(name, **cfg.constructor_overrides)
        except (ValueError, TypeError) as e:
            return [f"model: {e}"]
    if name.kind == "file":
        if not Path(name.name).is_file():
            return [f"model.name: checkpoint {name.name} does not exist"]
        extra = sorted(set(cfg.model_overrides) - set(TRAINING_FIELDS))
        if extra:
            return [f"model: a checkpoint start takes only {', '.join(TRAINING_FIELDS)} besides name (its architecture "
                    f"comes from the file), not {', '.join(extra)}; for a new resolution set finetune.img_size"]
    problem = check_constructor_keys(name, cfg.model_overrides)
    if problem:
        return [f"model: {problem}"]
    if cfg.task_name == "finetune" and name.kind != "file":
        return [f"task finetune starts from a checkpoint: model.name must be a checkpoint file, not {name}"]
    if cfg.task_name == "distillation" and not cfg.distill.teacher:
        return ["task distillation needs distill.teacher (a checkpoint file, timm:NAME or torchvision:NAME)"]
    return _check_teacher_file(cfg.distill.teacher)


def _check_teacher_file(teacher: str | None) -> list[str]:
    """A teacher checkpoint that is not there yet, with the command that makes it where a shipped recipe
    documents one (`resmlp train --recipe fashion-mnist-teacher --output runs/teacher`)."""
    if not teacher:
        return []
    try:
        name = parse_model_name(teacher)
    except ValueError as e:
        return [f"distill.teacher: {e}"]
    if name.kind != "file" or Path(name.name).is_file():
        return []
    run = re.escape(str(Path(name.name).parent))
    makers = {m.group(0) for path in (resources.files("resmlp") / "recipes").iterdir() if path.name.endswith(".yaml")
              for m in re.finditer(rf"resmlp train --recipe \S+ --output {run}(?=\s|$)", path.read_text())}
    how = f"make it first: {sorted(makers)[0]}, or " if makers else ""
    return [f"distill.teacher: checkpoint {name.name} does not exist; {how}name another teacher with --distill "
            "CHECKPOINT (or timm:NAME / torchvision:NAME with --teacher-weights FILE)"]


def _check_values(cfg: TrainConfig) -> list[str]:
    errors = []
    d, o, s, t = cfg.data, cfg.optim, cfg.schedule, cfg.train

    def need(cond: bool, msg: str) -> None:
        if not cond:
            errors.append(msg)

    errors += _check_model(cfg)
    errors += value_checks.check_source(d)
    need((d.mean is None) == (d.std is None), "data.mean and data.std go together: set both or neither")
    need(0 < d.crop_pct <= 1, f"data.crop_pct must be in (0, 1], got {d.crop_pct}")
    need(len(d.scale) == 2 and 0 < d.scale[0] <= d.scale[1] <= 1, f"data.scale: [min, max] in (0, 1], got {d.scale}")
    need(len(d.ratio) == 2 and 0 < d.ratio[0] <= d.ratio[1], f"data.ratio: [min, max] > 0, got {d.ratio}")
    for key in ("hflip", "reprob"):
        need(0 <= getattr(d, key) <= 1, f"data.{key} is a probability in [0, 1], got {getattr(d, key)}")
    for key in ("mixup", "cutmix", "color_jitter"):
        need(getattr(d, key) >= 0, f"data.{key} must be >= 0, got {getattr(d, key)}")
    need(d.repeated_aug >= 0, f"data.repeated_aug must be >= 0, got {d.repeated_aug}")
    need(d.num_workers >= 0, f"data.num_workers must be >= 0, got {d.num_workers}")
    need(d.val_size >= 0, f"data.val_size must be >= 0, got {d.val_size}")
    if d.test_dir is not None:
        need(Path(d.test_dir).is_dir(), f"data.test_dir: {d.test_dir} does not exist or is not a folder")
    need(d.permute in ("none", "patch", "global"), f"data.permute: {d.permute!r} is not one of none, patch, global")
    need(d.interpolation in INTERPOLATIONS, f"data.interpolation: {d.interpolation!r} is not one of {INTERPOLATIONS}")
    need(len(d.synthetic_size) == 2, f"data.synthetic_size: [train, val] image counts, got {d.synthetic_size}")
    if d.std is not None and d.mean is not None:
        need(len(d.mean) == len(d.std) and len(d.mean) in (1, 3, input_shape(cfg)[0]),
             f"data.mean and data.std: as many values, 1, 3 or the model's channels, got {d.mean} and {d.std}")
        need(all(v > 0 for v in d.std), f"data.std: every value must be > 0 (images are divided by it), got {d.std}")
    errors += check_augmentation(d)
    need(o.name in ("lamb", "sgd", "adamw"), f"optim.name: {o.name!r} is not one of lamb, sgd, adamw")
    need(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    need(o.reference_batch is None or o.reference_batch > 0, "optim.reference_batch must be > 0 or null")
    need(o.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {o.weight_decay}")
    need(o.eps is None or o.eps > 0, f"optim.eps must be > 0 or null, got {o.eps}")
    need(s.name in ("cosine", "step"), f"schedule.name: {s.name!r} is not one of cosine, step")
    need(s.epochs >= 1, f"schedule.epochs must be >= 1, got {s.epochs}")
    need(0 <= s.warmup_epochs < s.epochs,
         f"schedule.warmup_epochs is {s.warmup_epochs}, which must be in [0, schedule.epochs = {s.epochs}); "
         f"set a shorter warm-up with --warmup-epochs N (= --set schedule.warmup_epochs=N)"
         + value_checks.dino_warmup_hint(cfg))
    need(s.step_on in ("update", "epoch"), f"schedule.step_on: {s.step_on!r} is not one of update, epoch")
    need(s.decay_epochs > 0, f"schedule.decay_epochs must be > 0, got {s.decay_epochs}")
    need(0 <= cfg.loss.label_smoothing < 1, f"loss.label_smoothing must be in [0, 1), got {cfg.loss.label_smoothing}")
    need(t.batch_size >= 1, f"train.batch_size must be >= 1, got {t.batch_size}")
    need(t.grad_accum >= 1, f"train.grad_accum must be >= 1, got {t.grad_accum}")
    need(t.clip_grad is None or t.clip_grad > 0, "train.clip_grad must be > 0 or null")
    need(t.clip_mode in CLIP_MODES, f"train.clip_mode: {t.clip_mode!r} is not one of {', '.join(CLIP_MODES)}")
    need(t.amp in ("auto", "bf16", "fp16", "fp32", "none"),
         f"train.amp: {t.amp!r} is not one of auto, bf16, fp16, fp32 (or none)")
    need(t.threads is None or t.threads >= 1, f"train.threads must be >= 1 or null, got {t.threads}")
    need(0 < t.ema_decay < 1, f"train.ema_decay must be in (0, 1), got {t.ema_decay}")
    need(t.checkpoint_every_steps >= 0, "train.checkpoint_every_steps must be >= 0")
    need(t.compile in (True, False, "auto", "true", "false"),
         f"train.compile: {t.compile!r} is not one of auto, true, false")
    need(o.layer_decay is None or 0 < o.layer_decay <= 1, f"optim.layer_decay must be in (0, 1], got {o.layer_decay}")
    need(DEVICE_NAME.fullmatch(t.device) is not None, f"train.device: {t.device!r} is not auto, cpu, cuda or cuda:N")
    errors += value_checks.check_loggers(t)
    return errors + _check_paradigm_sections(cfg)


def _check_paradigm_sections(cfg: TrainConfig) -> list[str]:
    """The distill, finetune and dino sections."""
    errors = []
    d = cfg.data

    def need(cond: bool, msg: str) -> None:
        if not cond:
            errors.append(msg)

    kd, ft, dn = cfg.distill, cfg.finetune, cfg.dino
    need(kd.type in ("hard", "soft"), f"distill.type: {kd.type!r} is not one of hard, soft")
    if kd.teacher is not None:
        errors += check_teacher(kd.teacher)
    need(0 <= kd.alpha <= 1, f"distill.alpha must be in [0, 1], got {kd.alpha}")
    need(kd.tau > 0, f"distill.tau must be > 0, got {kd.tau}")
    random_aug = [key for key, on in (("scale", list(d.scale) != [1.0, 1.0]), ("reprob", d.reprob > 0),
                                      ("mixup", d.mixup > 0), ("cutmix", d.cutmix > 0),
                                      ("auto_augment", bool(d.auto_augment)), ("color_jitter", d.color_jitter > 0))
                  if on]
    need(not (kd.cache and random_aug),
         f"distill.cache needs a fixed augmentation (flips are fine), but data.{', data.'.join(random_aug)} "
         "make every image new each epoch, so a cache would only grow; set distill.cache: false")
    need(ft.img_size is None or ft.img_size > 0, f"finetune.img_size must be > 0, got {ft.img_size}")
    need(ft.freeze is None or ft.freeze == "all-but-head" or (isinstance(ft.freeze, int) and ft.freeze >= 0),
         f"finetune.freeze: expected a number of blocks (>= 0) or all-but-head, got {ft.freeze!r}")
    need(dn.num_local >= 0 and dn.out_dim >= 1, "dino.num_local must be >= 0 and dino.out_dim >= 1")
    img_size = input_shape(cfg)[1]
    need(dn.local_size is None or not img_size or dn.local_size <= img_size,
         f"dino.local_size={dn.local_size} is larger than the global crops ({img_size} px); local crops are smaller")
    need(0 <= dn.momentum_teacher < 1, f"dino.momentum_teacher must be in [0, 1), got {dn.momentum_teacher}")
    for key in ("global_scale", "local_scale"):
        v = getattr(dn, key)
        need(len(v) == 2 and 0 < v[0] <= v[1] <= 1, f"dino.{key}: [min, max] in (0, 1], got {v}")
    return errors

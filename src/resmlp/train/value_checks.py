"""Checks of a training config that need more than a type and a range: the raw mapping's key types, and values
only a library can parse (timm's augmentation policies, teacher names) or the model section can say (its input
shape). resmlp.train.validation calls them; each returns its errors (or raises ConfigError for a malformed
mapping) naming the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resmlp.build import parse_model_name
from resmlp.data.sources import KINDS, NEEDS_ARGUMENT, PAPER_KINDS, parse_source
from resmlp.data.sources.remote import is_url
from resmlp.errors import ConfigError
from resmlp.train.sections import TrainConfig


def check_keys_are_strings(raw: dict[Any, Any]) -> None:
    """Every key of the recipe and its sections a string (YAML reads `1.5:` as a float, `~:` as None)."""
    sections = [("", raw)] + [(f"{k}.", v) for k, v in raw.items() if isinstance(k, str) and isinstance(v, dict)]
    bad = [f"{where}{key!r}" for where, values in sections for key in values if not isinstance(key, str)]
    if bad:
        raise ConfigError(f"invalid training config: key(s) {', '.join(bad[:5])} are not names; a recipe's keys are "
                          "words such as train or batch_size (quote a key that YAML reads as a number or null)")


# the optional experiment loggers (resmlp.reporting): train.<key> -> (the package it needs, its name for users)
LOGGER_PACKAGES = {"log_wandb": ("wandb", "Weights & Biases"), "log_mlflow": ("mlflow", "MLflow")}


def check_loggers(train: Any) -> list[str]:
    """An experiment logger switched on whose package is not installed: one line naming `pip install`."""
    return [f"train.{key}: {what} logging needs the {package} package, which is not installed: pip install {package}"
            for key, (package, what) in LOGGER_PACKAGES.items()
            if getattr(train, key) and not _installed(package)]


def _installed(package: str) -> bool:
    """Imported already (a test's stub included), or importable; None in sys.modules blocks an import."""
    import importlib.util
    import sys

    if package in sys.modules:
        return sys.modules[package] is not None
    return importlib.util.find_spec(package) is not None


def check_teacher(teacher: str) -> list[str]:
    """distill.teacher in the model grammar, a timm teacher one that timm knows."""
    import timm

    try:
        name = parse_model_name(teacher)
    except ValueError as e:
        return [f"distill.teacher: {e}"]
    return [f"distill.teacher: timm has no model {name.name!r}"] if name.kind == "timm" and not timm.is_model(
        name.name) else []


def input_shape(cfg: TrainConfig) -> tuple[int, int]:
    """(in_chans, img_size) of the model, (3, 0) when the model section can't say (_check_model reports why)."""
    try:
        return cfg.input_shape()
    except Exception:  # noqa: BLE001 (any malformed model section: reported by _check_model)
        return 3, 0


def check_auto_augment(policy: str) -> list[str]:
    """timm's parse of the policy string, here rather than when the first image is augmented."""
    from timm.data import create_transform

    try:
        create_transform(32, is_training=True, auto_augment=policy)
    except Exception as e:  # timm's parsers raise AssertionError, ValueError, KeyError... for malformed policies
        return [f"data.auto_augment: {policy!r} is not a timm policy string such as rand-m9-mstd0.5-inc1 "
                f"({type(e).__name__}: {e})"]
    return []


def once_per_key(range_errors: list[str], value_errors: list[str]) -> list[str]:
    """The value checks' errors on keys that the range check has not already named: one message per problem
    ('optim.lr=-1.0 ... is outside the allowed range' and not also 'optim.lr must be > 0')."""
    def key(error: str) -> str:  # 'optim.lr=-1.0 (from ...', 'optim.lr must be ...', 'data.ratio: ...'
        return error.split()[0].split("=")[0].rstrip(":")

    named = {key(e) for e in range_errors}
    return [e for e in value_errors if key(e) not in named]


def check_augmentation(d: Any) -> list[str]:
    """data.auto_augment (timm's parse) and data.pipeline: auto, device or timm, device only where it runs every
    training op the data section asks for (auto then takes timm's path: resmlp.data.loading.choice)."""
    if d.auto_augment is not None and (errors := check_auto_augment(d.auto_augment)):
        return errors
    if d.remode not in ("pixel", "rand", "const"):
        return [f"data.remode: {d.remode!r} is not one of pixel, rand, const (timm's random erasing modes)"]
    if (d.remode, d.recount) != ("pixel", 1) and (d.pipeline == "device" or d.batch_augment):
        return [f"data.remode={d.remode} / data.recount={d.recount} run in timm's per-image transform only (the "
                "batched and device paths erase one box of pixel noise, DeiT's default); set data.pipeline=timm (or "
                "auto) and data.batch_augment=false"]
    if d.pipeline not in ("auto", "device", "timm"):
        return [f"data.pipeline: {d.pipeline!r} is not one of auto, device, timm"]
    if d.pipeline != "device":
        return []
    from resmlp.data.device.pipeline import device_refusal

    refusal = device_refusal(d)
    return [refusal] if refusal else []


def check_source(d: Any) -> list[str]:
    """data.source in the grammar, or the older data.kind + data.dir, naming something that exists; the
    sources' own keys (class_map, epoch_length)."""
    errors = []
    if d.class_map is not None and not Path(d.class_map).is_file():
        errors.append(f"data.class_map: {d.class_map} does not exist or is not a file")
    if d.epoch_length is not None and not 0 < d.epoch_length <= 10**10:
        errors.append(f"data.epoch_length: training records per epoch, from 1 to 1e10, got {d.epoch_length}")
    return errors + _remote_errors(d) + _source_errors(d)


def _remote_errors(d: Any) -> list[str]:
    """The keys of URLs in wds:/hf: (resmlp.data.sources.remote)."""
    errors = []
    if not (isinstance(d.remote_retries, int) and 0 <= d.remote_retries <= 100):
        errors.append(f"data.remote_retries: tries after the first, from 0 to 100, got {d.remote_retries}")
    if not (isinstance(d.remote_timeout, (int, float)) and 0 < d.remote_timeout <= 3600):
        errors.append(f"data.remote_timeout: seconds, above 0 and at most 3600, got {d.remote_timeout}")
    if not (isinstance(d.remote_backoff, (int, float)) and 0 <= d.remote_backoff <= 60):
        errors.append(f"data.remote_backoff: seconds, from 0 to 60, got {d.remote_backoff}")
    if d.shard_errors not in ("skip", "stop"):
        errors.append(f"data.shard_errors: skip or stop, got {d.shard_errors!r}")
    if not (isinstance(d.cache_gb, (int, float)) and 0 < d.cache_gb <= 10**6):
        errors.append(f"data.cache_gb: above 0, got {d.cache_gb}")
    if d.endpoint_url is not None and not is_url(d.endpoint_url):
        errors.append(f"data.endpoint_url: an http:// or https:// URL, got {d.endpoint_url!r}")
    return errors


def _source_errors(d: Any) -> list[str]:
    if d.source is not None:
        if d.dir is not None:
            return [f"data.source={d.source} and data.dir={d.dir}: name the data once, in data.source (--data)"]
        try:
            spec = parse_source(d.source)
        except ConfigError as e:
            return [f"data.source: {e}"]
        local = spec.kind in ("folder", "hf", "cifar10", "cifar100", "fashion-mnist", *PAPER_KINDS) \
            and spec.arg is not None and not is_url(spec.arg)
        return [f"data.source: {spec.arg} does not exist"] if local and not Path(spec.arg).exists() else []
    if d.kind not in KINDS:
        return [f"data.kind: {d.kind!r} is not one of {', '.join(KINDS)}"]
    if d.dir is not None:
        ok = d.kind == "wds" or (Path(d.dir).exists() if d.kind in ("hf", "imagenet21k") else Path(d.dir).is_dir())
        return [] if ok else [f"data.dir: {d.dir} does not exist or is not a folder"]
    if d.kind in NEEDS_ARGUMENT:
        return [f"data.dir: the {d.kind} dataset needs a folder (--data-dir DIR, or --data {d.kind}:DIR)"]
    return []


def dino_warmup_hint(cfg: Any) -> str:
    """Said with a too-long schedule.warmup_epochs of a DINO run whose teacher-temperature warm-up also outlasts
    it (a smoke run, --epochs 1, of a DINO recipe): the second flag, so one message names both."""
    warm = cfg.dino.warmup_teacher_temp_epochs
    if cfg.task_name != "dino" or warm < cfg.schedule.epochs:
        return ""
    return (f"; the teacher-temperature warm-up (dino.warmup_teacher_temp_epochs={warm}) also outlasts the run: "
            "for a smoke run add --set dino.warmup_teacher_temp_epochs=0 too (e.g. --epochs 1 --warmup-epochs 0 "
            "--set dino.warmup_teacher_temp_epochs=0)")

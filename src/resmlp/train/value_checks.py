"""Checks of a training config that need more than a type and a range: the raw mapping's key types, and values
only a library can parse (timm's augmentation policies, teacher names) or the model section can say (its input
shape). resmlp.train.validation calls them; each returns its errors (or raises ConfigError for a malformed
mapping) naming the key.
"""

from __future__ import annotations

from typing import Any

from resmlp.build import parse_model_name
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

"""Training configuration: recipe YAML + overrides -> a validated `TrainConfig`, checked before any work.

Sections and keys (see the recipes in resmlp/recipes/*.yaml for documented examples):
task (supervised, distillation, finetune or dino; inferred when unset), model (`name` in the one model grammar
of resmlp.build -- a preset plus any ResMLPConfig field, timm:NAME / torchvision:NAME plus constructor
arguments, or a checkpoint file to fine-tune), data, optim, schedule, loss, train, and the distill, finetune
and dino sections. `parse_overrides` is the project's one parser of `key=value` overrides.
"""

from __future__ import annotations

import difflib
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from resmlp.train.sections import SECTIONS, TRAINING_FIELDS, TrainConfig
from resmlp.train.validation import validate

# the names other modules import from here
__all__ = ["RECIPES", "TRAINING_FIELDS", "TrainConfig", "load_config", "parse_overrides", "recipe_path"]

# every YAML file shipped in resmlp/recipes is a recipe, by its file name
RECIPES = tuple(sorted(p.name.removesuffix(".yaml") for p in (resources.files("resmlp") / "recipes").iterdir()
                       if p.name.endswith(".yaml")))


def recipe_path(name_or_path: str | Path) -> Path:
    """A shipped recipe by name, or a YAML file path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise FileNotFoundError(f"recipe file {path} does not exist")
        return path
    if str(name_or_path) not in RECIPES:
        close = difflib.get_close_matches(str(name_or_path), RECIPES, n=2)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise ValueError(f"unknown recipe {name_or_path!r}; {hint}recipes: {', '.join(RECIPES)}, "
                         "or a path to a .yaml file")
    return Path(str(resources.files("resmlp") / "recipes" / f"{name_or_path}.yaml"))


def load_config(recipe: str | Path | dict | TrainConfig = "fashion-mnist-quick",
                overrides: dict[str, Any] | list[str] | None = None) -> TrainConfig:
    """Recipe (name, YAML path, dict or TrainConfig) + overrides ({"optim.lr": 1e-3} or ["optim.lr=1e-3"])."""
    if isinstance(recipe, TrainConfig):
        raw, name = recipe.to_dict(), recipe.recipe
    elif isinstance(recipe, dict):
        raw, name = dict(recipe), recipe.get("recipe", "custom")
    else:
        path = recipe_path(recipe)
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: a recipe is a mapping of sections (model, data, optim, ...)")
        name = str(recipe) if str(recipe) in RECIPES else path.stem
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for dotted, value in parse_overrides(overrides).items():
        section, _, key = dotted.partition(".")
        if dotted == "task":
            raw["task"] = value
            continue
        if not key:
            raise ValueError(f"override {dotted!r} must be section.key=value, e.g. optim.lr=1e-3")
        if section not in raw:
            raw[section] = {}
        if not isinstance(raw[section], dict):
            raise ValueError(f"{section} is not a section; sections: model, {', '.join(SECTIONS)}")
        raw[section][key] = value
    raw.setdefault("recipe", name)
    return validate(raw)


def parse_overrides(overrides: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    """`--set` strings 'section.key=value' (value parsed as YAML) or a dict, as {dotted key: value}."""
    if not overrides:
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    out = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. --set optim.lr=1e-3")
        out[key.strip()] = yaml.safe_load(value)
    return out


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

from resmlp.errors import ConfigError
from resmlp.train.sections import SECTIONS, TRAINING_FIELDS, TrainConfig
from resmlp.train.validation import validate

# the names other modules import from here
__all__ = ["RECIPES", "TRAINING_FIELDS", "TrainConfig", "default_recipe_notice", "load_config", "parse_overrides",
           "recipe_path"]

# a recipe is a small document: the shipped ones are under 4 KiB, 4 levels deep and a few hundred values
MAX_RECIPE_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_VALUES = 100_000  # counted with every alias expanded: a "billion laughs" document stops here

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
                overrides: dict[str, Any] | list[str] | None = None, check_memory: bool = True) -> TrainConfig:
    """Recipe (name, YAML path, dict or TrainConfig) + overrides ({"optim.lr": 1e-3} or ["optim.lr=1e-3"]);
    check_memory=False: validation does not refuse a run for this machine's memory (resmlp.train.dry_run)."""
    if isinstance(recipe, TrainConfig):
        raw, name, origin = recipe.to_dict(), recipe.recipe, "the config given"
    elif isinstance(recipe, dict):
        raw, name, origin = dict(recipe), recipe.get("recipe", "custom"), "the config given"
    else:
        path = recipe_path(recipe)
        if path.stat().st_size > MAX_RECIPE_BYTES:
            raise ConfigError(f"recipe {path}: {path.stat().st_size} bytes; a recipe is a small document "
                              f"(at most {MAX_RECIPE_BYTES} bytes)")
        raw = load_yaml(path.read_text(), f"recipe {path}") or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: a recipe is a mapping of sections (model, data, optim, ...)")
        name = str(recipe) if str(recipe) in RECIPES else path.stem
        origin = f"recipe {recipe}"
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    sources = {f"{section}.{key}": origin for section, values in raw.items() if isinstance(values, dict)
               for key in values}
    recipe_model = raw["model"].get("name") if isinstance(raw.get("model"), dict) else None
    for dotted, value in parse_overrides(overrides).items():
        section, _, key = dotted.partition(".")
        sources[dotted] = "the overrides (a flag or --set)"
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
    if isinstance(raw.get("model"), dict) and isinstance(raw["model"].get("name"), str):
        from resmlp.build import canonical_name

        raw["model"]["name"] = canonical_name(raw["model"]["name"])  # DeiT's resmlp_12 -> resmlp_s12
    _drop_keys_of_another_model(raw, sources, recipe_model, origin)
    _normalise_as_the_checkpoint(raw)
    return validate(raw, sources, check_memory)


def default_recipe_notice(recipe: str, overrides: dict[str, Any]) -> str | None:
    """The one line said when `resmlp train` runs its default recipe (Fashion-MNIST's quickstart, 28-px
    grayscale) on other data without the user choosing the model's input: an RGB folder would otherwise be
    trained as 28-px grayscale without a word (issue 50 item 7). None where nothing was assumed."""
    from resmlp.data.sources import parse_source

    if any(key in overrides for key in ("model.in_chans", "model.img_size")):
        return None
    source = overrides.get("data.source")
    kind = parse_source(source).kind if isinstance(source, str) and source else overrides.get("data.kind")
    if kind in (None, "fashion-mnist", "synthetic"):  # the recipe's own data, or data made at the model's input
        return None
    model = load_config(recipe, overrides, False).model
    return (f"note: no --recipe, so {source or kind} trains with {recipe}'s input: {model['img_size']}x"
            f"{model['img_size']} px, {model['in_chans']} channel(s) (colour images are converted to grayscale); "
            "for colour at 64 px add --input-size 3 64 64, or pass --recipe deit for ImageNet-scale training")


def _normalise_as_the_checkpoint(raw: dict[str, Any]) -> None:
    """A run that starts from a checkpoint normalises its images as the checkpoint was trained, unless the
    recipe or the user sets data.mean/std: the statistics in the file's metadata (written by every training
    run), else ImageNet's (timm's and DeiT's files, whose ImageNet training used them; DeiT fine-tunes with them)."""
    from resmlp.build import model_input, parse_model_name
    from resmlp.checkpoint import read_metadata
    from resmlp.models.registry import IMAGENET_MEAN, IMAGENET_STD

    model, data = raw.get("model"), raw.get("data")
    if not (isinstance(model, dict) and isinstance(data, dict)) or data.get("mean") or data.get("std"):
        return
    try:
        name = parse_model_name(model.get("name", ""))
        if name.kind != "file" or not Path(name.name).is_file():
            return
        pre = read_metadata(name.name).get("preprocess")
        mean, std = ((pre.get("mean"), pre.get("std")) if isinstance(pre, dict) else (IMAGENET_MEAN, IMAGENET_STD))
        in_chans = model_input(name)[0]
    except ValueError:
        return  # validation names the problem with the file
    if isinstance(mean, (list, tuple)) and isinstance(std, (list, tuple)) and len(mean) == len(std) == in_chans:
        data["mean"], data["std"] = list(mean), list(std)


def _drop_keys_of_another_model(raw: dict[str, Any], sources: dict[str, str], recipe_model: Any,
                                origin: str) -> None:
    """When the overrides replace the recipe's model (--model timm:resnet10t on a ResMLP recipe), the recipe's
    model keys that the new model does not take are dropped, with a one-line note; keys the user gave are kept
    (validation refuses those that do not fit, naming them)."""
    import warnings

    from resmlp.build import keys_not_applying, parse_model_name

    model = raw.get("model")
    if not isinstance(model, dict) or model.get("name") == recipe_model or "name" not in model:
        return
    try:
        name = parse_model_name(model["name"])
    except ValueError:
        return  # validation names the problem
    from_recipe = [k for k in model if k != "name" and sources.get(f"model.{k}") == origin]
    dropped = keys_not_applying(name, from_recipe)
    for key in dropped:
        del model[key]
    if dropped and _exists(name):  # a typo'd name: validation's error is the one line to see, no note first
        warnings.warn(f"model {name}: model keys {', '.join(dropped)} of {origin} (written for {recipe_model}) do "
                      "not apply to it and are dropped", stacklevel=3)


def _exists(name: Any) -> bool:
    """Whether the model a name names is there to build (its library knows it, its file exists)."""
    if name.kind == "timm":
        import timm

        return timm.is_model(name.name)
    if name.kind == "torchvision":
        import torchvision

        return name.name in torchvision.models.list_models(module=torchvision.models)
    return name.kind != "file" or Path(name.name).is_file()


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
        out[key.strip()] = load_yaml(value, f"--set {key.strip()}")
    return out


def load_yaml(text: str, source: str) -> Any:
    """YAML as PyYAML's safe loader reads it, refused when it nests deeper than MAX_YAML_DEPTH or expands
    (aliases included) to more than MAX_YAML_VALUES values, before anything is built from it."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_size(node, source)
        return loader.construct_document(node)
    except RecursionError:  # the composer recurses once per level: a deeper document than Python's stack
        raise ConfigError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels; a recipe is a small "
                          "document of sections and keys") from None
    finally:
        loader.dispose()


def _check_yaml_size(root: yaml.Node, source: str) -> None:
    """Walk the node graph as a tree (an alias is walked each time it is used), iteratively, with bounds."""
    stack, seen = [(root, 1)], 0
    while stack:
        node, depth = stack.pop()
        seen += 1
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{source}: nested deeper than {MAX_YAML_DEPTH} levels; a recipe is a small "
                              "document of sections and keys")
        if seen > MAX_YAML_VALUES:
            raise ConfigError(f"{source}: expands to more than {MAX_YAML_VALUES} values (YAML aliases?); a recipe "
                              "is a small document of sections and keys")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend((part, depth + 1) for pair in node.value for part in pair)


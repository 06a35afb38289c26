"""`--dry-run` of train / finetune / pretrain dino: check a recipe without running it, as one checks `deit` or
`dino-imagenet` on a login node before a cluster job.

It validates the config as the run would, builds the model on the meta device (no memory, no weights read),
and reports the resolved config, the memory estimate the run is refused by (resmlp.train.memory) and the
effective batch. It reads no images and creates no folder: the dataset's size, its classes (for a folder whose
DIR/train is absent) and the teacher's weights are left to the run, and the report says so. A data.dir that
does not exist here (ImageNet on a login node) is noted, not refused.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from resmlp.data.records import SourceSpec
from resmlp.data.sources import parse_source
from resmlp.errors import ConfigError
from resmlp.runtime import adopt_slurm_ranks, env_int, training_device_memory_bytes
from resmlp.train import memory
from resmlp.train.sections import TrainConfig

# the released datasets' class counts (iNaturalist at DeiT's species level; ImageNet-21k: fall11's synsets)
FIXED_CLASSES = {"fashion-mnist": 10, "cifar10": 10, "cifar100": 100, "imagenetv2": 1000, "flowers102": 102,
                 "stanford-cars": 196, "inat2018": 8142, "inat2019": 1010, "imagenet21k": 21841}
ASSUMED_CLASSES = 1000  # ImageNet's, the dataset of the full-size recipes


def dry_run(load: Callable[[dict[str, Any]], TrainConfig], data_dir: str | None, resume: bool = False) -> str:
    """The report of a dry run. `load(extra)` validates the run's config with extra overrides (without the
    memory refusal); `data_dir` is the data.dir the user gave or the recipe holds (None: none); `resume`: the
    run would continue a state file (not read here)."""
    adopt_slurm_ranks()  # the processes of a SLURM job step, as the run counts them
    cfg, unchecked = _validated(load, data_dir)
    processes = env_int("WORLD_SIZE", 1, 1)
    t = cfg.train
    if t.batch_size % (processes * t.grad_accum):
        raise ConfigError(f"train.batch_size={t.batch_size} (global) must be divisible by processes x grad_accum = "
                          f"{processes} x {t.grad_accum}")
    classes, classes_note = _classes(cfg)
    model, params = _meta_model(cfg, classes)
    per_process = t.batch_size // (processes * t.grad_accum)
    lines = [yaml.safe_dump(_sections_in_use_first(cfg), sort_keys=False).rstrip(),
             f"dry run of recipe {cfg.recipe} (task {cfg.task_name}): nothing trained, no folder created",
             f"  model:            {cfg.model['name']} built on the meta device: {params / 1e6:.2f} M parameters, "
             f"{classes} classes ({classes_note})",
             f"  effective batch:  {t.batch_size} = {per_process} per process x {processes} process"
             f"{'es' if processes > 1 else ''} x {t.grad_accum} accumulation step{'s' if t.grad_accum > 1 else ''}"
             " (processes: WORLD_SIZE, or SLURM_NTASKS under srun; set it to check another launch)",
             f"  memory estimate:  {_memory_line(cfg, model, per_process)}"]
    if cfg.distill.teacher:
        unchecked.append(f"the teacher {cfg.distill.teacher}'s weights and outputs (read at the start of the run)")
    unchecked.append("the images themselves, the dataset's size and steps per epoch (read at the start of the run)")
    if cfg.data.pipeline == "auto":
        unchecked.append("which data path trains: data.pipeline auto measures the device path against timm's on the "
                         "run's device before its first step (a few seconds; docs/training.md)")
    if resume:
        unchecked.append("the state file the run would resume and whether its settings agree (read at its start)")
    return "\n".join(lines + [f"  not checked:      {item}" for item in unchecked])


# the sections only some tasks read; the others (model, data, optim, schedule, loss, train) every task reads
TASK_SECTIONS = {"supervised": (), "distillation": ("distill",), "finetune": ("finetune",), "dino": ("dino",)}


def _sections_in_use_first(cfg: TrainConfig) -> dict[str, Any]:
    """The resolved config with the task's own section first, then the ones every task reads; the sections the
    task does not read (their defaults) last, under their own heading."""
    config = cfg.to_dict()
    used = [*TASK_SECTIONS[cfg.task_name], *(["distill"] if cfg.distill.teacher else [])]
    unused = [name for names in TASK_SECTIONS.values() for name in names if name not in used]
    head = {k: config[k] for k in ("recipe", "task", "model")}
    ordered = {**head, **{k: config[k] for k in dict.fromkeys(used)},
               **{k: v for k, v in config.items() if k not in head and k not in used and k not in unused}}
    if cfg.task_name == "dino":  # DINO's loss is its own (the dino section): loss.label_smoothing is not read
        unused = ["loss", *unused]
        ordered.pop("loss")
    return {"resolved config": ordered,
            f"not used by the {cfg.task_name} task (defaults)": {k: config[k] for k in dict.fromkeys(unused)}}


def recipe_data_dir(recipe: str | Path | dict | TrainConfig, given: str | None) -> str | None:
    """data.dir as the run will see it: the one given on the command line, else the recipe's."""
    if given is not None or isinstance(recipe, TrainConfig):
        return given if given is not None else recipe.data.dir
    if isinstance(recipe, dict):
        data = recipe.get("data")
    else:
        from resmlp.train.config import load_yaml, recipe_path

        raw = load_yaml(recipe_path(recipe).read_text(), f"recipe {recipe}")
        data = raw.get("data") if isinstance(raw, dict) else None
    return data.get("dir") if isinstance(data, dict) and isinstance(data.get("dir"), str) else None


def _validated(load: Callable[[dict[str, Any]], TrainConfig], data_dir: str | None) -> tuple[TrainConfig, list[str]]:
    """The config validated as the run validates it; a data.dir absent from this machine is replaced by an
    empty folder for validation only, and named in the report instead."""
    try:
        return load({}), []
    except ConfigError as e:
        if "data.dir:" not in str(e):
            raise
    with tempfile.TemporaryDirectory(prefix="resmlp-dry-run-") as stand_in, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first try printed the config's notes already
        cfg = load({"data.dir": stand_in})
    cfg.data.dir = data_dir
    where = f"data.dir {data_dir} does not exist here" if data_dir else "no data.dir given (--data-dir DIR)"
    return cfg, [f"the dataset: {where}; the run refuses that until it does"]


def _classes(cfg: TrainConfig) -> tuple[int, str]:
    """The run's number of classes without reading images: the model section's, the source's (data.source, as
    the run reads it: --data wins over the recipe's data.kind and data.dir), a folder's class map or class
    folders, else ImageNet's (assumed)."""
    d = cfg.data
    if "num_classes" in cfg.model:
        return int(cfg.model["num_classes"]), "model.num_classes"
    spec = parse_source(d.source) if d.source else SourceSpec(d.kind, d.dir)
    if spec.kind == "synthetic":
        return d.synthetic_classes, "data.synthetic_classes"
    if spec.kind in FIXED_CLASSES:
        return FIXED_CLASSES[spec.kind], f"the {spec.kind} dataset's"
    if spec.kind == "folder" and spec.arg and Path(spec.arg).is_dir():
        return _folder_classes(Path(spec.arg), d.class_map)
    return ASSUMED_CLASSES, "assumed, ImageNet's: the run takes them from the data"


def _folder_classes(root: Path, class_map: str | None) -> tuple[int, str]:
    """A folder's classes as the run counts them: its class map, else the class folders of its first split."""
    from resmlp.data.sources.imagenet import class_folders, read_class_map, split_folders

    if class_map:
        return len(read_class_map(class_map)), f"the class map {class_map}"
    folders = split_folders(root)
    first = folders.get("train") or next(iter(folders.values()), None)
    found = class_folders(first) if first else []
    if not found:
        return ASSUMED_CLASSES, f"assumed, ImageNet's: {root} has no split folder with class folders"
    return len(found), f"the class folders of {first}"


def _meta_model(cfg: TrainConfig, classes: int) -> tuple[torch.nn.Module | None, int]:
    """The run's model built on the meta device (no memory, no weights read) and its parameter count."""
    from resmlp.build import _file_config, build_model_for_input
    from resmlp.complexity import count_params
    from resmlp.models.resmlp import ResMLP

    name = cfg.model_name
    in_chans, img_size = cfg.input_shape()
    config = _file_config(name.name) if name.kind == "file" else None  # timm's and DeiT's files: read, on the CPU
    if name.kind == "file" and config is None:  # a timm/torchvision model's file: built when the run reads it
        return None, 0
    with torch.device("meta"):
        if name.kind == "preset":
            model = ResMLP(cfg.model_config(classes))
        elif name.kind == "file":
            model = ResMLP(dataclasses.replace(config, num_classes=classes, img_size=img_size))
        else:
            model = build_model_for_input(name, num_classes=classes, img_size=img_size,
                                          **{"in_chans": in_chans, **cfg.constructor_overrides})
    return model, count_params(model)


def _size(count: int) -> str:
    return f"{count / 2**30:.1f} GiB" if count >= 2**30 else f"{count / 2**20:.1f} MiB"


def _memory_line(cfg: TrainConfig, model: torch.nn.Module | None, per_process: int) -> str:
    config = getattr(model, "config", None)
    if config is None:
        return (f"none for {cfg.model['name']}: the estimate covers ResMLP and Mixer models (their activations are "
                "known from the sizes alone)")
    need = memory.training_need_bytes(cfg, config, per_process)
    have = training_device_memory_bytes(cfg.train.device)
    here = "unknown" if have is None else f"{have / 2**30:.1f} GiB, so it fits" if need <= have else (
        f"{have / 2**30:.1f} GiB, so it does NOT fit: the run would be refused here; spread the batch over more "
        "processes (check with WORLD_SIZE=N) or raise train.grad_accum")
    extra = ", DINO head and crops" if cfg.task_name == "dino" else ""
    teacher = "; the teacher's memory not included" if cfg.distill.teacher else ""
    return (f"at least {_size(need)} per process at {per_process} images per pass (weights, optimizer "
            f"state, activations, the confusion matrix{extra}{teacher}); this machine's {cfg.train.device} device: "
            f"{here}")

"""Training configuration: recipe YAML + overrides -> a validated `TrainConfig`, checked before any work.

Sections and keys (see the recipes in resmlp/recipes/*.yaml for documented examples):
task (supervised, distillation, finetune or dino; inferred when unset), model (`name` in the one model grammar
of resmlp.build -- a preset plus any ResMLPConfig field, timm:NAME / torchvision:NAME plus constructor
arguments, or a checkpoint file to fine-tune), data, optim, schedule, loss, train, and the distill, finetune
and dino sections. `parse_overrides` is the project's one parser of `key=value` overrides.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from resmlp.build import ModelName, model_input, parse_model_name
from resmlp.data import KINDS
from resmlp.models.registry import model_config
from resmlp.models.resmlp import ResMLPConfig

TASKS = ("supervised", "distillation", "finetune", "dino")
# ResMLPConfig fields that are training hyper-parameters: a fine-tuning run may set them, its checkpoint not
TRAINING_FIELDS = ("drop_rate", "drop_path_rate")


@dataclass
class DataConfig:
    kind: str = "fashion-mnist"  # fashion-mnist | folder | cifar10 | cifar100 | synthetic
    dir: str | None = None  # None: the kind's default location (Fashion-MNIST: the Debian package)
    mean: list[float] | None = None  # None: the dataset's statistics (ImageNet's for folders)
    std: list[float] | None = None
    crop_pct: float = 0.875  # evaluation: resize to img_size / crop_pct, then center-crop
    # validation images carved from train for kinds without a val split (Fashion-MNIST, CIFAR): class-stratified,
    # seeded; model selection uses them, the test split is scored once at the end. 0: validate on test (flagged)
    val_size: int = 5000
    val_seed: int = 0
    test_dir: str | None = None  # folder kind: the test images (DIR/test by default, when it exists)
    interpolation: str = "bicubic"
    scale: list[float] = field(default_factory=lambda: [0.08, 1.0])  # RandomResizedCrop area range
    ratio: list[float] = field(default_factory=lambda: [0.75, 1.3333333])
    hflip: float = 0.5
    color_jitter: float = 0.0
    auto_augment: str | None = None  # e.g. rand-m9-mstd0.5-inc1 (RandAugment)
    reprob: float = 0.0  # random erasing probability
    mixup: float = 0.0  # Mixup alpha (0: off)
    cutmix: float = 0.0  # CutMix alpha (0: off)
    repeated_aug: int = 0  # repeats per image (RepeatAugSampler); 0 or 1: off
    num_workers: int = 2
    # in-memory datasets (fashion-mnist, cifar, synthetic) without auto_augment/color_jitter: crop, flip and
    # erase whole batches in the training process (resmlp.data.batch_augment); false: timm's per-image transform
    batch_augment: bool = True
    synthetic_size: list[int] = field(default_factory=lambda: [256, 64])  # train, val (kind: synthetic)
    synthetic_classes: int = 4
    permute: str = "none"  # none | patch | global: one fixed pixel permutation on train and val (resmlp.data.permute)
    permute_patch: int = 4  # patch mode: patch side in pixels (use the model's patch size)
    permute_seed: int = 0


@dataclass
class OptimConfig:
    name: str = "lamb"  # lamb | sgd | adamw
    lr: float = 5e-3
    reference_batch: int | None = None  # lr belongs to this global batch; scaled linearly. None: as is
    weight_decay: float = 0.05
    momentum: float = 0.9  # sgd only
    layer_decay: float | None = None  # layer-wise lr decay (e.g. 0.75, fine-tuning); None: off


@dataclass
class ScheduleConfig:
    name: str = "cosine"  # cosine | step
    epochs: int = 300
    warmup_epochs: float = 5
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    decay_epochs: float = 30  # step only: multiply lr by decay_rate every decay_epochs
    decay_rate: float = 0.1


@dataclass
class LossConfig:
    label_smoothing: float = 0.0


@dataclass
class DistillConfig:
    teacher: str | None = None  # a model name (resmlp.build): checkpoint file, timm:NAME, torchvision:NAME
    type: str = "hard"  # hard (DeiT's: teacher argmax as a second label) | soft (KL at temperature tau)
    alpha: float = 0.5  # soft: weight of the KL term
    tau: float = 1.0  # soft: temperature
    weights: str | None = None  # weights file for a timm:/torchvision: teacher
    allow_random_teacher: bool = False  # a timm:/torchvision: teacher without weights is refused unless this is set
    # keep each distinct training image's teacher output (in memory, keyed by its pixels): pays off when the
    # augmentation yields few distinct images (no crops, erasing, Mixup/CutMix, RandAugment; flips allowed)
    cache: bool = False


@dataclass
class FinetuneConfig:  # used when model.name is a checkpoint file (ours, timm's, DeiT's, a DINO backbone)
    img_size: int | None = None  # new input resolution (cross-patch weights resized); None: the checkpoint's
    freeze: int | str | None = None  # N: freeze the stem and the first N blocks; all-but-head; None: train all


@dataclass
class DinoConfig:
    out_dim: int = 4096  # DINO head output (prototypes)
    hidden_dim: int = 512
    bottleneck_dim: int = 128
    norm_last_layer: bool = True
    num_local: int = 4  # local crops (resized to the global size, see resmlp.train.dino)
    global_scale: list[float] = field(default_factory=lambda: [0.4, 1.0])
    local_scale: list[float] = field(default_factory=lambda: [0.05, 0.4])
    local_size: int | None = None  # crop size before resizing to the global size; None: 3/7 of it
    teacher_temp: float = 0.04
    warmup_teacher_temp: float = 0.04
    warmup_teacher_temp_epochs: int = 0
    student_temp: float = 0.1
    center_momentum: float = 0.9
    momentum_teacher: float = 0.996  # EMA momentum at the start; cosine to 1.0 at the end
    weight_decay_end: float | None = 0.4  # cosine from optim.weight_decay to this (DINO); None: constant
    freeze_last_layer_epochs: int = 1
    knn_k: int = 20
    knn_temperature: float = 0.07


@dataclass
class TrainSection:
    batch_size: int = 256  # GLOBAL batch (all processes, all accumulation steps)
    grad_accum: int = 1
    clip_grad: float | None = None
    amp: str = "auto"  # auto (bf16 where the hardware has it) | bf16 | fp16 (GPU, with a scaler) | none
    # auto: compile when the measured eager step says the rest of the run pays for it (resmlp.train.step);
    # true / false force it (set one of them for runs that must repeat bit for bit)
    compile: bool | str = "auto"
    log_every_steps: int = 0  # read the loss on the host every N steps; 0: every half second
    channels_last: bool = False
    # the fused training step of the paper's block (resmlp.models.fused_block): same arithmetic, fewer
    # passes over memory; false runs the plain blocks (for comparison or debugging)
    fused_step: bool = True
    ema: bool = False  # evaluate and save an exponential moving average of the weights
    ema_decay: float = 0.99996
    seed: int = 0
    deterministic: bool = False
    checkpoint_every_steps: int = 0  # 0: only at the end of each epoch
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int | None = None  # CPU threads for compute (torch.set_num_threads); None: torch's default
    progress: bool = True


@dataclass
class TrainConfig:
    recipe: str = "custom"
    task: str | None = None  # one of TASKS; None: finetune for a checkpoint model, distillation with a teacher
    model: dict[str, Any] = field(default_factory=lambda: {"name": "resmlp_s12"})
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainSection = field(default_factory=TrainSection)
    distill: DistillConfig = field(default_factory=DistillConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    dino: DinoConfig = field(default_factory=DinoConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def model_name(self) -> ModelName:
        """model.name parsed by the one model grammar (resmlp.build)."""
        return parse_model_name(self.model["name"])

    @property
    def model_overrides(self) -> dict[str, Any]:
        """The model section's keys besides name: ResMLPConfig fields or timm constructor arguments."""
        return {k: v for k, v in self.model.items() if k != "name"}

    def model_config(self, num_classes: int | None = None) -> ResMLPConfig:
        """The ResMLPConfig of a preset `model` (preset + overrides); num_classes from the data unless given."""
        overrides = self.model_overrides
        if num_classes is not None:
            overrides.setdefault("num_classes", num_classes)
        return model_config(self.model["name"], **overrides)

    @property
    def task_name(self) -> str:
        """`task`, or inferred: finetune for a checkpoint model, distillation with a teacher, else supervised."""
        if self.task is not None:
            return self.task
        if self.model_name.kind == "file":
            return "finetune"
        return "distillation" if self.distill.teacher else "supervised"

    def input_shape(self) -> tuple[int, int]:
        """(in_chans, img_size) the model takes; a fine-tuning run at finetune.img_size."""
        in_chans, img_size = model_input(self.model_name, self.model_overrides)
        return in_chans, self.finetune.img_size or img_size


SECTIONS = {"data": DataConfig, "optim": OptimConfig, "schedule": ScheduleConfig, "loss": LossConfig,
            "train": TrainSection, "distill": DistillConfig, "finetune": FinetuneConfig, "dino": DinoConfig}
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


def validate(raw: dict[str, Any]) -> TrainConfig:
    """Check every section, key, type and value; raise one ValueError listing all problems."""
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
    cfg = TrainConfig(recipe=str(raw.get("recipe", "custom")), task=task, model=dict(model), **sections)
    errors += _check_values(cfg)  # on the well-typed keys, so one run reports every problem
    if errors:
        raise ValueError("invalid training config:\n  " + "\n  ".join(errors))
    return cfg


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
    if name.kind == "preset":
        try:
            cfg.model_config()
        except (ValueError, TypeError) as e:
            return [f"model: {e}"]
    if name.kind == "file":
        if not Path(name.name).is_file():
            return [f"model.name: checkpoint {name.name} does not exist"]
        extra = sorted(set(cfg.model_overrides) - set(TRAINING_FIELDS))
        if extra:
            return [f"model: a checkpoint start takes only {', '.join(TRAINING_FIELDS)} besides name (its architecture "
                    f"comes from the file), not {', '.join(extra)}; for a new resolution set finetune.img_size"]
    if cfg.task_name == "finetune" and name.kind != "file":
        return [f"task finetune starts from a checkpoint: model.name must be a checkpoint file, not {name}"]
    if cfg.task_name == "distillation" and not cfg.distill.teacher:
        return ["task distillation needs distill.teacher (a checkpoint file, timm:NAME or torchvision:NAME)"]
    return []


def _check_values(cfg: TrainConfig) -> list[str]:
    errors = []
    d, o, s, t = cfg.data, cfg.optim, cfg.schedule, cfg.train

    def need(cond: bool, msg: str) -> None:
        if not cond:
            errors.append(msg)

    errors += _check_model(cfg)
    need(d.kind in KINDS, f"data.kind: {d.kind!r} is not one of {', '.join(KINDS)}")
    if d.dir is not None:
        need(Path(d.dir).is_dir(), f"data.dir: {d.dir} does not exist or is not a folder")
    elif d.kind in ("folder", "cifar10", "cifar100"):
        errors.append(f"data.dir: the {d.kind} dataset needs a folder (--data-dir DIR)")
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
    if d.auto_augment is not None:
        need(d.auto_augment.startswith(("rand", "augmix", "original", "v0", "3a")),
             f"data.auto_augment: {d.auto_augment!r} is not a timm policy string such as rand-m9-mstd0.5-inc1")
    need(o.name in ("lamb", "sgd", "adamw"), f"optim.name: {o.name!r} is not one of lamb, sgd, adamw")
    need(o.lr > 0, f"optim.lr must be > 0, got {o.lr}")
    need(o.reference_batch is None or o.reference_batch > 0, "optim.reference_batch must be > 0 or null")
    need(o.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {o.weight_decay}")
    need(s.name in ("cosine", "step"), f"schedule.name: {s.name!r} is not one of cosine, step")
    need(s.epochs >= 1, f"schedule.epochs must be >= 1, got {s.epochs}")
    need(0 <= s.warmup_epochs < s.epochs,
         f"schedule.warmup_epochs is {s.warmup_epochs}, which must be in [0, schedule.epochs = {s.epochs}); "
         f"set a shorter warm-up with --warmup-epochs N (= --set schedule.warmup_epochs=N)")
    need(s.decay_epochs > 0, f"schedule.decay_epochs must be > 0, got {s.decay_epochs}")
    need(0 <= cfg.loss.label_smoothing < 1, f"loss.label_smoothing must be in [0, 1), got {cfg.loss.label_smoothing}")
    need(t.batch_size >= 1, f"train.batch_size must be >= 1, got {t.batch_size}")
    need(t.grad_accum >= 1, f"train.grad_accum must be >= 1, got {t.grad_accum}")
    need(t.clip_grad is None or t.clip_grad > 0, "train.clip_grad must be > 0 or null")
    need(t.amp in ("auto", "bf16", "fp16", "none"), f"train.amp: {t.amp!r} is not one of auto, bf16, fp16, none")
    need(t.threads is None or t.threads >= 1, f"train.threads must be >= 1 or null, got {t.threads}")
    need(0 < t.ema_decay < 1, f"train.ema_decay must be in (0, 1), got {t.ema_decay}")
    need(t.checkpoint_every_steps >= 0, "train.checkpoint_every_steps must be >= 0")
    need(t.log_every_steps >= 0, f"train.log_every_steps must be >= 0 (0: every half second), got {t.log_every_steps}")
    need(t.compile in (True, False, "auto", "true", "false"),
         f"train.compile: {t.compile!r} is not one of auto, true, false")
    need(o.layer_decay is None or 0 < o.layer_decay <= 1, f"optim.layer_decay must be in (0, 1], got {o.layer_decay}")
    need(t.device == "auto" or t.device == "cpu" or t.device.startswith("cuda"),
         f"train.device: {t.device!r} is not auto, cpu, cuda or cuda:N")
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
    need(0 <= dn.momentum_teacher < 1, f"dino.momentum_teacher must be in [0, 1), got {dn.momentum_teacher}")
    for key in ("global_scale", "local_scale"):
        v = getattr(dn, key)
        need(len(v) == 2 and 0 < v[0] <= v[1] <= 1, f"dino.{key}: [min, max] in (0, 1], got {v}")
    return errors

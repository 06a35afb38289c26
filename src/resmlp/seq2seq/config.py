"""The options of a translation run (`TranslationConfig`), each checked for type and range before anything runs.

One check for every way a config arrives: `resmlp translate train` flags, the library, and a run folder's
config.json (`from_dict`: known keys, exact JSON types). Each message names the flag and the allowed values, as
the image side's `train.validation.RANGES` do. `check_resumable` refuses a resume whose options differ from the
run's beyond what a resume may change, as `train.state.check_resumable` does for the image trainer.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from resmlp.errors import ConfigError
from resmlp.seq2seq.decoding import MAX_BEAM, check_beam
from resmlp.seq2seq.model import ARCHS, LIMITS, PRESETS, Seq2SeqConfig, translation_model_config
from resmlp.seq2seq.tasks import TASKS

# fp32: no autocast; bf16: CPU or GPU autocast; fp16: GPU autocast with loss scaling; auto: runtime.resolve_amp
PRECISIONS = ("fp32", "bf16", "fp16", "auto")
OPTIMIZERS = ("adagrad", "adam")
# the range of each numeric option a real run could use (inclusive); past these a typo would run for ever,
# allocate until memory runs out, or fail deep inside the run (a zero --eval-every divides by zero)
RANGES: dict[str, tuple[float, float]] = {
    "task_train_size": (1, 10_000_000), "vocab_size": LIMITS["vocab_size"], "lr": (1e-12, 100),
    "warmup_steps": (0, 1 << 40), "max_tokens": (1, 1 << 20), "max_steps": (1, 1 << 40), "max_minutes": (1e-3, 1e7),
    "eval_every": (1, 1 << 40), "label_smoothing": (0, 0.999), "clip_norm": (0, 1e9), "beam": (1, MAX_BEAM),
    "lenpen": (0, 10), "seed": (0, 2**63 - 1), "log_every": (1, 1 << 40), "threads": (1, 4096),
    # batches per process in one update (fairseq's --update-freq): the WMT recipes need 128 on one process (Ott
    # et al.'s 128 GPUs), 1024 leaves room for batches 8 times smaller
    "update_freq": (1, 1024),
    # checkpoints kept and averaged for the test decoding; Vaswani et al. averaged the last 20 for their big
    # models, past a few dozen the first ones are from another point of the run
    "average_last": (1, 100),
    "test_decode_limit": (0, 1 << 40),
}
# the model options a run may set over its preset (flags --dim ... --positions)
MODEL_OVERRIDES = ("dim", "hidden", "encoder_layers", "decoder_layers", "heads", "max_len", "dropout",
                   "attention_dropout", "activation_dropout", "activation", "layerscale_init", "positions")
# what a resume may change: how long it runs (a finished run is extended by raising them), how often it
# checkpoints and logs, where and how fast it runs, how the test split is decoded, where the folders now are
RESUMABLE_CHANGES = ("max_steps", "max_minutes", "eval_every", "log_every", "device", "threads", "progress", "beam",
                     "lenpen", "output", "data", "test_decode_limit")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d{1,4})$")
# options whose flag is not --NAME (log_every is the library's only)
_FLAGS = {"task_train_size": "--train-size", "model_overrides": "--dim/--hidden/...", "progress": "--no-progress",
          "log_every": "log_every"}


def flag(name: str) -> str:
    """The command-line flag of option `name`."""
    return _FLAGS.get(name) or "--" + name.replace("_", "-")


@dataclass
class TranslationConfig:
    """Everything a run depends on; saved to config.json so a run can be resumed and repeated."""

    output: str
    task: str | None = None  # built-in task (numbers-en-de, numbers-en-fr) or None with `data`
    data: str | None = None  # directory with {train,valid,test}.{src_suffix,tgt_suffix}
    src_suffix: str = "src"
    tgt_suffix: str = "tgt"
    task_train_size: int = 50_000
    arch: str = "resmlp"
    preset: str = "small"
    model_overrides: dict[str, Any] = field(default_factory=dict)
    vocab_size: int = 1000
    optimizer: str = "adagrad"
    lr: float = 0.2
    warmup_steps: int = 500
    max_tokens: int = 4096  # padded tokens of one batch of one process
    update_freq: int = 1  # batches per process whose gradients make one update (one step)
    max_steps: int = 100_000
    max_minutes: float = 20.0  # wall-clock training budget, checked every step
    eval_every: int = 500
    average_last: int = 1  # keep the last N checkpoints (checkpoint_STEP.pt) and score the test split with their mean
    label_smoothing: float = 0.1
    clip_norm: float = 0.0
    precision: str = "fp32"  # CPU bf16 autocast measured ~8x slower for these models (docs/translation.md)
    beam: int = 4
    lenpen: float = 0.6
    seed: int = 0
    log_every: int = 50
    device: str = "auto"  # auto: cuda:LOCAL_RANK when a GPU is visible, else cpu
    threads: int | None = None  # None: runtime.default_threads()
    progress: bool = True  # a tqdm bar on stderr (rank 0)
    # test sentences decoded and scored at the end: None all, N the first N, 0 none (a large test split at beam 4
    # can take longer than a short training run; `resmlp translate eval RUN` scores it later)
    test_decode_limit: int | None = None

    def __post_init__(self) -> None:
        errors = _type_errors(dataclasses.asdict(self))
        if not errors:
            errors = _value_errors(self)
        if errors:
            raise ConfigError("; ".join(errors))

    @classmethod
    def from_dict(cls, values: Any, source: str) -> TranslationConfig:
        """A config read from a file (`source` names it in messages): a JSON object of known keys with `output`."""
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a JSON object of run options, got {type(values).__name__}")
        known = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{source}: unknown option {key!r}{hint}; the file is not a resmlp translate "
                                  "train config.json, or was edited")
        if "output" not in values:
            raise ConfigError(f"{source}: no `output`; the file is not a resmlp translate train config.json")
        try:
            return cls(**values)
        except ConfigError as e:
            raise ConfigError(f"{source}: {e}") from None

    def model_config(self, vocab_size: int) -> Seq2SeqConfig:
        """The model of this run for a tokenizer of `vocab_size` pieces (the preset with the overrides)."""
        return translation_model_config(self.preset, vocab_size, arch=self.arch, **self.model_overrides)


def _type_errors(values: dict[str, Any]) -> list[str]:
    """Each option of the JSON type its field declares: ints are ints (not bools or floats), floats numbers."""
    hints = typing.get_type_hints(TranslationConfig)
    errors = []
    for name, value in values.items():
        hint = hints[name]
        allowed = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        allowed = tuple(typing.get_origin(a) or a for a in allowed)  # dict[str, Any] -> dict
        if not _is_of(value, allowed):
            wanted = " or ".join("null" if a is type(None) else a.__name__ for a in allowed)
            errors.append(f"{flag(name)} {value!r}: expected {wanted}")
    return errors


def _is_of(value: Any, allowed: tuple[type, ...]) -> bool:
    if value is None:
        return type(None) in allowed
    if isinstance(value, bool):  # a bool is an int to isinstance
        return bool in allowed
    return isinstance(value, allowed) or (float in allowed and isinstance(value, int))


def _value_errors(cfg: TranslationConfig) -> list[str]:
    errors = []
    hints = typing.get_type_hints(TranslationConfig)
    for name, (low, high) in RANGES.items():
        value = getattr(cfg, name)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            kind = "a number" if hints[name] is float else "a whole number"
            errors.append(f"{flag(name)} {value!r}: expected {kind} from {low} to {high}")
    if not cfg.output:
        errors.append("--output: expected a folder for the run (an empty path would write into the current folder)")
    if (cfg.task is None) == (cfg.data is None):
        errors.append("give exactly one of --task (built-in number-words task) or --data DIR")
    for name, choices in (("task", (None, *TASKS)), ("arch", ARCHS), ("preset", tuple(PRESETS)),
                          ("optimizer", OPTIMIZERS), ("precision", PRECISIONS)):
        if getattr(cfg, name) not in choices:
            errors.append(f"{flag(name)} {getattr(cfg, name)!r}: choose one of "
                          f"{', '.join(c for c in choices if c is not None)}")
    for name in ("src_suffix", "tgt_suffix"):
        suffix = getattr(cfg, name)
        if not suffix or "/" in suffix or "\0" in suffix:
            errors.append(f"{flag(name)} {suffix!r}: expected a file suffix such as en (no '/')")
    if not _DEVICE.match(cfg.device):
        errors.append(f"--device {cfg.device!r}: expected auto, cpu, cuda or cuda:N")
    return errors or _model_errors(cfg)


def _model_errors(cfg: TranslationConfig) -> list[str]:
    """The overrides (known names), then the model they make with the preset: each size in model.LIMITS, dim
    divisible by heads; the message names the flag."""
    unknown = [name for name in cfg.model_overrides if name not in MODEL_OVERRIDES]
    if unknown:
        return [f"model options {unknown}: expected some of {', '.join(MODEL_OVERRIDES)}"]
    try:
        cfg.model_config(cfg.vocab_size)
    except ValueError as e:
        named = re.match(r"(\w+)=", str(e))
        where = flag(named.group(1)) if named and named.group(1) in MODEL_OVERRIDES else f"preset {cfg.preset}"
        return [f"{where}: {e}"]
    return []


def check_decoding(beam: int, lenpen: float) -> None:
    """The decoding flags of `translate eval` and `decode`, checked as a training's are."""
    check_beam(beam)
    low, high = RANGES["lenpen"]
    if not (math.isfinite(lenpen) and low <= lenpen <= high):
        raise ConfigError(f"--lenpen {lenpen!r}: expected a number from {low} to {high} (scores are divided by "
                          "length**lenpen; the paper's setup uses 0.6)")


def check_resumable(source: str, saved: TranslationConfig, now: TranslationConfig) -> None:
    """Refuse a resume whose options differ from the run's (config.json, `source`) beyond RESUMABLE_CHANGES,
    naming every differing flag with its old and new value."""
    old, new = _resume_options(saved), _resume_options(now)
    changed = [name for name in old if old[name] != new[name] and name not in RESUMABLE_CHANGES]
    if changed:
        differences = "; ".join(f"{flag(name)} was {old[name]!r}, now {new[name]!r}" for name in changed)
        raise ConfigError(f"{source}: the run was trained with other options ({differences}); resume with the "
                          f"same options, only {', '.join(map(flag, RESUMABLE_CHANGES))} may change")


def _resume_options(cfg: TranslationConfig) -> dict[str, Any]:
    """The options a resume compares, each model option as the model has it (the preset's value or the flag's),
    so a message names `--dim` rather than a dict of overrides, and `--dim 256` over a preset of dim 256 agrees."""
    values = dataclasses.asdict(cfg)
    model = dataclasses.asdict(cfg.model_config(cfg.vocab_size))
    del values["model_overrides"]
    return {**values, **{name: model[name] for name in MODEL_OVERRIDES}}

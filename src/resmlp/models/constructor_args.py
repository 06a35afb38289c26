"""The arguments this project passes to a timm or torchvision constructor, from a checkpoint's metadata or from
`--set model.*`: plain, bounded values only, checked before anything is built.

timm's `create_model` takes arguments that read files or change what the model is: `checkpoint_path` makes it
`torch.load` a second file past this project's checkpoint reader, `pretrained`/`pretrained_cfg_overlay` point
it at weights files and URLs, `features_only` turns the classifier into a feature pyramid. None of them is an
architecture choice, so they are refused by name (and any key naming a path, file, folder, URL, cache, hub or
config). What remains must be a plain value: a bool, None, a bounded int, a finite bounded float, a short word,
or a short list of those; depth-like counts (depth, layers, blocks) are bounded tighter, since building
100,000 blocks for the meta-device check alone takes minutes.
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from resmlp.errors import ConfigError, ResmlpError

# loaders, feature extractors and configs: never an architecture argument of a classifier
REFUSED_KEYS = frozenset({
    "checkpoint_path", "pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_strict",
    "features_only", "feature_cfg", "feature_cls", "out_indices", "output_stride_features", "weights",
    "weights_backbone", "progress", "cache_dir", "scriptable", "exportable", "no_jit",
})
_REFUSED_WORDS = re.compile(r"path|file|dir|url|cache|hub|cfg|overlay|pretrained|weights|checkpoint")
_DROP_PATH_KEYS = frozenset({"drop_path_rate", "drop_path"})  # stochastic depth: "path" as in a network's path
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_WORD = re.compile(r"^[A-Za-z0-9_\-]{0,64}$")  # act_layer='gelu', global_pool='avg', weight_init='jax'
_DEPTH_LIKE = re.compile(r"depth|layers|blocks|repeats|num_stages")

MAX_INT = 1 << 17  # widths, image sizes, classes (ImageNet-21k: 21,843): far above any real model's
MAX_DEPTH_COUNT = 256  # blocks per model or stage: the deepest timm classifiers have ~100
MAX_FLOAT = 1e6
MAX_LIST = 16  # per-stage lists (depths, dims) have a few entries


def check_constructor_args(kwargs: dict[str, Any], where: str, error: type[ResmlpError] = ConfigError) -> None:
    """Raise `error` (one line naming `where` and the key) unless every key of `kwargs` is an architecture
    argument with a plain, bounded value."""
    for key, value in kwargs.items():
        problem = _key_problem(key) or _value_problem(key, value)
        if problem:
            raise error(f"{where}: model argument {key!s:.64}={value!r:.80} is refused: {problem}")


def _key_problem(key: Any) -> str | None:
    if not isinstance(key, str) or not _KEY.match(key):
        return "an argument name is a Python identifier"
    if key in REFUSED_KEYS or (_REFUSED_WORDS.search(key.lower()) and key not in _DROP_PATH_KEYS):
        return ("it names a file, a download or a feature extractor, not an architecture; weights come only "
                "from the checkpoint file this project reads (or --teacher-weights / distill.weights)")
    return None


def _value_problem(key: str, value: Any, nested: bool = False) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        high = MAX_DEPTH_COUNT if _DEPTH_LIKE.search(key.lower()) else MAX_INT
        return None if -MAX_INT <= value <= high else f"expected an integer in [-{MAX_INT}, {high}]"
    if isinstance(value, float):
        return None if math.isfinite(value) and abs(value) <= MAX_FLOAT else \
            f"expected a finite number within +-{MAX_FLOAT:g}"
    if isinstance(value, str):
        return None if _WORD.match(value) else "expected a short word (letters, digits, _ and -), not a path"
    if isinstance(value, (list, tuple)) and not nested:
        if len(value) > MAX_LIST:
            return f"expected at most {MAX_LIST} values"
        return next(filter(None, (_value_problem(key, v, nested=True) for v in value)), None)
    return "expected a number, a word, true/false, null or a short list of those"


def class_scores_problem(out: object, num_classes: Any) -> str | None:
    """Why `out`, a model's output for a batch of 2 images, is not (2, num_classes) class scores (None if it is)."""
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else None
    if shape is not None and isinstance(num_classes, int) and shape == (2, num_classes):
        return None
    if shape is not None and num_classes == 0 and len(shape) == 2 and shape[0] == 2:
        return None  # a backbone without a head (timm's num_classes=0): one feature vector per image
    got = f"a tensor of shape {shape}" if shape is not None else f"a {type(out).__name__}"
    return (f"gives {got} for 2 images, not class scores of shape (2, {num_classes}); a classifier's arguments "
            "must keep its output one row of scores per image")

"""MATLAB .mat files of the transfer datasets (Flowers-102's labels and splits, Stanford Cars' devkit), read
with scipy.io and bounded before anything is allocated.

`scipy.io.whosmat` lists a file's variables with their shapes without reading their data; a variable is read
(`loadmat(..., variable_names=[name])`) only once its shape is within the caller's bound, and the file itself is
bounded in bytes first. Every refusal is one DataError line naming the file and what was expected.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from resmlp.errors import DataError

MAX_MAT_BYTES = 256 << 20  # the devkit's files are under 1 MB, Flowers-102's under 100 kB


def read_mat_variable(path: Path, name: str, max_elements: int, expected: str) -> np.ndarray:
    """Variable `name` of the .mat file `path`, squeezed to at least 1-D, after its declared shape was checked
    to hold at most `max_elements` elements. `expected` describes the file for the refusal lines."""
    import scipy.io

    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; expected {expected}")
    if path.stat().st_size > MAX_MAT_BYTES:
        raise DataError(f"{path} is larger than {MAX_MAT_BYTES >> 20} MB; expected {expected}")
    try:
        listed = {var: shape for var, shape, _ in scipy.io.whosmat(str(path))}
    except Exception as e:  # scipy raises ValueError, TypeError, MatReadError... for a file that isn't a .mat
        raise DataError(f"{path} is not a readable MATLAB file ({type(e).__name__}: {str(e)[:80]}); expected "
                        f"{expected}") from None
    if name not in listed:
        raise DataError(f"{path} has no variable {name!r} (it has {', '.join(sorted(listed)[:8]) or 'none'}); "
                        f"expected {expected}")
    count = math.prod(int(d) for d in listed[name])
    if count > max_elements:
        raise DataError(f"{path}: {name} declares {count:,} entries, more than {max_elements:,}; expected {expected}")
    try:
        value: Any = scipy.io.loadmat(str(path), variable_names=[name], squeeze_me=True)[name]
    except Exception as e:
        raise DataError(f"{path}: {name} can't be read ({type(e).__name__}: {str(e)[:80]}); expected "
                        f"{expected}") from None
    return np.atleast_1d(value)


def integer_array(values: np.ndarray, low: int, high: int, what: str) -> np.ndarray:
    """`values` as int64 if every one is an integer in [low, high]; else one DataError line naming `what`."""
    if values.dtype.kind not in "iuf" or values.ndim != 1:
        raise DataError(f"{what}: expected a vector of integers, got {values.dtype} of shape {values.shape}")
    if values.dtype.kind == "f" and not np.all(np.isfinite(values) & (values == np.round(values))):
        raise DataError(f"{what}: expected integers, found a fraction or a NaN")
    ints = values.astype(np.int64)
    if len(ints) and not low <= ints.min() <= ints.max() <= high:
        bad = ints[(ints < low) | (ints > high)][0]
        raise DataError(f"{what}: value {bad} is outside [{low}, {high}]")
    return ints

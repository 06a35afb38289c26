"""The one reader of checkpoint files: parse, don't trust.

Every file a user hands us (a model's weights, a training state, a translation checkpoint) goes through
`read_torch_file` or `read_state_dict`, which refuse before touching data what a loader would turn into a
traceback, a hang or an allocation far beyond the file's size:

- a torch zip whose records are compressed, claim more bytes than they hold or share bytes with each other
  (torch.save writes every record once and stored, so all records together are never larger than the file:
  the memory a load takes is bounded by the file's size), or a legacy (pre-zip) torch file, whose loader allocates
  each storage at the size its pickle claims before reading a byte;
- every loader exception (a weights-only pickle calling an allowed callable with wrong arguments, a bad
  header...) becomes one CheckpointError line naming the file;
- every tensor in the loaded object dense, strided, on the CPU (not meta, sparse, nested or quantized), with no
  zero or overlapping strides and its storage holding every element it views (a 4-byte storage expanded to
  30,000 x 30,000 would allocate 3.6 GB when copied into a model);
- containers nested at most MAX_DEPTH deep;
- a state dict's names strings, its dtypes those of weights, its values finite.

`check_int`, `check_float`, `check_str` and `check_bool` validate one metadata value strictly (an int is an
int, not 8.0 or True; a float is finite; both in range) for the configs read from such files.
"""

from __future__ import annotations

import argparse
import math
import pickle
import struct
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from resmlp.errors import CheckpointError, ResmlpError
from resmlp.models.formats import WRAPPER_KEYS, torch_file_origin, unwrap_state_dict

MAX_DEPTH = 32  # containers in any checkpoint this project reads are a few levels deep


# ------------------------------------------------------------------------------------------ whole files
def read_torch_file(path: str | Path) -> Any:
    """The object of a torch file (torch.save's zip format), read weights-only onto the CPU and checked.

    Raises FileNotFoundError for a missing file and CheckpointError (one line naming the file) for anything
    wrong with it: not a torch zip, records compressed or larger than the file, a pickle that needs code or
    fails, a tensor that is not dense, strided and on the CPU or whose strides overlap or overrun its storage,
    containers nested deeper than MAX_DEPTH.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    _check_zip_records(path)
    try:
        # DeiT's training checkpoints carry an argparse.Namespace of their arguments: plain data
        with torch.serialization.safe_globals([argparse.Namespace]):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise CheckpointError(
            f"refusing to load {path}: it needs code to unpickle ({_first_line(e)}), and untrusted checkpoints "
            "must never run code. If you trust its source, re-save only its tensors (torch.save(state_dict, "
            "...)) or convert it to safetensors") from None
    except MemoryError:
        raise
    except Exception as e:  # whatever the unpickler or torch's reader raise, the file is what is wrong
        raise CheckpointError(f"{path} is damaged or not a PyTorch checkpoint ({type(e).__name__}: "
                              f"{_first_line(e)}); re-download or re-save it") from None
    check_tensors(obj, path)
    return obj


def read_state_dict(path: str | Path, allow_nonfinite: bool = False, checkpoint_key: str | None = None
                    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """A model's weights from a .safetensors file or a torch file, and the file's metadata.

    Metadata: safetensors headers' 'config', 'timm', 'extra' entries as this project writes them; for torch
    files only 'torch', what the file is (`resmlp.models.formats.torch_file_origin`). Training checkpoints are
    unwrapped (`resmlp.models.formats.unwrap_state_dict`; `checkpoint_key` picks the entry). Raises
    CheckpointError for everything `read_torch_file` refuses and for non-string names, dtypes no weight has, and
    NaN/infinite values (`allow_nonfinite=True` only warns).
    """
    path = Path(path)
    if path.suffix == ".safetensors":
        raw_meta, tensors = read_safetensors(path)
        meta = decode_metadata(raw_meta, path)
    else:
        obj = read_torch_file(path)
        for inner in [obj, *(obj.get(k) for k in WRAPPER_KEYS if isinstance(obj, dict))]:
            _check_names(inner, path)
        try:
            found = unwrap_state_dict(obj, checkpoint_key)
        except KeyError as e:
            raise CheckpointError(f"{path}: {e.args[0]}") from None
        if found is None:
            raise CheckpointError(f"{path} holds no state dict (a dict of tensors, flat or under one of "
                                  f"{', '.join(map(repr, WRAPPER_KEYS))})")
        tensors, meta = found, {"torch": torch_file_origin(obj)}  # the preprocessing rule reads it
    check_state_dict(tensors, path, allow_nonfinite)
    return tensors, meta


def read_safetensors(path: str | Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """The raw header metadata and the tensors of a .safetensors file (whose format bounds every tensor by
    the file: safetensors checks each tensor's byte range against the file before reading it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            raw_meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
    except MemoryError:
        raise
    except Exception as e:  # safetensors raises its own error types for bad headers and short files
        raise unreadable_safetensors(path, e) from None
    return raw_meta, tensors


def read_safetensors_header(path: str | Path) -> dict[str, str]:
    """The raw metadata of a .safetensors file, from its header alone."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except Exception as e:  # safetensors raises its own error types for bad headers and short files
        raise unreadable_safetensors(path, e) from None


def unreadable_safetensors(path: Path, error: Exception) -> CheckpointError:
    return CheckpointError(f"{path} is not a readable safetensors file ({_first_line(error)}); it may be truncated "
                           "or of another format: re-download or re-save it")


def _check_zip_records(path: Path) -> None:
    """torch.save's zip: every record stored (never compressed), within the file, and no two records sharing
    bytes. A deflated record would be inflated to whatever size it declares (2 GiB from a 2 MB file); records
    pointing at one stored record would each be read into a storage of their own (250 entries sharing a 4 MiB
    record: 1 GiB). With records disjoint and stored, what torch allocates is at most the file's size. miniz
    and Python's zipfile both take the offsets and sizes from the central directory, which is what is checked
    here, with each record's local header (whose name and extra fields come before its data)."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(f"{path} is truncated or not a PyTorch checkpoint in torch.save's zip format (legacy "
                              "files of PyTorch < 1.6 are refused too: their loader allocates each tensor at the "
                              "size the file claims); re-download it, or re-save it with a current PyTorch or as "
                              "safetensors")
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            records = archive.infolist()
    except Exception as e:  # zipfile raises BadZipFile, ValueError, struct.error... for damaged directories
        raise CheckpointError(f"{path} is a damaged zip archive ({_first_line(e)}); re-download or re-save it"
                              ) from None
    for record in records:
        if record.compress_type != zipfile.ZIP_STORED:
            raise CheckpointError(f"{path}: record {record.filename!r} is compressed; torch.save stores every "
                                  "record uncompressed, so the file was repacked or crafted: re-save it with "
                                  "torch.save")
        if record.file_size != record.compress_size or record.header_offset + record.file_size > size:
            raise CheckpointError(f"{path}: record {record.filename!r} claims {record.file_size} bytes, more than "
                                  f"the file holds ({size} bytes); the file is truncated or crafted")
    _check_disjoint(path, size, records)


_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then (after 22 bytes) name and extra field lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"


def _check_disjoint(path: Path, size: int, records: list[zipfile.ZipInfo]) -> None:
    """Each record's bytes (local header, name, extra field, data) lie inside the file and after the previous
    record's: no two records share a byte, so together they hold at most the file's size."""
    spans = []
    with open(path, "rb") as f:
        for record in records:
            header = b""
            if 0 <= record.header_offset < size:  # zipfile makes offsets of a damaged archive negative
                f.seek(record.header_offset)
                header = f.read(_LOCAL_HEADER.size)
            if len(header) < _LOCAL_HEADER.size or header[:4] != _LOCAL_SIGNATURE:
                raise CheckpointError(f"{path}: record {record.filename!r} has no local header at offset "
                                      f"{record.header_offset}; the file is truncated or crafted")
            _, name_len, extra_len = _LOCAL_HEADER.unpack(header)
            end = record.header_offset + _LOCAL_HEADER.size + name_len + extra_len + record.compress_size
            spans.append((record.header_offset, end, record.filename))
    spans.sort()
    for (_, end, name), (start, _, other) in zip(spans, spans[1:], strict=False):
        if start < end:
            raise CheckpointError(f"{path}: records {name!r} and {other!r} overlap (share bytes from offset "
                                  f"{start}); torch.save writes each record once, so the file was crafted to be "
                                  "read as more data than it holds: re-save it with torch.save")
    total = sum(end - start for start, end, _ in spans)
    if total > size or max((end for _, end, _ in spans), default=0) > size:
        raise CheckpointError(f"{path}: its records claim {total} bytes, more than the file holds ({size} bytes); "
                              "the file is truncated or crafted")


# ------------------------------------------------------------------------------------------ tensors
def check_tensors(obj: Any, path: str | Path) -> None:
    """Every tensor in `obj` (dicts, lists, tuples, sets, Namespaces, at most MAX_DEPTH deep) passes `check_tensor`;
    each container is visited once, however often the pickle references it."""
    seen: set[int] = set()
    todo: list[tuple[Any, str, int]] = [(obj, "", 0)]
    while todo:
        item, where, depth = todo.pop()
        if isinstance(item, torch.Tensor):
            check_tensor(item, where or "the file's tensor", path)
            continue
        if not isinstance(item, (dict, list, tuple, set, frozenset, argparse.Namespace)) or id(item) in seen:
            continue
        if depth >= MAX_DEPTH:
            raise CheckpointError(f"{path}: containers nested more than {MAX_DEPTH} levels deep (at {where or 'top'})"
                                  "; no checkpoint has that: the file was crafted")
        seen.add(id(item))
        if isinstance(item, argparse.Namespace):
            item = vars(item)
        elif isinstance(item, (set, frozenset)):
            item = list(item)
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        todo.extend((value, f"{where}[{key!r}]", depth + 1) for key, value in pairs)


def check_tensor(tensor: torch.Tensor, name: str, path: str | Path) -> None:
    """A dense CPU tensor whose strides neither repeat (0) nor overlap, viewing only bytes its storage holds;
    checked on sizes and strides alone, before any of its data is read."""
    kind = _unusual_kind(tensor)
    if kind:
        raise CheckpointError(f"{path}: tensor {name} is {kind}; a checkpoint holds dense CPU tensors: re-save "
                              "it from plain tensors (tensor.to_dense().cpu())")
    if tensor.numel() == 0:
        return
    dims = sorted((stride, size) for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 1)
    reach = 0  # the furthest element (in items) the dimensions seen so far can reach
    for stride, size in dims:
        if stride <= reach:
            raise CheckpointError(f"{path}: tensor {name} has overlapping strides {tuple(tensor.stride())} for shape "
                                  f"{tuple(tensor.shape)} (elements shared, as by expand); a checkpoint holds "
                                  "each element once: re-save it with tensor.contiguous()")
        reach += stride * (size - 1)
    needed = (tensor.storage_offset() + reach + 1) * tensor.element_size()
    held = tensor.untyped_storage().nbytes()
    if needed > held:
        raise CheckpointError(f"{path}: tensor {name} views {needed} bytes but its storage holds {held}; the file is "
                              "damaged or crafted")


def _unusual_kind(tensor: torch.Tensor) -> str | None:
    if tensor.is_nested:
        return "a nested tensor"
    if tensor.layout != torch.strided:
        return f"of layout {tensor.layout}"
    if tensor.device.type != "cpu":
        return f"on device {tensor.device.type}"
    if tensor.is_quantized:
        return "quantized"
    return None


# dtypes a network's weights and buffers come in; anything else (complex, bool, quantized, unsigned 16-64
# bit) would be cast silently into float weights or fail deep inside load_state_dict
WEIGHT_DTYPES = {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                 torch.int16, torch.int8, torch.uint8}
FLOAT8 = {d for d in (getattr(torch, n, None) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                         "float8_e5m2fnuz")) if d is not None}


def check_state_dict(tensors: dict[Any, Any], path: str | Path, allow_nonfinite: bool = False) -> None:
    """A model's weights: string names, dense tensors (`check_tensor`), weight dtypes, finite values."""
    _check_names(tensors, path)
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise CheckpointError(f"{path}: entry {name!r} is a {type(tensor).__name__}, not a tensor; the file "
                                  "holds no model weights there")
        check_tensor(tensor, repr(name), path)
        if tensor.dtype not in WEIGHT_DTYPES and tensor.dtype not in FLOAT8:
            raise CheckpointError(f"{path}: tensor {name!r} is of dtype {str(tensor.dtype).removeprefix('torch.')}, "
                                  "which no weight of these models has; re-save the file with float weights")
    _check_finite(tensors, path, allow_nonfinite)


def _check_names(tensors: Any, path: str | Path) -> None:
    """A dict of tensors is named by strings (an int or bytes name breaks every name-based step later)."""
    if not isinstance(tensors, dict) or not any(isinstance(v, torch.Tensor) for v in tensors.values()):
        return
    bad = next((k for k in tensors if not isinstance(k, str)), None)
    if bad is not None:
        raise CheckpointError(f"{path}: its weights are named by a {type(bad).__name__} ({bad!r:.60}), not a "
                              "string; the file was not written from a state dict: re-save it")


def _check_finite(tensors: dict[str, torch.Tensor], path: str | Path, allow_nonfinite: bool) -> None:
    """NaN or infinite weights make every prediction meaningless (a score of chance, silently)."""
    for name, tensor in tensors.items():
        if tensor.dtype in FLOAT8:  # torch has no isfinite for float8: check its float32 values
            tensor = tensor.float()
        if not tensor.is_floating_point() or bool(torch.isfinite(tensor).all()):
            continue
        bad = int((~torch.isfinite(tensor)).sum())
        message = (f"{path}: tensor {name!r} holds {bad} NaN/infinite value(s) of {tensor.numel()}; the weights "
                   "are broken (a diverged run?): use an earlier checkpoint")
        if not allow_nonfinite:
            raise CheckpointError(message + " (allow_nonfinite=True loads them anyway, with a warning)")
        warnings.warn(message, stacklevel=3)
        return


# ------------------------------------------------------------------------------------------ metadata
def decode_metadata(raw: dict[str, str], path: str | Path = "checkpoint") -> dict[str, Any]:
    """The JSON entries ('config', 'timm', 'extra') of a safetensors header, checked for the shapes this
    project writes: objects, a few levels deep, every number finite; 'timm' is {"name": str, "kwargs": {}}."""
    import json

    meta: dict[str, Any] = {}
    for key in ("config", "timm", "torchvision", "extra"):
        if key not in raw:
            continue
        try:
            meta[key] = json.loads(raw[key])
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: metadata {key!r} is not valid JSON ({e})") from None
        except RecursionError:  # json's decoder recurses once per level of nesting
            raise CheckpointError(f"{path}: metadata {key!r} is nested thousands of levels deep; this "
                                  "project writes a few levels: the file was made or edited by hand") from None
        if not isinstance(meta[key], dict):
            raise CheckpointError(f"{path}: metadata {key!r} must be a JSON object, not "
                                  f"{type(meta[key]).__name__} ({raw[key][:80]!r}); re-save the file")
        _check_finite_json(meta[key], f"metadata {key!r}", path)
    spec = meta.get("timm")
    if spec is not None:
        spec.setdefault("kwargs", {})
        if not isinstance(spec.get("name"), str) or not isinstance(spec["kwargs"], dict):
            raise CheckpointError(f"{path}: metadata 'timm' must be {{\"name\": str, \"kwargs\": {{...}}}}, got "
                                  f"{raw['timm'][:120]!r}")
    spec = meta.get("torchvision")
    if spec is not None and (not isinstance(spec.get("name"), str) or not isinstance(spec.get("kwargs", {}), dict)
                             or spec.get("in_chans") not in (None, 1, 3)):
        raise CheckpointError(f"{path}: metadata 'torchvision' must be {{\"name\": str, \"in_chans\": 1 | 3 | null, "
                              f"\"kwargs\": {{...}}}}, got {raw['torchvision'][:120]!r}")
    return meta


def _check_finite_json(value: Any, where: str, path: str | Path, depth: int = 0) -> None:
    """JSON reads NaN, Infinity and 1e400 as non-finite floats; no value this project writes is one."""
    if depth > MAX_DEPTH:
        raise CheckpointError(f"{path}: {where} is nested more than {MAX_DEPTH} levels deep; the file was edited")
    if isinstance(value, float) and not math.isfinite(value):
        raise CheckpointError(f"{path}: {where} holds {value!r}, not a finite number; the file was edited")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        _check_finite_json(child, where, path, depth + 1)


def _bad(where: str, name: str, value: Any, expected: str, error: type[ResmlpError]) -> ResmlpError:
    return error(f"{where}: {name}={value!r:.80} is not {expected}")


def check_int(value: Any, name: str, where: str | Path, low: int, high: int,
              error: type[ResmlpError] = CheckpointError) -> int:
    """`value` if it is an int (not a bool, not 8.0) in [low, high]; else `error` naming `where` and `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _bad(str(where), name, value, f"an integer in [{low}, {high}]", error)
    return value


def check_float(value: Any, name: str, where: str | Path, low: float, high: float,
                error: type[ResmlpError] = CheckpointError) -> float:
    """`value` as a float if it is a finite int or float (not a bool) in [low, high]; else `error`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise _bad(str(where), name, value, f"a finite number in [{low}, {high}]", error)
    return float(value)


def check_str(value: Any, name: str, where: str | Path, choices: Sequence[str] | None = None,
              error: type[ResmlpError] = CheckpointError) -> str:
    """`value` if it is a string (one of `choices` when given); else `error`."""
    if not isinstance(value, str) or (choices is not None and value not in choices):
        raise _bad(str(where), name, value, f"one of {', '.join(choices)}" if choices else "a string", error)
    return value


def check_bool(value: Any, name: str, where: str | Path, error: type[ResmlpError] = CheckpointError) -> bool:
    """`value` if it is a bool (not 0 or 'yes'); else `error`."""
    if not isinstance(value, bool):
        raise _bad(str(where), name, value, "true or false", error)
    return value


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return (lines[0] if lines else type(error).__name__)[:200]

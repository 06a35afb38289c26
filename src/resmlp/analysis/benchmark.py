"""The paper's Table 1 on the machine at hand: parameters, GMACs, throughput, peak memory, optional top-1.

Models are named in the project's one grammar (`resmlp.build`): `preset | timm:NAME | torchvision:NAME |
path/to/checkpoint` (random weights for timm and torchvision, nothing is downloaded), each optionally
followed by constructor overrides in brackets, values read as YAML like `--set`'s:
`resmlp_s12[dim=64,depth=2],timm:resnet50,runs/x/best.safetensors`. Every row records the host.

How the models run (`RunMode`, the same for every row): our ResMLP/Mixer models through the inference path
`resmlp predict` uses (`resmlp.inference.optimize`), or `plain` (the model as built, as the paper timed it);
other models (timm, torchvision) always run as built. Precision fp32, tf32 (CUDA's TF32 matrix mode; fp32 on
a CPU, which has none) or bf16 (`optimize`'s bf16 weights for ours, bf16 autocast otherwise), optionally
compiled.
"""

from __future__ import annotations

import contextlib
import csv
import ctypes
import gc
import json
import math
import multiprocessing
import resource
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from resmlp.build import ModelName, check_constructor_keys, parse_model_name
from resmlp.complexity import count_gmacs, count_params
from resmlp.errors import ConfigError
from resmlp.fileio import atomic_write
from resmlp.hostinfo import host_info
from resmlp.inference import COMPILE_MODES, compile_for_inference, compile_mode, optimize
from resmlp.models.resmlp import ResMLP

PATHS = ("optimized", "plain")
PRECISIONS = ("fp32", "tf32", "bf16")
HOST_COLUMNS = ("cpu", "cpu_capability", "native_bf16", "gpu", "torch", "timm", "precision")
CSV_COLUMNS = (
    "model",
    "img_size",
    "params_m",
    "gmacs",
    "batch_size",
    "throughput_img_s",
    "large_batch_size",
    "throughput_large_img_s",
    "throughput_b1_img_s",
    "peak_memory_mb",
    "weights_mb",
    "top1",
    "device",
    "path",
    "compile",
    "threads",
    *HOST_COLUMNS,
)

# the paper's Table 1 (V100-32GB, batch 32): the rows whose ratio this benchmark prints beside its own
PAPER_S12, PAPER_DEIT_S = "resmlp_s12", "timm:deit_small_patch16_224"
PAPER_TABLE1 = {PAPER_S12: dict(throughput=1415.1, peak_memory_mb=179.5),
                PAPER_DEIT_S: dict(throughput=940.4, peak_memory_mb=217.2)}
PAPER_BATCH, PAPER_IMG_SIZE = 32, 224


@dataclass(frozen=True)
class RunMode:
    """How every model of one benchmark runs: inference path, precision, compilation (what each row records)."""

    path: str = "optimized"
    precision: str = "fp32"
    compile: str | None = None  # a torch.compile mode of resmlp.inference.COMPILE_MODES, None: eager

    def __post_init__(self) -> None:
        if self.path not in PATHS:
            raise ValueError(f"unknown path {self.path!r}; choose one of {', '.join(PATHS)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"unknown precision {self.precision!r}; choose one of {', '.join(PRECISIONS)}")
        if self.compile is not None and self.compile not in COMPILE_MODES:
            raise ValueError(f"unknown compile mode {self.compile!r}; choose one of {', '.join(COMPILE_MODES)}")

    def precision_on(self, device: torch.device) -> str:
        """The precision that runs there: tf32 is a CUDA matrix mode, a CPU computes it in fp32."""
        return "fp32" if self.precision == "tf32" and device.type != "cuda" else self.precision


@dataclass(frozen=True)
class ModelSpec:
    """One model to benchmark: its name in the model grammar and its constructor overrides."""

    model: ModelName
    overrides: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # as written on the command line

    @property
    def name(self) -> str:
        """The model as named without overrides: `resmlp_s12`, `timm:resnet50`, a file path."""
        return str(self.model)

    @property
    def label(self) -> str:
        return self.text or self.name

    @property
    def is_file(self) -> bool:
        return self.model.kind == "file"


def split_top_level(text: str, what: str) -> list[str]:
    """Split at commas outside brackets: 'a[x=1,y=2],b' -> ['a[x=1,y=2]', 'b'] (stripped, empty items
    dropped); unbalanced brackets are an error naming `what`."""
    items, depth, current = [], 0, []
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth < 0:
            raise ValueError(f"{what} {text!r}: a ']' closes no '['")
        if char == "," and depth == 0:
            items.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"{what} {text!r}: a '[' is never closed")
    items.append("".join(current).strip())
    return [item for item in items if item]


def parse_spec(text: str) -> ModelSpec:
    """'resmlp_s12[dim=64,depth=2]' -> ModelSpec(preset resmlp_s12, {dim: 64, depth: 2})."""
    from resmlp.train.config import parse_overrides

    text = text.strip()
    name, bracket, rest = text.partition("[")
    if bracket and not rest.endswith("]"):
        raise ValueError(f"model {text!r}: overrides go in brackets at the end, e.g. resmlp_s12[dim=64,depth=2]")
    pairs = split_top_level(rest[:-1], f"overrides of {name}") if bracket else []
    for pair in pairs:
        key, sep, _ = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"bad override {pair!r} for {name}; expected key=value, e.g. {name}[dim=64]")
    spec = ModelSpec(parse_model_name(name), parse_overrides(pairs), text)
    # the same check as a recipe's model keys: built and run once on the meta device, before any measurement
    problem = check_constructor_keys(spec.model, spec.overrides)
    if problem:
        raise ConfigError(f"--models {text!r}: {problem}")
    return spec


def parse_models(text: str) -> list[ModelSpec]:
    """A comma-separated list of models in the model grammar, each with optional [key=value,...] overrides."""
    specs = [parse_spec(item) for item in split_top_level(text, "--models")]
    if not specs:
        raise ValueError("no models given; e.g. --models resmlp_s12,timm:resnet50")
    return specs


def build_model(spec: ModelSpec, img_size: int | None = None) -> tuple[nn.Module, tuple[int, int, int]]:
    """The model (eval mode) and its (channels, height, width) input, made by `resmlp.build.build_model`."""
    from resmlp.build import build_model as build_named_model
    from resmlp.build import model_input

    overrides = dict(spec.overrides)
    if img_size is not None:
        overrides["img_size"] = img_size
    try:
        model = build_named_model(spec.model, **overrides)
    except (TypeError, ValueError):  # a constructor's TypeError; a checkpoint's, raised as CheckpointError
        if "img_size" not in overrides or spec.model.kind == "preset":
            raise
        # convnets (timm's, torchvision's, their checkpoints) take no img_size argument because they accept any
        # input size: feed it the size instead
        model = build_named_model(spec.model, **{k: v for k, v in overrides.items() if k != "img_size"})
    model.eval()
    if hasattr(model, "config"):  # ours
        return model, (model.config.in_chans, model.config.img_size, model.config.img_size)
    from timm.data import resolve_model_data_config

    chans, height, width = resolve_model_data_config(model)["input_size"]
    if spec.is_file:  # the channels and size it was trained on
        chans, height = model_input(spec.model)
        width = height
    chans = overrides.get("in_chans", chans)
    size = overrides.get("img_size")
    return model, (chans, size or height, size or width)


# ------------------------------------------------------------------------------------------ how models run
class BF16Autocast(nn.Module):
    """A model run in bf16 autocast, fp32 logits out: how a timm model (or our plain one) runs in bf16."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            return self.model(x).float()


def runs_optimized(model: nn.Module, mode: RunMode) -> bool:
    """Whether `mode` runs this model through `resmlp.inference.optimize` (ours, path optimized)."""
    return mode.path == "optimized" and isinstance(model, ResMLP)


def timed_model(model: nn.Module, mode: RunMode, device: torch.device) -> nn.Module:
    """The module the benchmark times: `model` on `device`, run as `mode` says (see the module docstring)."""
    model = model.to(device).eval()
    if runs_optimized(model, mode):
        with warnings.catch_warnings():
            # the command says once that bf16 is emulated on this CPU; optimize would say it per model
            warnings.filterwarnings("ignore", message=r"this \w+ has no native bf16")
            return optimize(model, "bf16" if mode.precision == "bf16" else "fp32", compile=mode.compile or False)
    runner = BF16Autocast(model) if mode.precision == "bf16" else model
    return compile_for_inference(runner, mode.compile) if mode.compile else runner


@contextlib.contextmanager
def float32_matmul(precision: str, device: torch.device) -> Iterator[None]:
    """fp32 products in TF32 for precision 'tf32' on CUDA, in full fp32 otherwise, restored afterwards.

    cuDNN's convolutions (a ResNet's) run in TF32 by default: a 'fp32' row switches that off too.
    """
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    tf32 = precision == "tf32" and device.type == "cuda"
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]


def _recompile_room(mode: RunMode, graphs: int) -> contextlib.AbstractContextManager:
    """Compiled with static shapes, each model and batch size is one graph of a shared forward (models of one
    class share it): torch's default limit of 8 would silently run the rest eagerly."""
    if not mode.compile:
        return contextlib.nullcontext()
    import torch._dynamo

    name = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"  # older
    return torch._dynamo.config.patch(**{name: max(8, graphs + 8)})


# ------------------------------------------------------------------------------------------ memory
def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise OSError(f"{field_name} missing from /proc/self/status")


def _release_free_heap() -> None:
    """Hand memory that Python and torch have freed back to the OS (glibc keeps it otherwise)."""
    gc.collect()
    # not glibc: the measurement may then miss memory reused from the warm-up
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _cpu_peak_child(spec: ModelSpec, mode: RunMode, batch_size: int, img_size: int | None) -> float:
    """Runs in a fresh process: MiB by which resident memory grows during one forward pass.

    A warm-up pass first does one-time allocations (kernel caches); freed memory is then trimmed back to
    the OS and the kernel's peak-RSS mark is reset (/proc/self/clear_refs, Linux >= 4.0), so VmHWM - VmRSS
    after the second pass is exactly that pass's growth. Without clear_refs (not Linux), the fallback is
    the ru_maxrss growth over both passes, which can only over-estimate.
    """
    built, shape = build_model(spec, img_size)
    model = timed_model(built, mode, torch.device("cpu"))
    x = torch.randn(batch_size, *shape)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.inference_mode():
        model(x)
        _release_free_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = _rss_kib("VmRSS")
            model(x)
            return (_rss_kib("VmHWM") - base) / 1024
        except OSError:
            model(x)
            growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
            return growth / 2**20 if sys.platform == "darwin" else growth / 1024  # bytes on macOS, else KiB


def cpu_peak_memory_mb(spec: ModelSpec, batch_size: int, img_size: int | None, mode: RunMode = RunMode()) -> float:
    """Peak RSS growth of one forward pass, measured in its own process so models can't share freed memory.

    The process comes from a fork server: forking this (threaded) process could deadlock the child on a
    lock some thread held, spawning re-imports torch every time (seconds); the server imports it once and
    forks clean single-threaded children.
    """
    with ProcessPoolExecutor(1, mp_context=_fresh_process_context()) as pool:
        return pool.submit(_cpu_peak_child, spec, mode, batch_size, img_size).result()


def _fresh_process_context() -> multiprocessing.context.BaseContext:
    if "forkserver" not in multiprocessing.get_all_start_methods():  # Windows
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def cuda_peak_memory_mb(model: nn.Module, x: torch.Tensor) -> float:
    """Peak CUDA memory allocated during one forward pass beyond what was allocated before it (MiB)."""
    with torch.inference_mode():
        model(x)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model(x)
        torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 1024**2


# ------------------------------------------------------------------------------------------ throughput
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure_throughput(
    models: dict[str, tuple[nn.Module, torch.Tensor]], repeats: int, warmup: int, min_time: float,
    bar: Any = None,
) -> dict[str, float]:
    """Median images/s per model, measured in interleaved rounds so machine load hits all models alike.

    Every round times each model once (order rotated per round); a timing runs enough forward passes to
    last about `min_time` seconds, as estimated from the last warm-up pass. `bar` (a tqdm bar) advances by
    one after each model's warm-up and each timing, outside the timed region.
    """
    iters: dict[str, int] = {}
    batch = len(next(iter(models.values()))[1]) if models else 0
    with torch.inference_mode():
        for label, (model, x) in models.items():
            _tell(bar, f"warm-up @{batch} {label}")
            elapsed = 0.0
            for _ in range(max(1, warmup)):
                start = time.perf_counter()
                model(x)
                _sync(x.device)
                elapsed = time.perf_counter() - start
            iters[label] = max(1, math.ceil(min_time / max(elapsed, 1e-6)))
            _advance(bar)
        samples: dict[str, list[float]] = {label: [] for label in models}
        labels = list(models)
        for round_ in range(repeats):
            _tell(bar, f"@{batch} round {round_ + 1}/{repeats}")
            shift = round_ % len(labels)
            for label in labels[shift:] + labels[:shift]:
                model, x = models[label]
                start = time.perf_counter()
                for _ in range(iters[label]):
                    model(x)
                _sync(x.device)
                samples[label].append(iters[label] * len(x) / (time.perf_counter() - start))
                _advance(bar)
    return {label: statistics.median(values) for label, values in samples.items()}


def _tell(bar: Any, text: str) -> None:
    if bar is not None:
        bar.set_description_str(text, refresh=False)


def _advance(bar: Any) -> None:
    if bar is not None:
        bar.update()


# ------------------------------------------------------------------------------------------ table
def run_benchmark(
    specs: list[ModelSpec],
    batch_size: int = 32,
    repeats: int = 5,
    warmup: int = 2,
    min_time: float = 0.3,
    device: str = "cpu",
    img_size: int | None = None,
    accuracies: dict[str, float] | None = None,
    progress: bool = False,
    mode: RunMode | None = None,
    large_batch_size: int | None = None,
) -> list[dict[str, Any]]:
    """One row per model with the CSV_COLUMNS (the host's facts and `mode` included), all models measured in
    the same run: throughput at `batch_size`, `large_batch_size` (None: not measured) and 1, peak memory at
    `batch_size`. progress: a tqdm bar on stderr over every model's memory, build and each timed round."""
    from resmlp.progress import progress_bar

    mode = mode or RunMode()
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but no CUDA GPU is visible; use --device cpu")
    compile_mode(mode.compile, dev)  # a mode this device can't run is refused before any work
    accuracies = _match_accuracies(specs, accuracies or {})
    labels = [s.label for s in specs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a model is listed twice in {labels}; give each once")
    batches = [batch_size, *([large_batch_size] if large_batch_size else []), 1]
    # per model: memory (CPU: its own process), build, then per batch size a warm-up and `repeats` timings
    steps = len(specs) * ((dev.type == "cpu") + 1 + len(batches) * (1 + repeats))
    with (
        progress_bar(total=steps, unit="step", file=sys.stderr, disable=not progress) as bar,
        float32_matmul(mode.precision, dev),
        _recompile_room(mode, len(specs) * len(batches)),
    ):
        # CPU memory first: the measuring processes are forked before this process has run any forward pass
        memory = {}
        if dev.type == "cpu":
            for label, spec in zip(labels, specs, strict=True):
                _tell(bar, f"memory {label}")
                memory[label] = cpu_peak_memory_mb(spec, batch_size, img_size, mode)
                _advance(bar)
        rows, runners, inputs, shapes = [], {}, {}, {}
        for label, spec in zip(labels, specs, strict=True):
            _tell(bar, f"build {label}")
            model, shape = build_model(spec, img_size)
            shapes[label] = shape
            row = dict(model=label, img_size=shape[-1], params_m=round(count_params(model) / 1e6, 2),
                       gmacs=float(f"{count_gmacs(model, shape):.4g}"), batch_size=batch_size,
                       large_batch_size=large_batch_size, top1=accuracies.get(label), device=str(dev),
                       path="optimized" if runs_optimized(model, mode) else "plain", compile=mode.compile)
            runners[label] = timed_model(model, mode, dev)
            del model  # on a GPU the timed copy is what should hold memory
            for batch in batches:  # one input per batch and image shape, shared by the models of that shape
                inputs.setdefault((batch, shape), torch.randn(batch, *shape, device=dev))
            if dev.type == "cuda":
                memory[label] = cuda_peak_memory_mb(runners[label], inputs[batch_size, shape])
            row["peak_memory_mb"] = round(memory[label], 1)
            row["weights_mb"] = round(sum(p.numel() * p.element_size() for p in runners[label].parameters()) / 2**20, 1)
            rows.append(row)
            _advance(bar)
        speeds = {}
        for batch in batches:
            timed = {label: (runners[label], inputs[batch, shapes[label]]) for label in labels}
            speeds[batch] = measure_throughput(timed, repeats, warmup, min_time, bar)
    host = host_info(mode.precision_on(dev))
    for row in rows:
        row["throughput_img_s"] = round(speeds[batch_size][row["model"]], 1)
        row["throughput_large_img_s"] = round(speeds[large_batch_size][row["model"]], 1) if large_batch_size else None
        row["throughput_b1_img_s"] = round(speeds[1][row["model"]], 1)
        row.update(host)
    return [{k: row[k] for k in CSV_COLUMNS} for row in rows]


def measure_accuracies(specs: list[ModelSpec], data: str, data_dir: str | None, device: str) -> dict[str, float]:
    """Test top-1 of every checkpoint-file model on `data` (resmlp.evaluation.evaluate, with its preprocessing)."""
    from resmlp.evaluation import evaluate

    files = [s for s in specs if s.is_file]
    if not files:
        raise ValueError("--val-data measures the top-1 of checkpoint files, and --models names none; list a "
                         ".safetensors/.pth file, or give known accuracies with --accuracy")
    # in fp32 as the table's speeds are (amp 'auto' would pick bf16 on this kind of CPU and move near-ties)
    return {s.label: evaluate(s.name, data=data, data_dir=data_dir, device=device, amp="none",
                              plot=False)["top1"] for s in files}


def parse_accuracies(text: str) -> dict[str, float]:
    """'resmlp_s12=76.6,resnet50=80.4' -> {'resmlp_s12': 76.6, ...}."""
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.rpartition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ValueError(f"bad accuracy {item!r}; expected MODEL=TOP1, e.g. resmlp_s12=76.6")
    return out


def _match_accuracies(specs: list[ModelSpec], accuracies: dict[str, float]) -> dict[str, float]:
    """Accuracy keys may be a model's full label or its bare name; every key must match a listed model."""
    out = {}
    for key, value in accuracies.items():
        hits = [s.label for s in specs if key in (s.label, s.name)]
        if not hits:
            raise ValueError(
                f"--accuracy names {key!r}, which is not in --models ({', '.join(s.name for s in specs)})"
            )
        out.update(dict.fromkeys(hits, value))
    return out


def paper_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ResMLP-S12 / DeiT-S in this table beside the same ratio in the paper's Table 1 (V100, batch 32):
    throughput at the table's batch and large batch, peak memory at the table's batch. Empty when the table
    lacks either model exactly as the paper's (`resmlp_s12`, `timm:deit_small_patch16_224`, 224 px)."""
    by_name = {r["model"]: r for r in rows if r["img_size"] == PAPER_IMG_SIZE}
    if PAPER_S12 not in by_name or PAPER_DEIT_S not in by_name:
        return []
    ours, deit = by_name[PAPER_S12], by_name[PAPER_DEIT_S]
    paper = {key: PAPER_TABLE1[PAPER_S12][key] / PAPER_TABLE1[PAPER_DEIT_S][key] for key in PAPER_TABLE1[PAPER_S12]}
    pairs = [("throughput", "throughput_img_s", "batch_size"),
             ("throughput", "throughput_large_img_s", "large_batch_size"),
             ("peak_memory_mb", "peak_memory_mb", "batch_size")]
    out = []
    for quantity, column, batch in pairs:
        if ours[column] is None or deit[column] is None:  # no large batch measured
            continue
        out.append(dict(quantity=quantity, batch_size=ours[batch], ratio=_ratio(ours[column], deit[column]),
                        paper_ratio=round(paper[quantity], 2), paper_batch_size=PAPER_BATCH,
                        s12_path=ours["path"], **{k: ours[k] for k in ("device", "precision", "compile")}))
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None  # a peak of 0 MB (rounded): no ratio


def ratio_line(ratios: list[dict[str, Any]]) -> str:
    """One line: the measured ratios, each beside the paper's."""
    if not ratios:
        return ""
    first = ratios[0]
    how = f"{first['device']}, {first['precision']}, {'compiled ' + first['compile'] if first['compile'] else 'eager'}"
    parts = [f"{'throughput' if r['quantity'] == 'throughput' else 'peak memory'} "
             f"{'n/a' if r['ratio'] is None else format(r['ratio'], '.2f') + 'x'} at batch {r['batch_size']} "
             f"(paper {r['paper_ratio']:.2f}x at batch {r['paper_batch_size']})" for r in ratios]
    return f"ResMLP-S12 ({first['s12_path']}) / DeiT-S here ({how}): " + "; ".join(parts)


def write_json(rows: list[dict[str, Any]], ratios: list[dict[str, Any]], path: str | Path) -> Path:
    """The table's rows (each with its host, device, path, precision, compile and batches) and the ratios."""
    text = json.dumps(dict(rows=rows, s12_over_deit_s=ratios), indent=2, allow_nan=False)
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def write_csv(rows: list[dict[str, Any]], path: str | Path) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(CSV_COLUMNS))
            writer.writeheader()
            writer.writerows(rows)

    return atomic_write(path, write)


def plot_tradeoff(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Throughput (log scale) vs top-1 of the rows that have an accuracy, like the paper's trade-off plots;
    without any accuracy, the throughput of each model alone (throughput_figure)."""
    import io

    from matplotlib import pyplot as plt

    fig = tradeoff_figure(rows)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    return atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))


def tradeoff_figure(rows: list[dict[str, Any]]):
    """The figure of `plot_tradeoff`."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import LogFormatter

    points = [r for r in rows if r["top1"] is not None]
    if not points:  # no accuracy known: throughput alone
        return throughput_figure(rows)
    fig, ax = plt.subplots(figsize=(6.5, 4.5), layout="constrained")
    ordered = sorted(points, key=lambda r: r["throughput_img_s"])
    for i, r in enumerate(ordered):
        ax.scatter(r["throughput_img_s"], r["top1"], s=30)
        right_half = i >= len(ordered) / 2  # names of the right half go to the left of their point: never clipped
        note = ax.annotate(
            r["model"].split("[")[0],
            (r["throughput_img_s"], r["top1"]),
            textcoords="offset points",
            xytext=(-5 if right_half else 5, 4 if i % 2 == 0 else -11),  # alternate above/below
            ha="right" if right_half else "left",
            fontsize=8,
            parse_math=False,  # a model's name (a file path) is plain text, '$' included
        )
        note.set_in_layout(False)  # long names must not squeeze the axes
    ax.set_xscale("log")
    # plain numbers; minor ticks labelled only over a short range (every minor label over decades overlapped)
    ax.xaxis.set_major_formatter(LogFormatter(labelOnlyBase=False))
    ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))
    ax.margins(x=0.25, y=0.15)
    ax.autoscale_view()
    low, high = ax.get_ylim()
    ax.set_ylim(max(low, 0.0), min(high, 100.0))  # an accuracy axis past 100 % (or below 0) shows nothing real
    ax.set_xlabel(f"Throughput (images/s, batch {points[0]['batch_size']}, {points[0]['device']})")
    ax.set_ylabel("Top-1 accuracy (%)")
    ax.grid(alpha=0.3, which="both")
    ax.set_title("Accuracy vs throughput on this machine", fontsize=10)
    return fig


def throughput_figure(rows: list[dict[str, Any]]):
    """Each model's throughput as a horizontal bar (log scale), fastest on top: the plot of a benchmark run
    without accuracies (no --accuracy, no --val-data)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    ordered = sorted(rows, key=lambda r: r["throughput_img_s"])
    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.35 * len(ordered)), layout="constrained")
    names = [r["model"] for r in ordered]
    ax.barh(range(len(ordered)), [r["throughput_img_s"] for r in ordered], color="tab:blue")
    ax.set_yticks(range(len(ordered)), names, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel(f"Throughput (images/s, batch {ordered[0]['batch_size']}, {ordered[0]['device']})")
    ax.grid(alpha=0.3, which="both", axis="x")
    ax.set_title("Throughput on this machine (no accuracies given: --accuracy or --val-data add them)",
                 fontsize=10)
    return fig

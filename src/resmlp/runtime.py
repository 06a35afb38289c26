"""Where and how computation runs, shared by training, evaluation, translation and the benchmarks.

- devices and torchrun: `DistInfo`, `init_distributed` (DistributedDataParallel's process group: gloo on the
  CPU, nccl on GPUs; rank 0 alone writes files), `all_reduce_sum`, `barrier`, `shutdown`;
- precision: `resolve_amp`, every command's one rule ('auto' -> bf16 where the hardware computes it natively,
  else fp16 on a CUDA GPU, else fp32), `autocast` for the actual device, `grad_scaler` (fp16 on a GPU only);
- threads: `default_threads` (the cores this process may use, shared by the processes of this machine) and
  `process_settings`, which sets threads, determinism and the allocator for a run and restores them afterwards;
- memory: `keep_freed_memory` (glibc's malloc keeps freed blocks for the next step instead of unmapping them).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from resmlp.errors import ConfigError
from resmlp.hostinfo import native_bf16, physical_memory_bytes, usable_cores

AMP_CHOICES = ("auto", "bf16", "fp16", "fp32", "none")  # fp32 and none: the same (none: the older word)


# ------------------------------------------------------------------------------------------ devices, torchrun
@dataclass(frozen=True)
class DistInfo:
    world_size: int
    rank: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


DEVICE_NAME = re.compile(r"auto|cpu|cuda(:[0-9]{1,4})?")


def check_device_name(name: str) -> str:
    """`name` if it is auto, cpu, cuda or cuda:N; else a ValueError saying so (before torch's own parse, whose
    errors for 'cudafoo' or 'cuda:-1' are tracebacks)."""
    if not isinstance(name, str) or not DEVICE_NAME.fullmatch(name):
        raise ConfigError(f"device {name!r} is not auto, cpu, cuda or cuda:N")
    return name


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> this process's GPU when there is one, else the CPU."""
    check_device_name(name)
    if name == "auto":
        name = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {name} was asked for but no CUDA GPU is visible; use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        # torchrun starts one process per --nproc_per_node: process LOCAL_RANK takes cuda:LOCAL_RANK
        count = torch.cuda.device_count()
        raise ValueError(f"process {local_rank} of this machine would use {device} but only {count} GPU(s) are "
                         f"visible: start at most {count} process(es) per machine (torchrun --nproc_per_node="
                         f"{count}), or train on the CPU with --device cpu (gloo)")
    return device


def canonical_device(device: torch.device | str) -> torch.device:
    """`cuda` -> `cuda:N` (the current GPU), so that one device compares equal to itself: tensors always carry
    the index, and a cache keyed by an unindexed device would miss every time."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


SLURM_MASTER_PORT = "29500"  # torchrun's default rendezvous port, for a SLURM job that sets none


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM node list as `scontrol show hostnames` expands it: 'gpu[03-05,9],cpu1' ->
    'gpu03' (a bracket's first range keeps its zero padding). No library here parses SLURM host lists."""
    match = re.match(r"([^,\[]*)(?:\[([^\]]*)\])?([^,]*)", nodelist.strip())
    if not match or not (match.group(1) or match.group(2)):
        raise ConfigError(f"SLURM_NODELIST={nodelist!r} names no host; set MASTER_ADDR to the first node's address")
    prefix, ranges, suffix = match.groups()
    first = (ranges or "").split(",")[0].split("-")[0]
    return f"{prefix}{first}{suffix}"


def env_int(name: str, default: int, low: int = 0, high: int = 1 << 20, env: Any = None) -> int:
    """The integer environment variable `name` (`default` when unset), refused in one line naming the variable
    unless it is plain decimal digits in [low, high]: int() alone takes '1_0', ' 3' and non-ASCII digits, and a
    launcher's junk would otherwise surface as a traceback far from its cause (SLURM_NTASKS=0: a division)."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None:
        return default
    value = int(raw) if re.fullmatch(r"[0-9]{1,9}", raw) else None
    if value is None or not low <= value <= high:
        raise ConfigError(f"{name}={raw[:40]!r}: expected a whole number in [{low}, {high}] (set by torchrun or "
                          f"SLURM's srun); unset it or fix the launch")
    return value


def check_launch_environment(env: Any = None) -> None:
    """Every launch variable this package reads (torchrun's, SLURM's, the rendezvous port), checked before any
    command runs, each named when it is wrong."""
    env = os.environ if env is None else env
    for name, low in (("WORLD_SIZE", 1), ("SLURM_NTASKS", 1), ("SLURM_NNODES", 1), ("LOCAL_WORLD_SIZE", 1),
                      ("RANK", 0), ("LOCAL_RANK", 0), ("SLURM_PROCID", 0), ("SLURM_LOCALID", 0)):
        env_int(name, low, low, env=env)
    env_int("MASTER_PORT", 29500, 1, 65535, env=env)
    for world, rank in (("WORLD_SIZE", "RANK"), ("SLURM_NTASKS", "SLURM_PROCID")):
        if world in env and env_int(rank, 0, env=env) >= env_int(world, 1, 1, env=env):
            raise ConfigError(f"{rank}={env[rank]} is not below {world}={env[world]}: ranks count from 0 to the "
                              "number of processes minus 1")


def adopt_slurm_ranks(env: dict[str, str] | None = None) -> bool:
    """A process started by SLURM's srun, not torchrun: its rank, world size and local rank from SLURM_PROCID,
    SLURM_NTASKS and SLURM_LOCALID (as timm's distributed setup reads them), written to the variables torchrun
    sets (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and torch's env:// rendezvous reads (MASTER_ADDR: the
    first host of SLURM_NODELIST unless given; MASTER_PORT: 29500 unless given). Returns whether it did; a
    torchrun launch (WORLD_SIZE set) is left as it is. Start one task per GPU (`srun --ntasks-per-node=GPUS`);
    a `resmlp train` typed in a batch script outside srun would wait for SLURM_NTASKS processes."""
    env = os.environ if env is None else env
    if "WORLD_SIZE" in env or "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return False
    check_launch_environment(env)
    world, nodes = env_int("SLURM_NTASKS", 1, 1, env=env), env_int("SLURM_NNODES", 1, 1, env=env)
    env.update(RANK=str(env_int("SLURM_PROCID", 0, env=env)), WORLD_SIZE=str(world),
               LOCAL_RANK=str(env_int("SLURM_LOCALID", 0, env=env)), LOCAL_WORLD_SIZE=str(max(1, world // nodes)))
    if world > 1:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        env.setdefault("MASTER_ADDR", first_slurm_host(nodelist))
        env.setdefault("MASTER_PORT", SLURM_MASTER_PORT)
    return True


def init_distributed(device_name: str = "auto") -> DistInfo:
    """Join the process group when launched by torchrun or SLURM's srun (WORLD_SIZE > 1), else single process."""
    check_launch_environment()
    adopt_slurm_ranks()
    world_size = env_int("WORLD_SIZE", 1, 1)
    rank, local_rank = env_int("RANK", 0), env_int("LOCAL_RANK", 0)
    device = resolve_device(device_name, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistInfo(world_size, rank, local_rank, device)


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum over ranks in place (a no-op for one process); nccl needs the tensor on the GPU."""
    if info.enabled:
        on_device = tensor.to(info.device)
        dist.all_reduce(on_device, op=dist.ReduceOp.SUM)
        tensor.copy_(on_device)
    return tensor


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


# ------------------------------------------------------------------------------------------ precision
def resolve_amp(amp: str, device: torch.device) -> str:
    """The one precision rule of every command (train, eval, eval-knn, eval-linear, translate): 'auto' -> bf16
    where the hardware computes it natively, else fp16 with a GradScaler on a CUDA GPU (`cuda_native_bf16`: compute
    capability 8.0 and up), else none on a CPU (native: AVX-512 BF16 / AMX).

    Without native support, CPU bf16 matmuls are emulated and far slower than fp32 (on an AVX2-only
    CPU we measured 0.9 vs 54 GFLOP/s), so 'auto' keeps fp32 there.
    """
    if amp not in AMP_CHOICES:
        raise ValueError(f"amp must be one of {', '.join(AMP_CHOICES)}, got {amp!r}")
    if amp == "fp16" and device.type != "cuda":
        raise ValueError(f"precision fp16 runs on a CUDA GPU only, not on {device.type}; use bf16 or fp32 there")
    if amp != "auto":
        return "none" if amp == "fp32" else amp
    if device.type == "cuda":
        return "bf16" if cuda_native_bf16(device) else "fp16"
    return "bf16" if native_bf16() else "none"


def cuda_native_bf16(device: torch.device) -> bool:
    """Whether this CUDA GPU computes bf16 natively: compute capability 8.0 and up (A100, H100, RTX 30xx...), as
    torch says without counting emulation. torch.cuda.is_bf16_supported() alone counts emulated bf16 (V100, T4:
    capability 7.x) as supported; there fp16 with loss scaling is the native half precision (DINO's --use_fp16)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, _minor = torch.cuda.get_device_capability(index)
    return major >= 8 and torch.cuda.is_bf16_supported(including_emulation=False)


def precision_name(amp: str) -> str:
    """The precision as reports name it: fp32 (train.amp `none`), bf16 or fp16."""
    return "fp32" if amp == "none" else amp


def is_accelerator(device: torch.device | None) -> bool:
    """A device with its own memory (CUDA, ...): data is kept there and copies overlap with compute."""
    return device is not None and device.type not in ("cpu", "meta")


def autocast(device: torch.device, amp: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on CPU or GPU, fp16 on GPU, or nothing."""
    if amp == "none":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if amp == "bf16" else torch.float16)


def grad_scaler(amp: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 gradients need loss scaling (CUDA only); bf16 has fp32's range and needs none."""
    return torch.amp.GradScaler(device.type) if amp == "fp16" else None


# ------------------------------------------------------------------------------------------ compile
def compile_module(module: torch.nn.Module, **options: Any) -> torch.nn.Module:
    """torch.compile(module, **options), with a kernel cache of its own when the CPU kernels are restricted
    (ATEN_CPU_CAPABILITY=avx2, the way to rehearse an AVX2 host on a newer CPU).

    inductor's on-disk cache key does not include that restriction: kernels built under it and reused at
    full AVX-512 (or the reverse) corrupted the heap or returned NaN losses here (torch 2.14.1). A
    TORCHINDUCTOR_CACHE_DIR the user chose is left alone (torch itself sets the variable to its default on
    import; inductor reads it at each compile).
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability and os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = f"{default_cache_dir()}_{capability.lower()}"
    return torch.compile(module, **options)


# ------------------------------------------------------------------------------------------ threads
def default_threads(local_world_size: int | None = None) -> int:
    """Compute threads for one process: the cores it may use (affinity, cgroup quota) shared by the
    processes torchrun started on this machine. torch's own default counts every core of the machine,
    which oversubscribes a shared or containerised host."""
    local = local_world_size or env_int("LOCAL_WORLD_SIZE", 1, 1)
    return max(1, usable_cores() // max(1, local))


def data_workers(requested: int, local_world_size: int | None = None) -> int:
    """DataLoader worker processes for one process: `requested`, capped by its share of the usable cores (a
    recipe written for an 8-core GPU node asks for 8; on 2 cores they only fight the training for the CPU, and
    torch warns about every loader). The cap is said once per process."""
    local = local_world_size or env_int("LOCAL_WORLD_SIZE", 1, 1)
    cap = max(1, usable_cores() // max(1, local))
    if requested <= cap:
        return requested
    if not _capped_workers:
        _capped_workers.append(requested)
        print(f"note: data.num_workers={requested} capped to {cap}: this process can use {cap} CPU core(s)",
              file=sys.stderr, flush=True)
    return cap


_capped_workers: list[int] = []  # the first capped request (a note once per process)
_contexts_keeping_memory = 0  # open process_settings contexts that hold keep_freed_memory (they may nest)


@contextlib.contextmanager
def process_settings(threads: int | None = None, deterministic: bool = False) -> Iterator[None]:
    """Set compute threads (None: default_threads()), determinism and keep_freed_memory(), and restore them
    afterwards, so a Python caller's session is left as it was (the allocator as keep_freed_memory(False)
    leaves it)."""
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads or default_threads())
    if deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    global _contexts_keeping_memory
    kept = _contexts_keeping_memory > 0 or keep_freed_memory(True)
    _contexts_keeping_memory += kept
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])
        _contexts_keeping_memory -= kept
        if kept and _contexts_keeping_memory == 0:  # the outermost context gives the memory back
            keep_freed_memory(False)


# ------------------------------------------------------------------------------------------ memory
# mallopt parameters and defaults (glibc's malloc.h and mallopt(3))
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4
GLIBC_MMAP_MAX = 65536  # glibc's default number of blocks it may serve from mmap at once
GLIBC_MMAP_THRESHOLD_MAX = 32 * 2**20  # where glibc's dynamic mmap threshold stops rising (64-bit)


def glibc_malloc() -> bool:
    """Whether this process's malloc is glibc's (the one keep_freed_memory can set)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keep_freed_memory(enabled: bool = True) -> bool:
    """Have glibc's malloc serve every block from its heap and keep what is freed (True), or go back to the
    state its defaults reach once a program has freed large blocks (False), returning the kept memory to the
    system. Returns False, changing nothing, where the C library is not glibc.

    Why: a training step allocates the same large tensors every step (resmlp_s12, batch 32, fp32: 38.5 MB for
    each of fc1's outputs and their gradients). glibc serves blocks above its mmap threshold (at most 32 MiB)
    from fresh mmap pages and unmaps them when they are freed, so every step page-faults ~1.9 GB in again and
    the kernel zeroes it: 320,000-540,000 faults and 1.2-2.4 s of system time per 4.6-6.3 s step on a 2-core
    host (benchmarks/page_faults.py; docs/training.md, "The allocator"). tcmalloc or jemalloc (LD_PRELOAD)
    would do the same job but must be installed and preloaded; glibc's own switch needs nothing. The cost:
    the process holds its peak memory until this is switched off or it exits.
    """
    if not glibc_malloc():
        return False
    libc = ctypes.CDLL(None)  # the malloc this process actually uses
    if enabled:  # no block from mmap; a trim threshold of -1 switches trimming off (mallopt(3))
        return bool(libc.mallopt(M_MMAP_MAX, 0) and libc.mallopt(M_TRIM_THRESHOLD, -1))
    # setting any of these turns glibc's dynamic threshold off, so the values it would have risen to are set
    ok = (libc.mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX) and libc.mallopt(M_MMAP_THRESHOLD, GLIBC_MMAP_THRESHOLD_MAX)
          and libc.mallopt(M_TRIM_THRESHOLD, 2 * GLIBC_MMAP_THRESHOLD_MAX))
    libc.malloc_trim(0)
    return bool(ok)


def is_main_process() -> bool:
    """Rank 0 of a torchrun job, or a single process: the one that prints and writes."""
    return env_int("RANK", 0) == 0


def copy_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor on `device` without making the host wait: to a GPU through page-locked memory, so the copy
    is queued like a kernel (a copy from pageable memory may synchronise with the stream first)."""
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_device(images: torch.Tensor | list[torch.Tensor], device: torch.device,
               channels_last: bool = False) -> torch.Tensor | list[torch.Tensor]:
    """A batch (a tensor, or a list of crops) on `device`, channels-last when asked."""
    if isinstance(images, (list, tuple)):
        return [to_device(crop, device, channels_last) for crop in images]
    images = images.to(device, non_blocking=True)
    return images.contiguous(memory_format=torch.channels_last) if channels_last else images


def training_device_memory_bytes(device: str) -> int | None:
    """The memory a run on `device` trains in: its GPU's where the device is (or `auto` finds) a GPU, else the
    machine's."""
    gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if gpu and torch.cuda.is_available():
        index = int(device.split(":")[1]) if ":" in device else env_int("LOCAL_RANK", 0)
        if index < torch.cuda.device_count():
            return torch.cuda.get_device_properties(index).total_memory
    return physical_memory_bytes()


STOP_SIGNALS = ("SIGTERM", "SIGUSR1", "SIGINT")  # a run stops for them: resmlp.train.preemption


def worker_ignores_stop_signals(worker_id: int) -> None:
    """A DataLoader worker's start: the signals a run stops for are the training process's to act on. A scheduler
    (and a terminal's Ctrl-C) signals every process of a job; the training process stops at a step boundary and
    shuts its workers down, but a worker killed first (torch's workers die on any SIGTERM but their parent's)
    makes torch raise in the middle of a step. So SIGINT and SIGUSR1 are ignored, and SIGTERM ends the worker
    only when its parent sends it (torch's rule; the parent's shutdown and exit send it), read by a thread."""
    for name in STOP_SIGNALS:
        if name != "SIGTERM" and hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # POSIX
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the worker's threads start after: blocked too
        threading.Thread(target=_exit_on_parents_sigterm, args=(os.getppid(),), daemon=True).start()


def _exit_on_parents_sigterm(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)

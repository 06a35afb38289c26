"""Where a number was measured: CPU model and capability, native bf16, GPU, threads, library versions.

Every summary.json, benchmark file and benchmark table records this, because the same command gives
different speeds (and, through `amp: auto`, a different precision) on an AVX2 host and an AVX-512 BF16 one.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

import torch


@functools.cache
def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform.processor()."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16() -> bool:
    """True where bf16 matrix products run natively on the CPU (AVX-512 BF16 or AMX), not emulated.

    The CPU's flags alone are not enough: with its kernels restricted to AVX2 (`ATEN_CPU_CAPABILITY=avx2`,
    `ONEDNN_MAX_CPU_ISA=AVX2`, the way to rehearse an AVX2-only host on a newer CPU) bf16 is emulated, so
    the process behaves as an AVX2 host does, `amp: auto` included.
    """
    flags = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    return bool(flags and torch.backends.cpu.get_cpu_capability() == "AVX512" and _onednn_allows_bf16())


def _onednn_allows_bf16() -> bool:
    # oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) that include bf16 products: AVX512_CORE_BF16 and every later level
    # (..._FP16, ..._AMX..., AVX10_*); AVX2, AVX2_VNNI(_2), AVX512_CORE and AVX512_CORE_VNNI stop below it
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return cap in ("ALL", "DEFAULT", "") or cap.startswith("AVX10") or (
        cap.startswith("AVX512_CORE") and any(level in cap for level in ("BF16", "FP16", "AMX")))


def usable_cores() -> int:
    """CPU cores this process may use: its affinity mask, capped by a cgroup v2 CPU quota when one is set."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cores = min(cores, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def physical_memory_bytes() -> int | None:
    """This machine's memory, capped by a cgroup v2 memory limit when one is set; None where unknown."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            total = min(total, int(limit))
    except (OSError, ValueError):
        pass
    return total


def host_info(precision: str | None = None) -> dict[str, Any]:
    """The host facts a measured number needs beside it; `precision` is the one actually used."""
    import timm

    info: dict[str, Any] = dict(
        cpu=cpu_model(), cpu_capability=torch.backends.cpu.get_cpu_capability(), native_bf16=native_bf16(),
        gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        threads=torch.get_num_threads(), usable_cores=usable_cores(), torch=torch.__version__,
        timm=timm.__version__,
    )
    if precision is not None:
        info["precision"] = precision
    return info


def host_line() -> str:
    """One line: 'host: AMD EPYC, AVX512, native bf16 yes, 2 threads, torch 2.14.1, no GPU'."""
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    return (f"host: {cpu_model()}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"native bf16 {'yes' if native_bf16() else 'no'}, {torch.get_num_threads()} threads, "
            f"torch {torch.__version__}, {gpu}")

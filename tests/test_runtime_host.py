"""Host facts that decide behaviour: native bf16 (hence `amp: auto`), the default thread count, the allocator."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch
from hostspeed import limit

from resmlp import hostinfo, runtime

CPU = torch.device("cpu")


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU whose flags say AVX-512 BF16, whatever this host is."""
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)


def test_auto_precision_is_bf16_only_where_bf16_is_native(bf16_cpu, monkeypatch):
    assert hostinfo.native_bf16() and runtime.resolve_amp("auto", CPU) == "bf16"
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not hostinfo.native_bf16() and runtime.resolve_amp("auto", CPU) == "none"


@pytest.mark.parametrize("restriction", ["aten", "onednn"])
def test_kernels_restricted_to_avx2_behave_as_an_avx2_host(bf16_cpu, monkeypatch, restriction):
    # ATEN_CPU_CAPABILITY=avx2 / ONEDNN_MAX_CPU_ISA=AVX2 rehearse an AVX2-only host: bf16 is emulated there
    if restriction == "aten":
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    else:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not hostinfo.native_bf16()
    assert runtime.resolve_amp("auto", CPU) == "none"
    assert hostinfo.host_info("none")["native_bf16"] is False


@pytest.mark.parametrize(("cap", "native"), [
    ("AVX2_VNNI_2", False), ("AVX512_CORE", False), ("avx512_core_vnni", False), ("SSE41", False),
    ("AVX512_CORE_BF16", True), ("AVX512_CORE_AMX", True), ("AVX10_1_512_AMX_FP16", True), ("ALL", True)])
def test_a_onednn_isa_cap_below_bf16_means_emulated_bf16(bf16_cpu, monkeypatch, cap, native):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert hostinfo.native_bf16() is native


def test_explicit_precision_is_kept_and_bad_ones_are_explained():
    assert runtime.resolve_amp("bf16", CPU) == "bf16" and runtime.resolve_amp("none", CPU) == "none"
    with pytest.raises(ValueError, match="fp16 runs on a CUDA GPU only"):
        runtime.resolve_amp("fp16", CPU)
    with pytest.raises(ValueError, match="amp must be one of"):
        runtime.resolve_amp("fp8", CPU)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_default_threads_share_the_usable_cores_among_local_processes(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(hostinfo, "Path", lambda p: tmp_path / "no-cgroup")  # no quota file: affinity decides
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert runtime.default_threads() == 8
    assert runtime.default_threads(local_world_size=2) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    assert runtime.default_threads() == 2  # torchrun's processes on this machine split the cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert runtime.default_threads() == 1  # never zero


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux-only")
def test_a_cgroup_cpu_quota_caps_the_usable_cores(monkeypatch, tmp_path):
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: one whole core
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr(hostinfo, "Path", lambda p: tmp_path / "cpu.max")
    assert hostinfo.usable_cores() == 1
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no quota
    assert hostinfo.usable_cores() == 8


def test_restricted_cpu_kernels_get_a_compile_cache_of_their_own(monkeypatch):
    # inductor's cache key ignores ATEN_CPU_CAPABILITY; sharing the cache across it corrupted the heap here
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # what torch sets on import
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    runtime.compile_module(torch.nn.Linear(2, 2))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == default_cache_dir()  # unrestricted: torch's default
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    compiled = runtime.compile_module(torch.nn.Linear(2, 2))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"].endswith("_avx2") and hasattr(compiled, "_orig_mod")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/chosen")
    runtime.compile_module(torch.nn.Linear(2, 2))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/chosen"  # the user's choice wins


# Page faults of touching a 64 MiB tensor allocated again after one of the same size was freed: in glibc's
# default state a block that large comes from mmap and is unmapped when freed, so all 16,384 pages fault in
# again; kept by the heap, none do once the heap holds a free block that large (the fewest of 8 tries: the first
# ones after the switch grow the heap). Leaving the context gives the kept memory back (resident set shrinks).
# Run in a fresh process so that pytest's own allocator state is left alone.
REALLOCATION_FAULTS = textwrap.dedent("""
    import json, os, resource, torch
    from resmlp import runtime

    def fewest_faults_of_a_reallocation(tries):
        faults = []
        for _ in range(tries):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            torch.ones(16 * 2**20).sum()  # allocate, touch, free
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return min(faults)

    def resident_bytes():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    result = {"default": fewest_faults_of_a_reallocation(3)}
    with runtime.process_settings(threads=1):
        with runtime.process_settings(threads=1):  # nested: the outer context still holds the setting after
            result["nested"] = fewest_faults_of_a_reallocation(8)
        result["kept"] = fewest_faults_of_a_reallocation(3)
        result["resident_inside"] = resident_bytes()
    result["resident_after"] = resident_bytes()
    print(json.dumps(result))
""")


@pytest.mark.skipif(not runtime.glibc_malloc(), reason="the allocator setting is glibc's")
def test_training_settings_keep_freed_memory_and_give_it_back_afterwards():
    done = subprocess.run([sys.executable, "-c", REALLOCATION_FAULTS], capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=limit(120))
    result = json.loads(done.stdout)
    pages = 64 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert result["default"] > pages // 2  # mmapped afresh every time
    assert result["nested"] < pages // 20 and result["kept"] < pages // 20  # served from kept memory
    assert result["resident_inside"] - result["resident_after"] > 32 * 2**20  # the kept 64 MiB went back


def test_keep_freed_memory_changes_nothing_outside_glibc(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    monkeypatch.setattr(runtime.ctypes, "CDLL", lambda *a: pytest.fail("must not touch the C library"))
    assert runtime.keep_freed_memory(True) is False and runtime.keep_freed_memory(False) is False

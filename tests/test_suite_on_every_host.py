"""The suite on every host type and on a slow or shared one (issue 57.5), and its quick subset (issue 56.5).

- the benchmarks' CPU dry runs use the host's `amp: auto` (bf16 only where native), never emulated bf16;
- subprocess limits scale with the measured host speed (tests/hostspeed.py) and, when one expires, the test fails
  in one line naming the limit, the scale and the command;
- the `slow` and `hosttype` markers are registered, and the README's quick subset selects fewer tests.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import conftest
import hostspeed
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(params=[False, True], ids=["emulated-bf16", "native-bf16"])
def native(request, monkeypatch) -> bool:
    """The CPU's bf16 as `amp: auto` sees it (resmlp.runtime.resolve_amp), either way on any host."""
    monkeypatch.setattr("resmlp.runtime.native_bf16", lambda: request.param)
    return request.param


@pytest.mark.hosttype
def test_the_gpu_reports_cpu_dry_run_measures_in_the_hosts_auto_precision(native, tmp_path):
    gpu_report = benchmark("gpu_report")
    cpu = argparse.Namespace(device="cpu", tiny=True)
    auto = "bf16" if native else "fp32"
    assert gpu_report.precision(cpu) == auto
    assert gpu_report.precision(argparse.Namespace(device="cuda", tiny=False)) == "bf16"  # what a GPU reports
    command = gpu_report.throughput_command(cpu, 64, tmp_path / "raw.json")
    assert command[command.index("--precision") + 1] == auto


@pytest.mark.hosttype
def test_the_pipeline_benchmark_trains_in_the_hosts_auto_precision(native, tmp_path, monkeypatch):
    train_pipeline = benchmark("train_pipeline")
    (tmp_path / "train" / "a").mkdir(parents=True)
    ran = []

    class Ran(Exception):
        pass

    def record(cmd, **kwargs):
        ran.append(cmd)
        raise Ran

    monkeypatch.setattr(train_pipeline.subprocess, "run", record)
    monkeypatch.setattr(sys, "argv", ["train_pipeline.py", "--folder", str(tmp_path), "--device", "cpu", "--only",
                                      "ours", "--epochs", "1"])
    with pytest.raises(Ran):
        train_pipeline.main()
    amp = ran[0][ran[0].index("--amp") + 1]
    assert amp == ("bf16" if native else "none")  # the default is the host's auto, as `resmlp train` names it


def test_kernels_restricted_to_avx2_alone_make_auto_and_the_dry_run_fp32(tmp_path):
    """ATEN_CPU_CAPABILITY=avx2 (the rehearsal of an AVX2-only host; oneDNN left unrestricted) runs ATen's emulated
    bf16 kernels: native bf16 says no there, so `amp: auto` and the gpu_report dry run compute in fp32."""
    code = ("import argparse, runpy, torch; from resmlp.hostinfo import native_bf16; "
            "from resmlp.runtime import resolve_amp; "
            "report = runpy.run_path('benchmarks/gpu_report.py'); "
            "print(torch.backends.cpu.get_cpu_capability(), native_bf16(), resolve_amp('auto', torch.device('cpu')), "
            "report['precision'](argparse.Namespace(device='cpu')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "ATEN_CPU_CAPABILITY": "avx2"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=hostspeed.limit(120))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["AVX2", "False", "none", "fp32"]


def test_no_benchmark_script_writes_bf16_into_a_command_line():
    """`"--amp", "bf16"` / `"--precision(s)", "bf16"` written into a benchmark's command runs emulated bf16 in its CPU
    dry run on an AVX2 host (~60x slower: the gpu_report test ran past its limit); the precision comes from the
    host's auto (gpu_report.precision, train_pipeline's default) instead."""
    forced = re.compile(r"""["'](--amp|--precisions?)["'],\s*["']bf16["']""")
    found = [f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
             for path in sorted((ROOT / "benchmarks").glob("*.py"))
             for text in [path.read_text()] for m in forced.finditer(text)]
    assert found == []
    assert forced.search('cmd = ["--amp", "bf16"]')  # the pattern finds what it looks for


# ------------------------------------------------------------------------------------------ host speed
@pytest.fixture
def fresh_scale(monkeypatch):
    monkeypatch.delenv(hostspeed.ENV, raising=False)
    hostspeed.host_scale.cache_clear()
    yield
    hostspeed.host_scale.cache_clear()


def test_limits_scale_with_the_measured_host_and_never_shrink(fresh_scale, monkeypatch):
    def scale(seconds: float, load: float) -> float:
        monkeypatch.setattr(hostspeed, "workload_seconds", lambda: seconds)
        monkeypatch.setattr(hostspeed, "load_ratio", lambda: load)
        hostspeed.host_scale.cache_clear()
        return hostspeed.limit(100) / 100

    reference = hostspeed.REFERENCE_SECONDS
    assert scale(reference / 3, 0.2) == 1  # a faster host keeps the reference limits
    assert scale(4 * reference, 0.5) == pytest.approx(4)  # a 4x slower one gets 4x
    assert scale(reference, 6.0) == pytest.approx(6)  # a shared one: 6 processes per core
    assert scale(100 * reference, 0) == hostspeed.MAX_SCALE  # a hung command still fails in bounded time


def test_the_scale_can_be_set_and_a_bad_setting_is_named(fresh_scale, monkeypatch):
    monkeypatch.setenv(hostspeed.ENV, "3")
    assert hostspeed.limit(100) == 300
    monkeypatch.setenv(hostspeed.ENV, "0.5")
    hostspeed.host_scale.cache_clear()
    assert hostspeed.limit(100) == 100
    monkeypatch.setenv(hostspeed.ENV, "fast")
    hostspeed.host_scale.cache_clear()
    with pytest.raises(ValueError, match=f"{hostspeed.ENV}='fast': give a number >= 1"):
        hostspeed.limit(100)


def test_the_measured_workload_runs_and_takes_time():
    seconds = hostspeed.workload_seconds()
    assert 0 < seconds < 60 and torch.get_num_threads() >= 1  # the thread count is restored


@pytest.mark.parametrize("wrapper", [conftest.pytest_runtest_call, conftest.pytest_runtest_setup],
                         ids=["test", "fixture"])
def test_an_expired_limit_fails_in_one_line_naming_the_limit_the_scale_and_the_command(fresh_scale, monkeypatch,
                                                                                         wrapper):
    monkeypatch.setenv(hostspeed.ENV, "2")
    cmd = [sys.executable, "-c", "import sys, time; print('started', flush=True); time.sleep(30)"]
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        subprocess.run(cmd, capture_output=True, text=True, timeout=hostspeed.limit(2))
    hook = wrapper(None)  # the wrapper around every test's call (and its fixtures' setup)
    next(hook)
    with pytest.raises(pytest.fail.Exception) as failed:
        hook.throw(expired.value)
    message = str(failed.value)
    assert failed.value.pytrace is False
    assert message.startswith("the command timed out after 4.0 s (2.0 s on the reference host x host scale 2.00")
    assert shlex.join(cmd[:2]) in message and "started" in message  # the command and its last output


# ------------------------------------------------------------------------------------------ the quick subset
def test_the_slow_and_hosttype_markers_are_registered(pytestconfig):
    markers = pytestconfig.getini("markers")  # pyproject.toml's [tool.pytest.ini_options]
    assert {m.split(":")[0] for m in markers} >= {"cuda", "slow", "hosttype"}


def collect(*words: str) -> str:
    """`pytest --collect-only` of two files here (the whole suite's collection takes a minute on a loaded host)."""
    files = ["tests/test_benchmark_scripts.py", f"tests/{Path(__file__).name}"]
    done = subprocess.run([sys.executable, *words, "--collect-only", "-p", "no:cacheprovider", *files], cwd=ROOT,
                          capture_output=True, text=True, timeout=hostspeed.limit(120))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def test_the_readmes_quick_subset_leaves_the_slow_tests_out():
    readme = (ROOT / "README.md").read_text()
    quick = re.search(r"`(\.venv/bin/python -m pytest -q -m \"not slow\")`", readme)
    assert quick, "README.md names the quick subset's command"
    words = shlex.split(quick.group(1))
    assert words[0] == ".venv/bin/python"
    out = collect(*words[1:])
    counts = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", out)
    assert counts, out[-2000:]
    selected, total, deselected = map(int, counts.groups())
    assert 0 < selected < total and selected + deselected == total
    assert "test_the_gpu_report_dry_runs_every_part_on_the_cpu_and_merges" not in out  # a slow one
    assert "test_the_readmes_quick_subset_leaves_the_slow_tests_out" in out  # a quick one


def test_ci_runs_the_readmes_command_then_the_hosttype_tests_as_on_an_avx2_host():
    readme = (ROOT / "README.md").read_text()
    script = (ROOT / ".ci" / "run").read_text()
    lines = [line.strip() for line in script.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    full = "bash .ci/setup && .venv/bin/python -m pytest -q"
    rehearsal = "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python -m pytest -q -m hosttype"
    assert f"```bash\n{full}\n```" in readme and lines.count(full) == 1 and lines.index(full) < lines.index(rehearsal)
    assert lines[lines.index(rehearsal) - 1] == 'if [ "$capability" = AVX512 ]; then'  # only where not AVX2 already
    marked = collect("-m", "pytest", "-q", "-m", "hosttype")
    assert "test_the_gpu_report_dry_runs_every_part_on_the_cpu_and_merges" in marked
    assert "test_the_pipeline_benchmark_trains_in_the_hosts_auto_precision" in marked

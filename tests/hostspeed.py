"""How much slower than the reference host this one runs the suite: the tests' subprocess time limits scale with it.

A fixed limit fails a correct test on a slower or shared host (issue 57: seven tests of
test_benchmark_scripts.py timed out at a fixed 300 s on a loaded 2-core host, one of them passed alone in
134 s). So a test names the limit its command needs on the reference host, with a margin, and runs it with
`limit(seconds)`: that limit times the host scale, measured once per session and never below 1:

- speed: a fixed small workload (a pure-Python loop and single-threaded fp32 matrix products, what a test's
  subprocess spends its time on: importing, interpreting, small kernels), the median of 3 timings, over the
  time it takes on the reference host (REFERENCE_SECONDS: the suite's AVX-512 EPYC development host);
- sharing: the 1-minute load average over the cores this process may use (a host shared with other work slows
  down later, after the workload was timed).

The larger of the two, capped at MAX_SCALE (a hung command still fails in bounded time).
`RESMLP_TEST_TIMEOUT_SCALE=N` sets the scale instead (N >= 1). When a limit expires, tests/conftest.py turns the
`subprocess.TimeoutExpired` into one failure line naming the limit, the scale and the command
(`timed_out_message`). `python tests/hostspeed.py` prints this host's figures.
"""

from __future__ import annotations

import functools
import os
import shlex
import statistics
import subprocess
import time

REFERENCE_SECONDS = 0.12  # the workload on the reference host (AVX-512 EPYC, 2 cores): the fastest of repeated timings
MAX_SCALE = 10.0
ENV = "RESMLP_TEST_TIMEOUT_SCALE"


def workload_seconds() -> float:
    """One timing of the fixed workload: a million iterations of a Python loop, then 100 fp32 256x256 matrix products
    on one thread (~0.12 s on the reference host)."""
    import torch

    threads = torch.get_num_threads()
    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i % 7
        for _ in range(100):
            a = torch.tanh(a @ a * (1 / 256))
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def load_ratio() -> float:
    """The 1-minute load average over the cores this process may use (0 where the platform has none)."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        return 0.0
    from resmlp.hostinfo import usable_cores

    return load / usable_cores()


@functools.cache
def host_scale() -> float:
    """How many times the reference host's limits this host needs: >= 1, <= MAX_SCALE (or RESMLP_TEST_TIMEOUT_SCALE)."""
    if os.environ.get(ENV):
        try:
            return max(1.0, float(os.environ[ENV]))
        except ValueError:
            raise ValueError(f"{ENV}={os.environ[ENV]!r}: give a number >= 1") from None
    speed = statistics.median(workload_seconds() for _ in range(3)) / REFERENCE_SECONDS
    return min(MAX_SCALE, max(1.0, speed, load_ratio()))


def limit(seconds: float) -> float:
    """A subprocess time limit: `seconds` (what the command needs on the reference host, with a margin) times the
    host scale."""
    return seconds * host_scale()


def timed_out_message(err: subprocess.TimeoutExpired) -> str:
    """One line (and the command's last output) for a limit that expired, instead of a TimeoutExpired traceback."""
    cmd = err.cmd if isinstance(err.cmd, str) else shlex.join(str(c) for c in err.cmd)
    scale = host_scale()
    output = "".join(o.decode(errors="replace") if isinstance(o, bytes) else o
                     for o in (err.output, err.stderr) if o)
    tail = f"\nits last output:\n{output[-2000:]}" if output.strip() else ""
    return (f"the command timed out after {_seconds(err.timeout)} s ({_seconds(err.timeout / scale)} s on the "
            f"reference host x host scale {scale:.2f}, tests/hostspeed.py; {ENV}=N sets a larger scale): {cmd}{tail}")


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


if __name__ == "__main__":
    times = [workload_seconds() for _ in range(5)]
    print(f"workload: {', '.join(f'{t:.3f}' for t in times)} s (reference {REFERENCE_SECONDS} s); "
          f"load per core {load_ratio():.2f}; host scale {host_scale():.2f}")

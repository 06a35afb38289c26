"""Preemption: SIGTERM (what a scheduler sends before it kills), SIGUSR1 (SLURM's warning signal, asked for with
`#SBATCH --signal=USR1@120`) and SIGINT (Ctrl-C) stop a training run at a step boundary with the resumable state
--max-steps writes (resmlp.train.controls), in the first epoch as in any other.

The handler only records the signal: the step loop asks `agreed(step)` between steps, so the state is written at a
step boundary, where resume is exact. A second signal gets the signal's usual action (a second Ctrl-C interrupts
at once). DataLoader workers forked during the run inherit the handler and ignore the signals (SLURM and a
terminal's Ctrl-C signal every process; workers set SIG_IGN, resmlp.runtime.worker_ignores_stop_signals): the
run stops them as it ends.

Several processes (torchrun, or srun without torchrun): a signal may reach one rank only, or every rank during
different steps, and all must stop at the same boundary (a rank that stopped alone would leave the others waiting
in a collective). At each step boundary every rank starts a non-blocking all-reduce (the largest signal number
received, 0 for none; CPU tensors on a gloo group of its own, so the device is not synchronised) and waits on the
one it started a boundary earlier, complete by then (the step between exchanged gradients with every rank): all
ranks read the same value at the same boundary and stop there, one step after the signal reached a rank at most.
Rank 0 writes the state, every rank exits with 128 + the signal's number. A repeat within REPEAT_S seconds of
the first signal is that signal delivered twice (SLURM signals every process of a job step, and torchrun forwards
what it receives to its workers), not a second request; once the ranks agreed, further signals are ignored until
the process exits (torchrun signals the other workers as the first one exits).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist

from resmlp.runtime import STOP_SIGNALS, DistInfo

REPEAT_S = 2.0  # a repeat sooner than this after the first signal is the same request (several processes only)
_clock = time.monotonic
_received: list[tuple[str, float]] = []  # the signal that asked the running training to stop, and when
_vote: list[StopVote] = []  # while a run of several processes trains: their agreement


def requested() -> str | None:
    """The name of the signal that asked this process to stop (SIGTERM...), or None."""
    return _received[0][0] if _received else None


def agreed(step: int) -> str | None:
    """The name of the signal every process stops for at the boundary after optimizer step `step`, or None; one
    process: the signal it received."""
    return _vote[0].poll(step) if _vote else requested()


class StopVote:
    """The ranks' agreement on a stop (see the module's docstring). `poll(step)` at each step boundary; every rank
    polls the same boundaries (the training loop is the same on each), more than once each at no cost."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")  # a collective: every rank creates it, at the same point
        self.step: int | None = None
        self.pending: tuple[dist.Work, torch.Tensor] | None = None
        self.result: str | None = None

    def poll(self, step: int) -> str | None:
        if self.result is not None or step == self.step:
            return self.result
        self.step = step
        if self.pending is not None:
            (work, flag), self.pending = self.pending, None
            work.wait()  # started a step ago, and every rank has stepped since: complete
            if int(flag.item()):
                self.result = signal.Signals(int(flag.item())).name
                return self.result
        received = requested()
        flag = torch.tensor([int(getattr(signal, received)) if received else 0], dtype=torch.int64)
        self.pending = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group, async_op=True), flag
        return None

    def close(self) -> None:
        """After the last boundary of a run that ended normally: the last exchange's wait (every rank started it)."""
        if self.pending is not None:
            self.pending[0].wait()
            self.pending = None


@contextlib.contextmanager
def stop_on_signals(info: DistInfo | None = None) -> Iterator[None]:
    """While a run trains: STOP_SIGNALS ask it to stop at a step boundary (`agreed(step)`, agreed by every rank
    of `info`'s processes); the previous handlers are restored after (several processes stopped by a signal:
    the signals are ignored until the process exits). Outside the main thread (where Python takes no
    handlers): nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    processes, rank = (info.world_size, info.rank) if info is not None else (1, 0)
    signals = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]  # no SIGUSR1 on Windows
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def handle(signum: int, frame: object) -> None:
        if os.getpid() != owner:  # a forked DataLoader worker (a scheduler signals every process): the run decides
            return
        if _received:
            if _vote and (_vote[0].result or _clock() - _received[0][1] < REPEAT_S):
                return  # stopping already, or the same request delivered twice
            restore()  # the second: the signal's usual action, now
            signal.raise_signal(signum)
            return
        _received.append((signal.Signals(signum).name, _clock()))
        if processes == 1:
            print(f"{requested()} received: stopping after this step to write a resumable state (send it again "
                  "to stop at once)", file=sys.stderr, flush=True)
        else:
            print(f"rank {rank}: {requested()} received: all {processes} processes stop within two steps, at the "
                  f"step boundary they agree on, to write a resumable state (send it again, {REPEAT_S:g} s or more "
                  "later, to stop this process at once)", file=sys.stderr, flush=True)

    owner = os.getpid()
    _received.clear()
    if processes > 1:
        _vote.append(StopVote())
    for sig in signals:
        signal.signal(sig, handle)
    finished = False
    try:
        yield
        finished = True
    finally:
        vote = _vote[0] if _vote else None
        if vote is not None and vote.result:
            for sig in signals:  # stopped together: a launcher's signal as the first rank exits is no request
                signal.signal(sig, signal.SIG_IGN)
        else:
            restore()
        _vote.clear()
        if vote is not None and finished:
            vote.close()
        _received.clear()

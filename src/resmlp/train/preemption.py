"""Preemption: SIGTERM (what a scheduler sends before it kills), SIGUSR1 (SLURM's warning signal, asked for with
`#SBATCH --signal=USR1@120`) and SIGINT (Ctrl-C) stop a training run at the end of the optimizer step under way,
with the resumable state --max-steps writes (resmlp.train.controls), in the first epoch as in any other.

The handler only records the signal: the step loop asks `requested()` between steps, so the state is written at a
step boundary, where resume is exact. A second signal gets the signal's usual action (a second Ctrl-C interrupts
at once). DataLoader workers forked during the run inherit the handler and ignore the signals (SLURM and a
terminal's Ctrl-C signal every process; workers set SIG_IGN, resmlp.runtime.worker_ignores_stop_signals): the
run stops them as it ends. One process only: under torchrun each rank would see the signal at a different step
and stop apart (a collective would hang), so there the signals keep their usual action.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from resmlp.runtime import STOP_SIGNALS

_received: list[str] = []  # the signal that asked the running training to stop (empty: none)


def requested() -> str | None:
    """The name of the signal that asked the run to stop (SIGTERM...), or None."""
    return _received[0] if _received else None


@contextlib.contextmanager
def stop_on_signals(enabled: bool = True) -> Iterator[None]:
    """While a run trains: STOP_SIGNALS ask it to stop at the next step boundary (`requested()`); the previous
    handlers are restored after. Not `enabled` (several processes), or outside the main thread (where Python
    takes no handlers): nothing changes."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]  # no SIGUSR1 on Windows
    previous = {sig: signal.getsignal(sig) for sig in signals}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def handle(signum: int, frame: object) -> None:
        if os.getpid() != owner:  # a forked DataLoader worker (a scheduler signals every process): the run decides
            return
        if _received:  # the second: the signal's usual action, now
            restore()
            signal.raise_signal(signum)
            return
        _received.append(signal.Signals(signum).name)
        print(f"{_received[0]} received: stopping after this step to write a resumable state (send it again to stop "
              "at once)", file=sys.stderr, flush=True)

    owner = os.getpid()
    _received.clear()
    for sig in signals:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        restore()
        _received.clear()

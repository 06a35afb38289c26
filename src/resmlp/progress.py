"""Progress on the screen, or plain log lines where the stream is not a terminal.

A tqdm bar redraws itself with carriage returns, which a terminal overwrites and a log file keeps: a redirected
training run once wrote a 366 KB log of 14 "lines". Where the stream is not a terminal (a file, a pipe, a
cluster job's log), `progress_bar` returns `LineProgress` instead: the same calls (update, set_postfix, close,
iteration), one plain line each time the bar would show new numbers (timm's training scripts log the same way),
at most one every `min_interval_s` seconds, and a last line at close.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

LINE_SECONDS = 10.0  # the shortest gap between two plain lines where the bar refreshes by time, not by steps


def is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def progress_bar(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
                 initial: int = 0, file: IO[str] | None = None, min_interval_s: float = LINE_SECONDS,
                 disable: bool = False, leave: bool = True) -> Any:
    """A tqdm bar on a terminal, else a LineProgress: the same interface either way."""
    stream = file if file is not None else sys.stderr
    if disable or is_terminal(stream):
        from tqdm.auto import tqdm

        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, file=stream, dynamic_ncols=True,
                    disable=disable, leave=leave)
    return LineProgress(iterable, total=total, desc=desc, unit=unit, initial=initial, file=stream,
                        min_interval_s=min_interval_s)


class LineProgress:
    """tqdm's interface as plain lines: `desc: n/total unit (p%), key value, ...`."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", initial: int = 0, file: IO[str] | None = None,
                 min_interval_s: float = LINE_SECONDS) -> None:
        if total is None and hasattr(iterable, "__len__"):  # as tqdm: a sized iterable gives the total
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.n, self.file, self.min_interval_s = initial, file if file is not None else sys.stderr, min_interval_s
        self.postfix: dict[str, Any] = {}
        self.start = time.perf_counter()
        self.last_line: float | None = None  # the first line comes as soon as there is something to say
        self.n_at_line = self.initial = initial  # a resumed run's earlier steps: not part of this run's rate

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
            self._maybe_line()
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, refresh: bool = False, **values: Any) -> None:
        """New numbers: a line, unless the last one is under min_interval_s old."""
        self.postfix = values
        self._maybe_line()

    def set_description_str(self, desc: str | None = None, refresh: bool = False) -> None:
        """A new phase (a benchmark's next model): a line, unless the last one is under min_interval_s old."""
        self.desc = desc or ""
        self._maybe_line()

    def close(self) -> None:
        if self.n != self.n_at_line:
            self._line()
        self.n_at_line = self.n

    def _maybe_line(self) -> None:
        now = time.perf_counter()
        if self.last_line is None or now - self.last_line >= self.min_interval_s:
            self._line()

    def _line(self) -> None:
        self.last_line, self.n_at_line = time.perf_counter(), self.n
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        elapsed = self.last_line - self.start
        extra = "".join(f", {k} {v}" for k, v in self.postfix.items() if v != "")
        per_s = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        rate = f", {per_s:.3g} {self.unit}/s" if per_s > 0 else ""  # as tqdm's bar shows
        print(f"{self.desc + ': ' if self.desc else ''}{done} {self.unit}{share}{extra}, {elapsed:.0f}s{rate}"
              f"{self._eta(per_s)}", file=self.file, flush=True)

    def _eta(self, per_s: float) -> str:
        """The time left at this run's rate, in tqdm's format (its bar's `<01:23`), where there is a total."""
        from tqdm import tqdm

        if not (self.total and per_s > 0 and self.n < self.total):
            return ""
        return f", ETA {tqdm.format_interval((self.total - self.n) / per_s)}"

"""Counting the aten ops a piece of code dispatches: on a GPU each is at most one kernel launch, a few
microseconds of host time, so a batch's count says how much Python stands between the card and its work
(benchmarks/device_op_counts.py, `resmlp benchmark --pipeline`)."""

from __future__ import annotations

from collections import Counter

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched inside it, by name; not prim ops (prim.device: a metadata query that fake
    tensors route through the dispatcher and real ones answer from the tensor, never a kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "prim":
            self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

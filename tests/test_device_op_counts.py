"""The deit device path dispatches a fixed number of ops per batch (benchmarks/device_op_counts.py): counted by a
TorchDispatchMode at batch 16 and 256 on CPU tensors and on fake CUDA tensors (tests/fakecuda.py), where each op
would be a kernel launch. A per-image loop anywhere in the path (one crop, one erase, one step per image)
grows the count ~16x from 16 to 256 and fails here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import device_op_counts as op_counts  # noqa: E402

MAX_GROWTH = 1.2  # issue 47: ops(256) / ops(16)
MAX_OPS = 600  # issue 47: at most ~600 ops per batch at 256 for the deit path


@pytest.mark.parametrize("device", ["cpu", "fake-cuda"])
def test_the_deit_path_dispatches_as_many_ops_at_256_as_at_16(device):
    with op_counts.on(device) as where:
        small, large = (sum(op_counts.count("deit", batch, where).values()) for batch in (16, 256))
    assert large <= MAX_GROWTH * small, (small, large)
    assert large <= MAX_OPS, large


def test_the_counter_sees_a_per_image_loop():
    def per_image(batch: int, device: str):
        images = op_counts.images(batch, device)
        return lambda: [image.float().mean() for image in images]

    op_counts.PATHS["per image"] = per_image
    try:
        small, large = (sum(op_counts.count("per image", batch).values()) for batch in (16, 256))
    finally:
        del op_counts.PATHS["per image"]
    assert large == 16 * small

"""resmlp.data.device.augment.keyed_normal at the edge of its uniform: the key below hashes the first counter to
bits whose top 24 are all ones, where a 24-bit uniform (k + 0.5) * 2^-24 rounds to 1.0 in float32 and the
inverse CDF gives inf (a deit run erased an image with inf and stopped on a NaN loss at step 2)."""

from __future__ import annotations

import torch

from resmlp.data.device.augment import _lowbias32, _shift_right, keyed_normal

EDGE_KEY = 15340575  # found by search: _lowbias32(_lowbias32(0) ^ EDGE_KEY) >> 8 == 2^24 - 1


def test_the_noise_is_finite_where_the_hash_is_all_ones():
    counters = _lowbias32(torch.zeros(1, 1, dtype=torch.int32))
    assert int(_shift_right(_lowbias32(counters ^ EDGE_KEY), 8)) == 2 ** 24 - 1
    noise = keyed_normal(counters, torch.tensor([EDGE_KEY], dtype=torch.int32))
    assert torch.isfinite(noise).all() and noise.item() > 4  # the far tail, not clipped to a middle value

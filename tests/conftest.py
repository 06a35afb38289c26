"""Shared test helpers: small models and weights that look trained (not the near-identity init)."""

from __future__ import annotations

import subprocess

import pytest
import torch
from hostspeed import timed_out_message

from resmlp.models.resmlp import ResMLP, ResMLPConfig


def make_trained_like_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter with random values of trained-model scale, in place.

    Affine/LayerNorm scales around 1 with random shifts, LayerScale around 0.1, matrices with
    1/sqrt(fan_in) scale, so every sublayer contributes and a folding mistake shows in the logits.
    """
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim > 1:  # uniform with the variance of N(0, 1/fan_in): much faster for 400M weights
                bound = (3 / p[0].numel()) ** 0.5
                p.uniform_(-bound, bound, generator=gen)
                continue
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32).to(p.dtype)
            if leaf == "gamma":
                p.copy_(0.1 * (1 + 0.5 * noise))
            elif leaf == "alpha" or (leaf == "weight" and p.ndim == 1):
                p.copy_(1 + 0.2 * noise)
            else:
                p.copy_(0.1 * noise)
    for buf_name, buf in model.named_buffers():
        if buf_name.endswith("running_var"):
            buf.uniform_(0.5, 1.5, generator=gen)
        elif buf_name.endswith("running_mean"):
            buf.normal_(0, 0.1, generator=gen)
    return model


def build_fast(config: ResMLPConfig, seed: int = 0) -> ResMLP:
    """A model with trained-like weights, built without the (slow for 400M parameters) default init."""
    with torch.device("meta"):
        model = ResMLP(config)
    model = model.to_empty(device="cpu")
    for buf in model.buffers():  # BatchNorm statistics; make_trained_like_ sets them
        buf.zero_()
    return make_trained_like_(model, seed).eval()


TINY = dict(img_size=32, patch_size=8, dim=32, depth=2, num_classes=7)


@pytest.fixture
def tiny_config() -> ResMLPConfig:
    return ResMLPConfig(**TINY)


# ------------------------------------------------------------------------------------------ host and precision
def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `cuda` run where a CUDA GPU is visible (`pytest -m cuda` selects them), else are skipped."""
    if torch.cuda.is_available():
        return
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU (run with `pytest -m cuda` on a GPU machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(no_gpu)


def pytest_report_header(config) -> str:
    """One line saying where the suite ran, so a CI log tells an AVX2 host from an AVX-512 BF16 one."""
    from resmlp.hostinfo import host_line

    return host_line()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A subprocess time limit (`hostspeed.limit`) that expires fails the test in one line naming the limit, the
    host scale and the command, not a TimeoutExpired traceback."""
    try:
        return (yield)
    except subprocess.TimeoutExpired as err:
        message = timed_out_message(err)
    pytest.fail(message, pytrace=False)  # outside the except: no "during handling" chain


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    """The same for a fixture's command (a run trained once for a module's tests)."""
    try:
        return (yield)
    except subprocess.TimeoutExpired as err:
        message = timed_out_message(err)
    pytest.fail(message, pytrace=False)  # outside the except: no "during handling" chain


# How far two training runs that differ only in rounding (compile vs eager, two processes vs one, accumulation
# vs a full batch) may drift apart, as a fraction of how far the weights moved. With plain SGD an update is
# linear in the gradient, so a rounding difference stays a rounding difference. Measured on the tiny recipes
# (AVX-512 BF16 host): fp32 ~2e-7, bf16 autocast ~1e-3; the bounds leave a wide margin for other CPUs while a
# real difference (a skipped or doubled step moves the weights ~1/steps = 25 % apart) still fails.
DRIFT_BOUND = {"none": 1e-4, "bf16": 0.05}


def assert_same_training(init: dict[str, torch.Tensor], a: dict[str, torch.Tensor], b: dict[str, torch.Tensor],
                         amp: str, what: str, bound: float | None = None) -> None:
    """Runs a and b from the same initial weights moved the same way, within the precision's drift bound
    (or `bound`, where the caller states another)."""
    assert a.keys() == b.keys() == init.keys()
    keys = [k for k in a if a[k].is_floating_point()]
    moved_a = torch.cat([(a[k] - init[k]).flatten().double() for k in keys])
    moved_b = torch.cat([(b[k] - init[k]).flatten().double() for k in keys])
    assert moved_a.norm() > 0, f"{what}: the weights did not move; the comparison would be empty"
    drift = ((moved_a - moved_b).norm() / moved_a.norm()).item()
    assert drift < (bound or DRIFT_BOUND[amp]), f"{what} ({amp}): runs drifted {drift:.3g} of the update apart"

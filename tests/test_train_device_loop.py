"""The device-generic training loop, tested on the CPU: no host reads in the step, the update undone on the
device after a non-finite loss, the batch augmentation's device path equal to the CPU path, compile auto."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pytest
import torch
from timm.optim import create_optimizer_v2

from resmlp.data import ArrayDataset, ResumableSampler
from resmlp.data.device.batch_augment import BatchAugment, array_batches
from resmlp.data.loading.prefetch import DevicePrefetcher
from resmlp.evaluation import classify
from resmlp.train import train
from resmlp.train.step import TIMED_STEPS, CompileChoice, RunningTotals, UpdateGuard, all_finite, total_grad_norm

TINY = {
    "data.kind": "synthetic", "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16,
    "model.patch_size": 4, "model.dim": 16, "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
    "train.batch_size": 8, "train.progress": False, "data.synthetic_size": [160, 32], "train.threads": 1,
    "train.compile": False,
}


# ------------------------------------------------------------------------------------------ host reads
class HostReads:
    """Counts every way a tensor's value reaches Python: item, cpu, tolist, numpy, bool, float, int.

    Reads made inside torch itself are not counted: its optimizers keep their step counters on the CPU on
    purpose (reading them is no device synchronisation); every read by resmlp, timm or the test is."""

    NAMES = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__")

    def __init__(self, monkeypatch) -> None:
        self.count = 0
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def counted(tensor, *args, **kwargs):
            if f"{os.sep}torch{os.sep}" not in sys._getframe(1).f_code.co_filename:
                self.count += 1
            return original(tensor, *args, **kwargs)

        return counted


def test_training_reads_the_host_once_per_log_interval(tmp_path, monkeypatch):
    """20 steps with log_every_steps=5: the step itself never reads a tensor on the host; the reads are the
    4 log reads plus a constant for the end of the epoch (weights check, evaluation, checkpoints)."""
    steps, every = 20, 5
    overrides = {**TINY, "train.log_every_steps": every, "data.val_size": 0}
    counter = {}

    from resmlp.train import trainer as trainer_module

    original = trainer_module.Trainer._train_epoch

    def counted_epoch(self):
        reads = HostReads(monkeypatch)
        original(self)
        counter["epoch"] = reads.count
        monkeypatch.undo()

    monkeypatch.setattr(trainer_module.Trainer, "_train_epoch", counted_epoch)
    summary = train("fashion-mnist-quick", tmp_path / "run", overrides=overrides)
    assert summary["epochs"] == 1
    # 160 images / batch 8 = 20 steps: a read every 5 steps, plus the sampler's permutation and the resumed
    # loss sum at the start of the epoch
    assert counter["epoch"] <= steps // every + 3, counter


def test_evaluation_reads_the_host_once(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    batches = [(torch.randn(4, 12), torch.randint(0, 3, (4,)), 0) for _ in range(10)]
    reads = HostReads(monkeypatch)
    result = classify(model, batches, 3, torch.device("cpu"), "none")
    count = reads.count
    monkeypatch.undo()
    assert count <= 2, count  # one read of all the sums, whatever the number of batches
    assert result["images"] == 40 and result["confusion"].sum() == 40
    logits = model(torch.cat([b[0] for b in batches]))
    targets = torch.cat([b[1] for b in batches])
    assert result["top1"] == pytest.approx(100 * (logits.argmax(1) == targets).float().mean().item())


def test_evaluation_refuses_non_finite_outputs():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    with torch.no_grad():
        model[1].bias[0] = math.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        classify(model, [(torch.randn(4, 12), torch.zeros(4, dtype=torch.int64), 0)], 3, torch.device("cpu"), "none")


# ------------------------------------------------------------------------------------------ the update guard
@pytest.mark.parametrize("opt", ["adamw", "lamb", "momentum"])
def test_a_non_finite_step_leaves_weights_and_optimizer_state_as_they_were(opt):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.GELU(), torch.nn.Linear(5, 2))
    optimizer = create_optimizer_v2(model, opt=opt, lr=0.1, weight_decay=0.05, momentum=0.9)
    guard = UpdateGuard(model, optimizer, torch.device("cpu"))

    def step(scale: float) -> torch.Tensor:
        return guarded_step(model, optimizer, guard, torch.randn(4, 6), scale)[1]

    assert not step(math.nan)  # the very first step: the state it created goes back to zero
    assert all(torch.isfinite(p).all() for p in model.parameters())
    state_tensors = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    assert all(torch.isfinite(v).all() for v in state_tensors)
    assert step(1.0)
    weights = [p.detach().clone() for p in model.parameters()]
    state = optimizer_tensors(optimizer)
    assert not step(math.inf)
    assert all(torch.equal(a, p) for a, p in zip(weights, model.parameters(), strict=True))
    after = optimizer_tensors(optimizer)
    assert state.keys() == after.keys() and all(torch.equal(state[k], after[k]) for k in state)
    if opt != "momentum":  # the step counters (AdamW's per parameter, LAMB's per group) did not advance
        assert any("step" in key for key in state)
    assert step(1.0)  # and a good step moves the weights again
    assert not all(torch.equal(a, p) for a, p in zip(weights, model.parameters(), strict=True))


def guarded_step(model, optimizer, guard: UpdateGuard, inputs: torch.Tensor, scale: float):
    """One optimizer step of a loss scaled by `scale` (NaN/inf: a non-finite step) under `guard`: (loss, ok)."""
    loss = model(inputs).pow(2).mean() * scale
    loss.backward()
    ok = all_finite(loss.detach(), total_grad_norm(model, None))
    before = guard.before_step()
    optimizer.step()
    guard.after_step(before, ok)
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), ok


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every tensor of the optimizer's state, the per-group step counters (timm's LAMB) included, cloned."""
    out = {f"{id(p)}.{k}": v.clone() for p, s in optimizer.state.items() for k, v in s.items() if torch.is_tensor(v)}
    out.update({f"group{i}.{k}": v.clone() for i, g in enumerate(optimizer.param_groups) for k, v in g.items()
                if torch.is_tensor(v)})
    return out


def test_running_totals_name_the_first_bad_step():
    totals = RunningTotals(torch.device("cpu"))
    for step, value in enumerate([1.0, 2.0, math.nan, 3.0, math.inf]):
        loss = torch.tensor(value)
        totals.add(loss, torch.isfinite(loss), step)
    assert totals.read() == (6.0, 2, 2)
    totals.reset()
    assert totals.read() == (0.0, -1, 0)


# ------------------------------------------------------------------------------------------ data on the device
def _dataset(n: int = 12, size: int = 20, colour: bool = True) -> ArrayDataset:
    rng = np.random.default_rng(0)
    shape = (n, size, size, 3) if colour else (n, size, size)
    return ArrayDataset(rng.integers(0, 256, shape, dtype=np.uint8), rng.integers(0, 3, n), ["a", "b", "c"])


@pytest.mark.parametrize("in_chans", [1, 3])
def test_the_resident_path_augments_exactly_as_the_cpu_path(in_chans):
    """The path a GPU takes (dataset kept on the device, boxes and erasing drawn per image on the CPU, pixels
    computed where the images are) gives the CPU path's batches bit for bit when the device is the CPU."""
    data = _dataset()
    augment = BatchAugment(16, in_chans, [0.5] * in_chans, [0.25] * in_chans, scale=(0.3, 1.0), hflip=0.5,
                           reprob=0.9)
    sampler = ResumableSampler(data, seed=3)
    sampler.set_position(1)
    on_cpu = list(array_batches(data, sampler, 4, augment))
    resident = list(array_batches(data, sampler, 4, augment, device=torch.device("cpu")))
    assert len(on_cpu) == len(resident) == 3
    for (a, la, _), (b, lb, _) in zip(on_cpu, resident, strict=True):
        assert torch.equal(la, lb)
        assert torch.equal(a, b)


def test_device_erasing_paints_what_timm_paints():
    augment = BatchAugment(16, 3, [0.5] * 3, [0.25] * 3, reprob=0.7)
    x = torch.randn(32, 3, 16, 16)
    seeds = list(range(100, 132))
    expected, got = x.clone(), x.clone()
    augment._erase(expected, seeds)
    augment._erase_on_device(got, seeds)
    assert torch.equal(expected, got)
    assert not torch.equal(expected, x)  # something was erased


def test_prefetcher_yields_every_batch_in_order():
    batches = [(torch.full((2, 1), float(i)), torch.tensor([i, i]), i) for i in range(5)]
    out = list(DevicePrefetcher(iter(batches), torch.device("cpu")))
    assert [b[2] for b in out] == list(range(5))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, out, strict=True))


# ------------------------------------------------------------------------------------------ compile auto
@pytest.mark.parametrize(("step_seconds", "remaining", "expected"), [(0.01, 100, False), (0.5, 1000, True)])
def test_compile_auto_weighs_the_rest_of_the_run_against_compiling(monkeypatch, step_seconds, remaining, expected):
    clock = {"now": 0.0}
    monkeypatch.setattr("resmlp.train.step.time.perf_counter", lambda: clock["now"])
    choice = CompileChoice("auto", torch.device("cpu"))
    decisions = []
    for _ in range(2 + TIMED_STEPS):
        clock["now"] += step_seconds
        decisions.append(choice.after_step(remaining, lambda: None))
    assert decisions[:-1] == [None] * (1 + TIMED_STEPS) and decisions[-1] is expected
    assert choice.decided is expected and "train.compile=auto" in choice.reason
    assert choice.after_step(remaining, lambda: None) is None  # decided once
    assert not choice.cuda_graphs  # CUDA graphs only on a GPU


def test_compile_setting_is_forced_and_recorded(tmp_path):
    summary = train("fashion-mnist-quick", tmp_path / "run", overrides={**TINY, "train.compile": "auto"})
    assert summary["compile"]["compiled"] is False and "auto" in summary["compile"]["why"]  # a 20-step run
    assert CompileChoice("true", torch.device("cuda")).cuda_graphs
    assert not CompileChoice("true", torch.device("cuda"), world_size=2).cuda_graphs


def test_compile_auto_compiles_mid_run_and_trains_the_eager_weights(tmp_path, monkeypatch):
    """With the threshold at zero, auto compiles after its timed eager steps; the run goes on compiled (the
    model object swapped mid-epoch) and ends where an eager run ends, within the rounding bound."""
    from conftest import assert_same_training
    from test_train_engine import initial_weights

    import resmlp

    monkeypatch.setattr("resmlp.train.step.COMPILE_PAYS_AFTER", {"cpu": 0.0, "cuda": 0.0})
    base = {**TINY, "train.amp": "none", "optim.name": "sgd", "optim.lr": 0.05, "data.synthetic_size": [96, 32],
            "model.depth": 2}
    compiled = train("fashion-mnist-quick", tmp_path / "auto", overrides={**base, "train.compile": "auto"})
    eager = train("fashion-mnist-quick", tmp_path / "eager", overrides=base)
    assert compiled["compile"]["compiled"] and "> 0 s" in compiled["compile"]["why"]
    assert not eager["compile"]["compiled"]
    a, b = (resmlp.load(tmp_path / run / "last.safetensors").state_dict() for run in ("auto", "eager"))
    assert_same_training(initial_weights(base), a, b, "none", "compile auto mid-run vs eager")


def test_a_compiled_run_says_the_first_step_compiles(tmp_path, capsys):
    """The progress bar waits at step 1 while torch compiles: a line says so first (issue 35, item 12)."""
    from test_fake_cuda import COMMON

    from resmlp.runtime import init_distributed
    from resmlp.train import load_config
    from resmlp.train.tasks import SupervisedTask
    from resmlp.train.trainer import Trainer

    cfg = load_config("fashion-mnist-quick", {**COMMON, "train.device": "cpu", "train.compile": True,
                                              "train.amp": "fp32"})
    Trainer(cfg, tmp_path / "run", init_distributed("cpu"), False, SupervisedTask(cfg))  # built, not run
    assert "train.compile=true: the first step compiles the model" in capsys.readouterr().out

"""The training loop's GPU path (skipped without CUDA; `pytest -m cuda` on a GPU machine): the dataset kept on
the device and augmented there agrees with the CPU path, the step never synchronises with the host between log
reads, and a run on the GPU writes what a CPU run writes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from resmlp.data import ArrayDataset, ResumableSampler
from resmlp.data.device.batch_augment import BatchAugment, array_batches
from resmlp.data.loading.prefetch import DevicePrefetcher
from resmlp.train import train

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY = {
    "data.kind": "synthetic", "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16,
    "model.patch_size": 4, "model.dim": 16, "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
    "train.batch_size": 8, "train.progress": False, "data.synthetic_size": [160, 32], "train.compile": False,
    "data.scale": [0.5, 1.0], "data.hflip": 0.5, "data.reprob": 0.5, "train.device": "cuda",
}


def test_device_augmentation_agrees_with_the_cpu_path():
    rng = np.random.default_rng(0)
    data = ArrayDataset(rng.integers(0, 256, (16, 24, 24, 3), dtype=np.uint8), rng.integers(0, 3, 16), list("abc"))
    augment = BatchAugment(16, 3, [0.5] * 3, [0.25] * 3, scale=(0.3, 1.0), hflip=0.5, reprob=0.9)
    sampler = ResumableSampler(data, seed=1)
    sampler.set_position(0)
    on_cpu = list(array_batches(data, sampler, 8, augment))
    on_gpu = list(array_batches(data, sampler, 8, augment, device=torch.device("cuda")))
    for (a, la, _), (b, lb, _) in zip(on_cpu, on_gpu, strict=True):
        assert b.device.type == "cuda" and torch.equal(la, lb.cpu())
        # same boxes, flips and erased noise; only the bicubic arithmetic may round differently
        torch.testing.assert_close(b.cpu(), a, atol=1e-4, rtol=1e-4)


def test_prefetcher_copies_ahead_on_a_side_stream():
    batches = [(torch.full((4, 3), float(i)).pin_memory(), torch.tensor([i] * 4), 0) for i in range(4)]
    out = list(DevicePrefetcher(iter(batches), torch.device("cuda")))
    assert all(x.device.type == "cuda" and t.device.type == "cuda" for x, t, _ in out)
    assert [int(t[0]) for _, t, _ in out] == [0, 1, 2, 3]


def test_steps_between_log_reads_never_synchronise(tmp_path, monkeypatch):
    """torch's sync debug mode turns every host synchronisation into an error inside the steps between reads."""
    from resmlp.train import trainer as trainer_module

    original_forward_backward = trainer_module.Trainer._forward_backward
    original_step = trainer_module.Trainer._optimizer_step

    def strict(method):
        def wrapped(self, *args):
            torch.cuda.set_sync_debug_mode("error")
            try:
                return method(self, *args)
            finally:
                torch.cuda.set_sync_debug_mode("default")

        return wrapped

    monkeypatch.setattr(trainer_module.Trainer, "_forward_backward", strict(original_forward_backward))
    monkeypatch.setattr(trainer_module.Trainer, "_optimizer_step", strict(original_step))
    summary = train("fashion-mnist-quick", tmp_path / "run", overrides={**TINY, "train.log_every_steps": 10})
    assert summary["device"].startswith("cuda") and summary["epochs"] == 1


def test_a_gpu_run_scores_its_test_split_as_eval_does(tmp_path):
    from resmlp.cli import main

    summary = train("fashion-mnist-quick", tmp_path / "run", overrides=TINY)
    scored = summary["test_scored_with"]
    assert scored["device"].startswith("cuda")
    amp = {"fp32": "none"}.get(scored["precision"], scored["precision"])
    assert main(["eval", str(tmp_path / "run" / "best.safetensors"), "--output", str(tmp_path / "eval"),
                 "--device", "cuda", "--batch-size", str(scored["batch_size"])] +
                (["--amp", amp] if amp != "bf16" else [])) == 0
    evaluated = json.loads((tmp_path / "eval" / "summary.json").read_text())
    assert evaluated["precision"] == scored["precision"]
    assert evaluated["test_top1"] == summary["test_top1"]

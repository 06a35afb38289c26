"""No host wait per batch in any device path (issue 53): tests/fakecuda.py flags a host-to-device copy the host
waits for -- a tensor built on the GPU from Python data (`torch.tensor(list, device=cuda)`,
`cuda_tensor.new_tensor(list)`), `.to(cuda)` / `.cuda()` of pageable memory or with non_blocking=False, a CUDA
tensor indexed with a host index -- as it flags reads, and counts the pinned non-blocking copies (`uploads`).

The deit batch ops (crop + resample, flip, RandAugment, erasing), DINO's multi-crop, the uint8 finish and the
evaluation batches then run under it, a batch after a warm-up batch (the per-device constants go up once): no
event at all, at most one upload per batch (the batch's random numbers, packed), the same at 8 and 48 images, and
ops per batch that do not grow with the batch (tests/test_device_op_counts.py's counter).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fakecuda import fake_cuda, is_fake_cuda

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import device_op_counts as op_counts  # noqa: E402

from resmlp.data.device.augment import DeviceAugment  # noqa: E402
from resmlp.data.device.multi_crop import MultiCropAugment  # noqa: E402
from resmlp.data.loading.finish import DeviceFinish  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SMALL, LARGE = 8, 48
MAX_GROWTH = 1.2  # ops(LARGE) / ops(SMALL), as tests/test_device_op_counts.py


# ------------------------------------------------------------------------------------------ the detector
def _pinned(shape=(4,)) -> torch.Tensor:
    return torch.zeros(shape).pin_memory()


BLOCKING = {
    "torch.tensor(list, device=cuda)": lambda x: torch.tensor([1.0, 2.0], device="cuda"),
    "torch.as_tensor(array, device=cuda)": lambda x: torch.as_tensor(np.zeros(3), device="cuda"),
    "new_tensor(list) of a CUDA tensor": lambda x: x.new_tensor([3, 4]),
    ".to(cuda) of pageable memory": lambda x: torch.zeros(4).to("cuda", non_blocking=True),
    ".cuda() of pageable memory": lambda x: torch.zeros(4).cuda(),
    ".to(cuda) of pinned memory, blocking": lambda x: _pinned().to("cuda"),
    "copy_ into a CUDA tensor from pageable memory": lambda x: x.copy_(torch.zeros(4)),
    "a CUDA tensor indexed by a list": lambda x: x[[0, 2]],
    "a CUDA tensor indexed by a CPU tensor": lambda x: x[torch.tensor([0, 2])],
    "a CPU tensor assigned into a CUDA tensor": lambda x: x.__setitem__(slice(0, 2), torch.ones(2)),
}


@pytest.mark.parametrize("name", list(BLOCKING))
def test_the_detector_flags_each_blocking_host_to_device_copy(name):
    with fake_cuda() as ledger:
        x = torch.zeros(4, device="cuda")
        ledger.clear()
        BLOCKING[name](x)
    assert [e.kind for e in ledger.blocking_uploads()] and ledger.blocking_uploads() == ledger.events, name


def test_a_pinned_non_blocking_copy_is_an_upload_not_a_wait():
    with fake_cuda() as ledger:
        x = _pinned().to("cuda", non_blocking=True)
        x.copy_(_pinned(), non_blocking=True)
        y = x.new_full((3,), 2.0)  # filled on the device: no host data
        x[1:3] = 0.5  # a scalar: a fill, no copy
        z = x[torch.arange(2, device="cuda")]  # a device index
    assert is_fake_cuda(x) and is_fake_cuda(y) and is_fake_cuda(z)
    assert ledger.events == [] and len(ledger.uploads) == 2


def test_the_detector_catches_the_old_blocking_copy_of_the_resample(monkeypatch):
    """resample.py's output sizes were `boxes.new_tensor(out_size)` until issue 53: put back, the deit batch ops
    fail this file's test, at that line."""
    from resmlp.data.device import resample

    real = resample.resample_weights

    def with_the_old_line(start, length, valid, out, *args):
        out = start.new_tensor([32, 32]).repeat_interleave(len(start) // 2)  # the old per-batch copy
        return real(start, length, valid, out, *args)

    monkeypatch.setattr(resample, "resample_weights", with_the_old_line)
    with pytest.raises(AssertionError, match="resized_crop"):
        _check_batches(_deit(), "deit")


# ------------------------------------------------------------------------------------------ the device paths
def _images(batch: int, device: str = "cuda") -> list[torch.Tensor]:
    """Decoded uint8 images of different sizes on the device, as nvJPEG leaves them."""
    rng = np.random.default_rng(batch)
    sizes = rng.integers(40, 97, (batch, 2))
    return [torch.empty((3, int(h), int(w)), dtype=torch.uint8, device=device) for h, w in sizes]


def _deit(in_chans: int = 3, **overrides):
    settings = {**op_counts.DEIT, **overrides}
    mean, std = (MEAN, STD) if in_chans == 3 else ((0.5,), (0.25,))
    return lambda batch: (DeviceAugment(32, in_chans, mean, std, batched=True, **settings), _images(batch))


def _grey_bilinear():
    return _deit(in_chans=1, interpolation="bilinear", auto_augment="rand-m9-n3-mstd0.5", reprob=1.0)


def _dino(batch: int):
    return MultiCropAugment(32, 3, MEAN, STD, num_local=6, local_size=16), _images(batch)


PATHS = {"deit": _deit(), "deit, grey model, bilinear, RandAugment n3, every image erased": _grey_bilinear(),
         "deit without RandAugment or erasing": _deit(auto_augment=None, reprob=0.0),
         "dino multi-crop": _dino}


def _check_batches(build, name: str) -> dict[int, int]:
    """One batch after a warm-up at SMALL and LARGE images: no host wait, at most one upload; the ops per batch."""
    ops = {}
    for batch in (SMALL, LARGE):
        with fake_cuda() as ledger:
            augment, pixels = build(batch)
            seeds = list(range(batch))
            augment(pixels, seeds)  # warm-up: the constants go to the device once
            ledger.clear()
            with op_counts.OpCounter() as counter:
                out = augment(pixels, seeds)
        assert all(is_fake_cuda(t) for t in (out if isinstance(out, list) else [out]))
        assert ledger.events == [], f"{name} at {batch}: {ledger.per_site()}"
        assert len(ledger.uploads) <= 1, f"{name} at {batch}: {ledger.per_site(ledger.uploads)}"
        ops[batch] = counter.total
    return ops


@pytest.mark.parametrize("name", list(PATHS))
def test_each_device_path_uploads_once_a_batch_and_never_waits(name):
    ops = _check_batches(PATHS[name], name)
    assert ops[LARGE] <= MAX_GROWTH * ops[SMALL], ops


def test_the_uint8_finish_copies_nothing_per_batch():
    """DeviceFinish (timm's path: uint8 from the workers, normalised on the device): its statistics go up once;
    per batch no copy without erasing, and with erasing one pinned upload of the boxes. Its ops are a constant few
    whatever the batch, erasing included (timm's RandomErasing loops over the images: ops grew with the batch)."""
    for reprob in (0.0, 1.0):
        counts = {}
        for batch in (SMALL, LARGE):
            finish = DeviceFinish(MEAN, STD, reprob)
            with fake_cuda() as ledger:
                images = torch.zeros(batch, 3, 16, 16, dtype=torch.uint8).pin_memory().to("cuda", non_blocking=True)
                finish(images)
                ledger.clear()
                with op_counts.OpCounter() as counter:
                    out = finish(images)
            assert is_fake_cuda(out) and out.dtype == torch.float32
            assert ledger.events == [] and len(ledger.uploads) == (reprob > 0), (reprob, ledger.per_site())
            counts[batch] = counter.total
        assert counts[SMALL] == counts[LARGE] <= (4 if reprob == 0.0 else 40), counts


def test_evaluation_batches_upload_once_a_batch_and_read_once_an_evaluation():
    """`resmlp eval`'s batched form (in-memory images kept on the device): one upload a batch (the batch's
    indices; the crop map is the same every batch and goes up once); classify reads once, at the end."""
    from resmlp.data import build_dataset, resolve_data
    from resmlp.data.device.batch_augment import BatchAugment, eval_batches
    from resmlp.evaluation import classify

    spec = resolve_data("synthetic", None)
    dataset = build_dataset(spec, "test", None, 1, None, img_size=16)
    preprocess = BatchAugment(16, 1, (0.5,), (0.25,), scale=(1, 1), ratio=(1, 1), hflip=0.0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 4))
    with fake_cuda() as ledger:
        model = model.to("cuda")
        batches = list(eval_batches(dataset, range(48), 8, preprocess, device=torch.device("cuda")))
        uploads, waits = list(ledger.uploads), ledger.inside("array_batches", allowed=("ArrayDataset.on_device",))
        ledger.clear()
        classify(model, batches, 4, torch.device("cuda"), "none")
    assert len(batches) == 6 and waits == []  # the dataset goes to the device once (on_device), then no wait
    indices = [e for e in uploads if not e.within("BatchAugment.__call__")]
    assert len(indices) == 6  # one a batch: its indices
    assert len(uploads) - len(indices) == 3  # once: the crop map, the mean and the std
    assert [e.kind for e in ledger.events] == ["read"] and ledger.uploads == []  # classify: the one read, at the end


def test_classify_takes_loader_batches_as_they_come_pinned():
    """DataLoader batches (pin_memory on a GPU): the images and labels go up as the loader pinned them, nothing
    else a batch; a batch from pageable memory is flagged."""
    from resmlp.evaluation import classify

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 4))
    with fake_cuda() as ledger:  # (its pin_memory stands in for the DataLoader's)
        batches = [(torch.zeros(8, 1, 4, 4).pin_memory(), torch.zeros(8, dtype=torch.long).pin_memory(), 0)
                   for _ in range(3)]
        model = model.to("cuda")
        ledger.clear()
        classify(model, batches, 4, torch.device("cuda"), "none")
        per_batch = len(ledger.uploads) / 3
        ledger.clear()
        classify(model, [(torch.zeros(8, 1, 4, 4), torch.zeros(8, dtype=torch.long), 0)], 4,
                 torch.device("cuda"), "none")
    assert per_batch == 2
    assert {e.site() for e in ledger.blocking_uploads()} == {"resmlp.evaluation:classify"}

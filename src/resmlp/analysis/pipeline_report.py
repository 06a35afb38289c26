"""`resmlp benchmark --pipeline`: each data path of a recipe on this machine against the raw training step.

For every path the recipe's data section has (the device path and timm's transform in workers, or the only
one), built as a training run builds it (resmlp.data.loading.batches.TrainBatches, one process): images/s
through reading, decoding, augmentation and the copy to the device (resmlp.data.loading.choice.images_per_second,
the probe's measure with more batches), host CPU ms per batch of the training process, and the aten ops one
batch dispatches there (resmlp.analysis.op_counts; on a CPU host with workers the device path runs in the
workers, whose ops are not counted). Beside them the raw training step of the recipe's model (forward,
cross-entropy, backward and AdamW's step on random images of the batch's shape; DINO's backbone as a
classifier), and the path `data.pipeline: auto` would choose from these figures.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from resmlp.analysis.op_counts import OpCounter
from resmlp.data.loading.assemble import build_data
from resmlp.data.loading.batches import TrainBatches
from resmlp.data.loading.choice import decide, images_per_second
from resmlp.runtime import autocast, resolve_amp, resolve_device
from resmlp.train.config import load_config
from resmlp.train.task_registry import task_for
from resmlp.train.tasks import SupervisedTask


def path_figures(batches: TrainBatches, name: str, device: torch.device, count: int,
                 seconds: float) -> dict[str, float | int]:
    """images/s, host ms per batch and ops per batch of one path (its first batch counted, then timed)."""
    it = batches.open_path(name, 0, 0)
    with OpCounter() as counter:
        next(it)
    handed = 0

    def counted():
        nonlocal handed
        for batch in it:
            handed += 1
            yield batch

    cpu = time.process_time()
    img_s = images_per_second(counted(), device, count, seconds)
    host_ms = 1000 * (time.process_time() - cpu) / max(handed, 1)
    return {"images_per_s": round(img_s, 1), "host_ms_per_batch": round(host_ms, 2), "ops_per_batch": counter.total,
            "batches": handed + 1}


def raw_step_images_per_s(model: torch.nn.Module, shape: tuple[int, ...], classes: int, device: torch.device,
                          amp: str, steps: int = 5) -> float:
    """The model's training step alone on random images of `shape`: images/s over `steps` after one warm-up."""
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(shape, device=device)
    targets = torch.randint(0, classes, (shape[0],), device=device)

    def step() -> None:
        with autocast(device, amp):
            loss = torch.nn.functional.cross_entropy(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return round(shape[0] * steps / (time.perf_counter() - start), 1)


def pipeline_report(recipe: str | Path, overrides: list[str], batch_size: int, device_name: str = "auto",
                    batches: int = 10, seconds: float = 30.0, raw_steps: int = 5) -> dict[str, Any]:
    """Every data path of `recipe` (with `overrides`) at `batch_size` on this machine (module doc)."""
    device = resolve_device(device_name)
    cfg = load_config(recipe, [*overrides, f"train.batch_size={batch_size}", f"train.device={device}"])
    task = task_for(cfg)
    in_chans, img_size = cfg.input_shape()
    data = build_data(cfg.data, in_chans, img_size, cfg.train.seed, task.train_transform())
    train = TrainBatches(data, cfg.train.seed, 1, 0, cfg.data.repeated_aug, batch_size, cfg.data.num_workers, device,
                         cfg.train.channels_last)
    paths = {name: path_figures(train, name, device, batches, seconds) for name in train.paths}
    amp = resolve_amp(cfg.train.amp, device)
    model = SupervisedTask(cfg).build_model(None, len(data.class_names))  # DINO's: its backbone as a classifier
    raw = raw_step_images_per_s(model, (batch_size, in_chans, img_size, img_size), len(data.class_names), device, amp,
                                raw_steps)
    if len(paths) > 1:
        auto = decide({name: row["images_per_s"] for name, row in paths.items()}, device)
        choice = {"name": auto.name, "reason": auto.reason}
    else:
        choice = {"name": next(iter(paths)), "reason": "only eligible path"}
    return {"recipe": cfg.recipe, "device": str(device), "batch_size": batch_size, "workers": cfg.data.num_workers,
            "precision": amp, "paths": paths, "raw_step_images_per_s": raw, "auto_would_choose": choice}


def report_lines(report: dict[str, Any]) -> list[str]:
    """The report as the command prints it."""
    lines = [f"data paths of recipe {report['recipe']} on {report['device']}: batch {report['batch_size']}, "
             f"data.num_workers {report['workers']}",
             f"  {'path':<8}{'images/s':>12}{'host ms/batch':>16}{'ops/batch':>12}"]
    for name, row in report["paths"].items():
        lines.append(f"  {name:<8}{row['images_per_s']:>12,.1f}{row['host_ms_per_batch']:>16,.2f}"
                     f"{row['ops_per_batch']:>12,}")
    lines.append(f"  raw training step ({report['precision']}): {report['raw_step_images_per_s']:,.1f} images/s")
    auto = report["auto_would_choose"]
    lines.append(f"  data.pipeline auto would choose: {auto['name']} ({auto['reason']})")
    return lines

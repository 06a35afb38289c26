"""The training memory estimate of a config: the one number validation refuses a run by (`check_memory`) and
`--dry-run` prints."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from resmlp.complexity import dino_memory_bytes, evaluation_memory_bytes, training_memory_bytes
from resmlp.runtime import training_device_memory_bytes

if TYPE_CHECKING:
    from resmlp.models.resmlp import ResMLPConfig
    from resmlp.train.sections import TrainConfig


def micro_batch(cfg: TrainConfig, processes: int) -> int:
    """Images per process per forward pass: the global batch over processes and accumulation steps."""
    return max(1, cfg.train.batch_size // (cfg.train.grad_accum * processes))


def training_need_bytes(cfg: TrainConfig, model: ResMLPConfig, batch: int) -> int:
    """A lower estimate of one process's memory for training `model` at a micro-batch of `batch`: weights,
    optimizer state and activations (resmlp.complexity), the evaluation's confusion matrix, and DINO's head,
    outputs and crops when the task is DINO."""
    dn = cfg.dino
    dino = 0 if cfg.task_name != "dino" else dino_memory_bytes(
        model.dim, dn.out_dim, dn.hidden_dim, dn.bottleneck_dim, 2 + dn.num_local, model.img_size, batch)
    return training_memory_bytes(model, batch) + evaluation_memory_bytes(model.num_classes) + dino


def check_memory(cfg: TrainConfig) -> list[str]:
    """A preset model whose training would not fit in this machine's memory, refused before it is built."""
    try:
        config = cfg.model_config(cfg.data.synthetic_classes if cfg.data.kind == "synthetic" else None)
    except (ValueError, TypeError):
        return []  # validation reports it (resmlp.train.validation)
    batch = micro_batch(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    need, dino = training_need_bytes(cfg, config, batch), cfg.task_name == "dino"
    have = training_device_memory_bytes(cfg.train.device)  # one process's share (WORLD_SIZE) on its device
    if have is None or need <= have:
        return []
    return [f"model: training {cfg.model['name']} (dim {config.dim}, depth {config.depth}, {config.img_size} px, "
            f"{config.num_classes} classes{', with DINO' if dino else ''}) at a batch of {batch} needs at least "
            f"{need / 2**30:.1f} GiB for weights, optimizer state, activations and the evaluation's confusion "
            f"matrix, more than this device's {have / 2**30:.1f} GiB; lower train.batch_size (or raise "
            "train.grad_accum), model.dim, model.depth, model.img_size, the classes or dino.out_dim"]

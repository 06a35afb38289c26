"""The training memory estimate of a config: the one number validation refuses a run by and `--dry-run` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resmlp.complexity import dino_memory_bytes, evaluation_memory_bytes, training_memory_bytes

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

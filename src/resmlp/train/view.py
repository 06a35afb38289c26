"""What tasks and the resume state see of a run: the Trainer's public attributes, as a Protocol.

Tasks (resmlp.train.tasks, resmlp.train.dino) and the state file (resmlp.train.state) are written against this
view rather than the Trainer class, so that the trainer imports them and none of them imports the trainer, not
even for type checking: train/ has no import cycle.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch
    from torch import nn

    from resmlp.data.loading.assemble import RunData
    from resmlp.runtime import DistInfo
    from resmlp.train.config import TrainConfig


class TrainerView(Protocol):
    cfg: TrainConfig
    out: Path
    info: DistInfo  # world size, rank, device
    amp: str  # the resolved precision: bf16, fp16 or none
    data: RunData  # train / val / test datasets, class names, preprocessing
    train_batches: Any  # resmlp.data.loading.batches.TrainBatches: the training batches and the path they take
    model: nn.Module  # the network being trained (not the DDP / compiled wrapper)
    ema: Any  # timm's ModelEmaV3 or None
    optimizer: torch.optim.Optimizer
    scheduler: Any  # timm's scheduler, stepped per optimizer step
    scaler: Any  # torch.amp.GradScaler (fp16) or None
    task: Any  # the run's Task
    epoch: int
    step_in_epoch: int
    global_step: int
    steps_per_epoch: int
    micro_batch: int  # images per process per forward pass
    history: list[dict[str, Any]]
    best_top1: float
    best_epoch: int
    epoch_totals: torch.Tensor
    wall_before: float
    t0: float
    state_path: Path | None
    lr: float  # the learning rate after scaling by the batch
    compile_choice: Any  # resmlp.train.step.CompileChoice
    tb: Any  # reporting.RunLogs: TensorBoard and the optional experiment loggers (rank 0)
    max_steps: int | None  # the step limit of a smoke run (resmlp.train.controls)

"""torchrun + DistributedDataParallel plumbing: gloo on CPU, nccl on GPU; rank 0 alone writes files."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    world_size: int
    rank: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> this process's GPU when there is one, else the CPU."""
    if name == "auto":
        name = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    elif name == "cuda":
        name = f"cuda:{local_rank}"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"train.device={name} but no CUDA GPU is visible; use --device cpu")
    return device


def init_distributed(device_name: str) -> DistInfo:
    """Join the torchrun process group when launched by torchrun (WORLD_SIZE > 1), else single process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return DistInfo(world_size, rank, local_rank, device)


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum over ranks in place (a no-op for one process)."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def shutdown(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()

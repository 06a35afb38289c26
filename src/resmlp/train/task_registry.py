"""The training paradigms by name, in one place: `task_for` picks a config's task.

Kept apart from the tasks themselves so that no task module imports another to be found (DINO's module imports
the supervised task it extends; nothing imports DINO's but this registry).
"""

from __future__ import annotations

from resmlp.train.config import TrainConfig
from resmlp.train.dino import DINOTask
from resmlp.train.tasks import DistillationTask, FinetuneTask, SupervisedTask, Task

TASK_CLASSES: dict[str, type[Task]] = {"supervised": SupervisedTask, "distillation": DistillationTask,
                                       "finetune": FinetuneTask, "dino": DINOTask}


def task_for(cfg: TrainConfig) -> Task:
    """The task a config asks for (`task`, or inferred from model.name and distill.teacher)."""
    name = cfg.task_name
    if name == "finetune" and cfg.distill.teacher:
        raise ValueError("fine-tuning with a distillation teacher is not supported; distil from scratch "
                         "(model.name a preset) or fine-tune without distill.teacher")
    return TASK_CLASSES[name](cfg)

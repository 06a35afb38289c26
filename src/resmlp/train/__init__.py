"""Training: `train(recipe, output_dir, overrides)`, `finetune(...)`, `pretrain_dino(...)`; tasks in `tasks`."""

from resmlp.train.config import RECIPES, TrainConfig, load_config
from resmlp.train.run import finetune, pretrain_dino, train
from resmlp.train.trainer import NonFiniteLossError

__all__ = ["RECIPES", "NonFiniteLossError", "TrainConfig", "finetune", "load_config", "pretrain_dino", "train"]

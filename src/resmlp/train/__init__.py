"""Training and evaluation: `train(recipe, output_dir, overrides)` and `evaluate(checkpoint, data)`."""

from resmlp.train.config import RECIPES, TrainConfig, load_config
from resmlp.train.engine import NonFiniteLossError, SupervisedLoss, train
from resmlp.train.evaluate import evaluate

__all__ = ["RECIPES", "NonFiniteLossError", "SupervisedLoss", "TrainConfig", "evaluate", "load_config", "train"]

"""Training paradigms as tasks: what differs between supervised training, distillation, fine-tuning and DINO.

The Trainer (resmlp.train.trainer) owns the loop, devices, precision, DDP, checkpoints, resume and logging;
a Task owns the model(s), the loss, what is evaluated, and any state of its own. A task talks to the trainer
only through the trainer's public attributes: cfg, info (devices, ranks), amp, data (RunData), model, ema,
optimizer, epoch, global_step, steps_per_epoch, micro_batch.

Adding a paradigm: subclass Task (or SupervisedTask), override what differs, and add it to TASK_CLASSES in
resmlp.train.task_registry (docs/architecture.md walks through DINOTask, resmlp.train.dino).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from resmlp import reporting
from resmlp.build import build_model, build_model_for_input, freeze_layers, resmlp_start, timm_start
from resmlp.evaluation import EVAL_BATCH_SIZE, classify, eval_batches_or_loader
from resmlp.preprocess import Preprocess
from resmlp.train.config import TrainConfig
from resmlp.train.losses import DistillationLoss, LossFn, freeze, supervised_loss

if TYPE_CHECKING:
    from resmlp.train.view import TrainerView


class Task:
    """The paradigm-specific part of a run; every method has the supervised default."""

    name = "task"

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def train_transform(self) -> Callable[[Preprocess], Any] | None:
        """The training transform built from the preprocessing; None: the recipe's augmentation."""
        return None

    def build_model(self, trainer: TrainerView, num_classes: int) -> nn.Module:
        raise NotImplementedError

    def build_loss(self, trainer: TrainerView, num_classes: int) -> LossFn:
        raise NotImplementedError

    def setup(self, trainer: TrainerView) -> None:
        """After the optimizer, scheduler and EMA exist, before any step or resume."""

    def before_optimizer_step(self, trainer: TrainerView) -> None:
        """After backward and gradient clipping, before the optimizer step."""

    def after_optimizer_step(self, trainer: TrainerView) -> None:
        """After the optimizer step (and the trainer's EMA update)."""

    def evaluate(self, trainer: TrainerView, model: nn.Module) -> tuple[dict[str, Any], float]:
        """End-of-epoch metrics (entries of the epoch's row) and the score that picks the best checkpoint."""
        result = self._classify(trainer, model, trainer.data.val, trainer.data.val_batched, progress="validation")
        return dict(val_loss=result["loss"], val_top1=result["top1"], val_top5=result["top5"],
                    skipped_val_images=result["skipped"]), result["top1"]

    def test_scores(self, trainer: TrainerView, model: nn.Module) -> dict[str, float]:
        """Scores of `model` on the test split, computed once at the end of a run (never for selection), in
        `resmlp eval`'s batches: the same checkpoint, precision and device give `resmlp eval`'s number."""
        result = self._classify(trainer, model, trainer.data.test, trainer.data.test_batched, EVAL_BATCH_SIZE,
                                progress="test split")
        return dict(top1=result["top1"], top5=result["top5"])

    def _classify(self, trainer: TrainerView, model: nn.Module, dataset, batched,
                  batch_size: int | None = None, progress: str | None = None) -> dict[str, Any]:
        """`progress`: a bar of that name on the main process, when the run shows progress (the final test
        scoring can take minutes with nothing else on the screen)."""
        batch_size = batch_size or trainer.micro_batch
        batches = eval_batches_or_loader(dataset, batched, batch_size, self.cfg.data.num_workers, trainer.info,
                                         trainer.info.device)
        if progress and self.cfg.train.progress and trainer.info.is_main:
            import sys

            from tqdm.auto import tqdm

            total = -(-len(dataset) // (batch_size * trainer.info.world_size))  # this rank's share
            batches = tqdm(batches, desc=progress, unit="batch", total=total, file=sys.stderr, dynamic_ncols=True,
                           leave=False)
        return classify(model, batches, len(trainer.data.class_names), trainer.info.device, trainer.amp,
                        trainer.info)

    def model_to_save(self, trainer: TrainerView) -> nn.Module:
        """The network evaluated and written to best/last.safetensors."""
        return trainer.ema.module if trainer.ema is not None else trainer.model

    def epoch_message(self, row: dict[str, Any], epochs: int) -> str:
        skipped = row["skipped_train_images"] + row["skipped_val_images"]
        return (f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.4f}, "
                f"val loss {row['val_loss']:.4f}, top-1 {row['val_top1']:.2f}%, top-5 {row['val_top5']:.2f}%"
                + (f", {skipped} unreadable images skipped" if skipped else ""))

    def plot(self, path: Path, history: list[dict[str, Any]]) -> None:
        reporting.plot_learning_curves(path, history)

    def scores(self, best: dict[str, Any], selected_test: dict[str, float] | None,
               final_test: dict[str, float] | None) -> dict[str, Any]:
        """The accuracy keys of summary.json: the selected (best-on-validation) epoch's val_top1, and the test
        split's scores of the selected and of the last checkpoint (None without a test split)."""
        return dict(val_top1=best["val_top1"], val_top5=best["val_top5"],
                    test_top1=selected_test and selected_test["top1"],
                    test_top5=selected_test and selected_test["top5"],
                    final_test_top1=final_test and final_test["top1"])

    def summary_extra(self) -> dict[str, Any]:
        """Further keys for summary.json (e.g. what the teacher was)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Task state that a resume needs (saved in last.pth)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class SupervisedTask(Task):
    """The paper's supervised training: a model from the model grammar, cross-entropy with Mixup/CutMix."""

    name = "supervised"

    def build_model(self, trainer: TrainerView, num_classes: int) -> nn.Module:
        cfg = self.cfg
        if cfg.model_name.kind == "preset":  # the config was validated with exactly these overrides
            from resmlp.models.resmlp import ResMLP

            return ResMLP(cfg.model_config(num_classes))
        overrides = {k: v for k, v in cfg.model_overrides.items() if k != "num_classes"}
        return build_model_for_input(cfg.model_name, num_classes=num_classes, **overrides)

    def build_loss(self, trainer: TrainerView, num_classes: int) -> LossFn:
        return supervised_loss(self.cfg, num_classes)


class DistillationTask(SupervisedTask):
    """Supervised training plus a frozen teacher's term (DeiT's hard distillation, or Hinton's soft KL)."""

    name = "distillation"

    def build_loss(self, trainer: TrainerView, num_classes: int) -> LossFn:
        kd = self.cfg.distill
        in_chans, img_size = self.cfg.input_shape()
        teacher = load_teacher(kd.teacher, num_classes, in_chans, kd.weights, kd.allow_random_teacher)
        teacher = freeze(teacher.to(trainer.info.device))
        check_teacher(teacher, kd.teacher, num_classes, in_chans, img_size, trainer.info.device)
        check_teacher_classes(kd.teacher, trainer.data.class_names)
        weights_file = kd.weights or (kd.teacher if Path(kd.teacher).is_file() else None)
        self.teacher_record = dict(spec=kd.teacher, weights=kd.weights,
                                   weights_sha256=file_sha256(weights_file) if weights_file else None)
        self.teacher_model = teacher
        return DistillationLoss(supervised_loss(self.cfg, num_classes), teacher, kd.type, kd.alpha, kd.tau, kd.cache)

    def setup(self, trainer: TrainerView) -> None:
        """The teacher's own accuracy on the validation data, recorded beside the student's."""
        _, top1 = super().evaluate(trainer, self.teacher_model)
        self.teacher_record["val_top1"] = top1

    def summary_extra(self) -> dict[str, Any]:
        return {"teacher": self.teacher_record}


class FinetuneTask(SupervisedTask):
    """Supervised training from a checkpoint (model.name is a file): its weights at finetune.img_size, a new
    head for the dataset's classes, optional freezing; optim.layer_decay turns on layer-wise lr decay."""

    name = "finetune"

    def build_model(self, trainer: TrainerView, num_classes: int) -> nn.Module:
        from resmlp.models.resmlp import ResMLP

        start = build_model(self.cfg.model["name"])
        if not isinstance(start, ResMLP):  # a timm model's checkpoint (a convnet teacher, ...)
            return freeze_layers(timm_start(start, self.cfg.model["name"], num_classes, **self.cfg.model_overrides),
                                 self.cfg.finetune.freeze)
        start = resmlp_start(start, self.cfg.finetune.img_size)
        target = start.config.replace(num_classes=num_classes, **self.cfg.model_overrides)
        model = ResMLP(target)
        state = {k: v for k, v in start.state_dict().items() if not k.startswith("head.")}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or not all(k.startswith("head.") for k in missing):
            raise RuntimeError(f"fine-tuning start does not fit its own config: {missing[:3]} {unexpected[:3]}")
        return freeze_layers(model, self.cfg.finetune.freeze)


# ------------------------------------------------------------------------------------------ teachers
def load_teacher(spec: str, num_classes: int, in_chans: int, weights: str | None = None,
                 allow_random: bool = False) -> nn.Module:
    """A teacher in the model grammar: a checkpoint file, or timm:NAME / torchvision:NAME with a weights file
    (without one only when `allow_random`: a random teacher teaches nothing, so it must be asked for)."""
    from resmlp.build import parse_model_name

    name = parse_model_name(spec)
    if name.kind == "preset":
        raise ValueError(f"distill.teacher {spec!r} is an untrained preset; name a checkpoint file, or timm:NAME / "
                         "torchvision:NAME with --teacher-weights")
    if name.kind in ("timm", "torchvision") and weights is None and not allow_random:
        raise ValueError(f"distill.teacher {spec} has no weights: pass --teacher-weights FILE (distill.weights), or "
                         "--allow-random-teacher (distill.allow_random_teacher) to distil from random weights")
    try:
        return build_model(name, num_classes=num_classes, in_chans=in_chans if name.kind != "file" else None,
                           weights=weights)
    except ValueError as e:
        raise ValueError(f"distill.teacher: {e}; a teacher must predict the dataset's {num_classes} classes") from None


def check_teacher(teacher: nn.Module, spec: str, num_classes: int, in_chans: int, img_size: int,
                  device: torch.device) -> None:
    """One forward on a dummy batch: the teacher takes the data's images and predicts its classes."""
    with torch.no_grad():
        try:
            out = teacher(torch.zeros(2, in_chans, img_size, img_size, device=device))
        except (RuntimeError, ValueError) as e:
            raise ValueError(f"distillation teacher {spec} cannot take {in_chans}x{img_size}x{img_size} images: "
                             f"{e}") from None
    if out.ndim != 2 or out.shape[1] != num_classes:
        raise ValueError(f"distillation teacher {spec} predicts {out.shape[-1]} classes but the dataset has "
                         f"{num_classes}; distil from a teacher trained on this dataset")


def check_teacher_classes(spec: str, class_names: list[str]) -> None:
    """A teacher checkpoint that records its classes must have the data's, in the data's order: its logit i
    is taken as class i's."""
    from resmlp.build import parse_model_name
    from resmlp.checkpoint import read_metadata

    if parse_model_name(spec).kind != "file":
        return
    theirs = read_metadata(spec).get("class_names")
    if not isinstance(theirs, list) or [str(n) for n in theirs] == list(class_names):
        return
    how = "the same classes in another order" if sorted(map(str, theirs)) == sorted(class_names) else "other classes"
    raise ValueError(f"distillation teacher {spec} was trained on {how} ({', '.join(map(str, theirs[:5]))}"
                     f"{' ...' if len(theirs) > 5 else ''}) than the data's ({', '.join(class_names[:5])}"
                     f"{' ...' if len(class_names) > 5 else ''}); its logit i must mean the data's class i: "
                     "distil from a teacher trained on this dataset")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

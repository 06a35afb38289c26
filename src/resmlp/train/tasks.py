"""Training paradigms as tasks: what differs between supervised training, distillation, fine-tuning and DINO.

The Trainer (resmlp.train.trainer) owns the loop, devices, precision, DDP, checkpoints, resume and logging;
a Task owns the model(s), the loss, what is evaluated, and any state of its own. A task talks to the trainer
only through the trainer's public attributes: cfg, info (devices, ranks), amp, data (RunData), model, ema,
optimizer, epoch, global_step, steps_per_epoch, micro_batch.

Adding a paradigm: subclass Task (or SupervisedTask), override what differs, and add it to TASK_CLASSES in
resmlp.train.task_registry (docs/architecture.md walks through DINOTask, resmlp.train.dino).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from resmlp import reporting
from resmlp.build import build_model, build_model_for_input, freeze_layers, resmlp_start, timm_start
from resmlp.data.arrays import ArrayDataset
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
            from resmlp.progress import progress_bar

            total = -(-len(dataset) // (batch_size * trainer.info.world_size))  # this rank's share
            batches = progress_bar(batches, desc=progress, unit="batch", total=total, leave=False)
        return classify(model, batches, len(trainer.data.class_names), trainer.info.device, trainer.amp,
                        trainer.info)

    def model_to_save(self, trainer: TrainerView) -> nn.Module:
        """The network evaluated and written to best/last.safetensors."""
        return trainer.ema.module if trainer.ema is not None else trainer.model

    def epoch_message(self, row: dict[str, Any], epochs: int) -> str:
        skipped = row["skipped_train_images"] + row["skipped_val_images"]
        return (f"epoch {row['epoch']}/{epochs}: train loss {row['train_loss']:.4f}, "
                f"val loss {row['val_loss']:.4f}, {reporting.topk_text(row['val_top1'], row['val_top5'])}"
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
        from resmlp.train import teacher as teachers

        kd, data = self.cfg.distill, trainer.data
        in_chans, img_size = self.cfg.input_shape()
        teacher = teachers.load_teacher(kd.teacher, num_classes, in_chans, kd.weights, kd.allow_random_teacher)
        own = teachers.teacher_preprocess(kd.teacher, kd.weights, teacher, self.cfg.data.kind)
        self.teacher_preprocess = own if own is not None and not teachers.same_input(own, data.preprocess) else None
        if self.teacher_preprocess is not None:
            if self.cfg.data.permute != "none":
                raise ValueError(f"distillation teacher {kd.teacher} takes {own.img_size} px images normalised with "
                                 f"its own statistics, which a pixel-permuted run cannot give it; distil from a "
                                 f"teacher trained at the student's preprocessing")
            teacher = teachers.TeacherInput(teacher, data.preprocess, own)
        teacher = freeze(teacher.to(trainer.info.device))
        teachers.check_teacher(teacher, kd.teacher, num_classes, in_chans, img_size, trainer.info.device)
        teachers.check_teacher_classes(kd.teacher, kd.weights, data.class_names, kd.classes_match,
                                       random=teachers.teacher_file(kd.teacher, kd.weights) is None)
        weights_file = kd.weights or (kd.teacher if Path(kd.teacher).is_file() else None)
        self.teacher_record = dict(spec=kd.teacher, weights=kd.weights,
                                   weights_sha256=file_sha256(weights_file) if weights_file else None,
                                   preprocess=(own or data.preprocess).to_dict(),
                                   preprocess_source=own.source if own is not None else "the student's")
        if own is None and trainer.info.is_main:
            print(f"teacher {kd.teacher} records no preprocessing: it is fed the student's {img_size} px images "
                  "normalised with the student's statistics", flush=True)
        self.teacher_model = teacher
        return DistillationLoss(supervised_loss(self.cfg, num_classes), teacher, kd.type, kd.alpha, kd.tau, kd.cache)

    def setup(self, trainer: TrainerView) -> None:
        """The teacher's own accuracy on the validation data, measured as `resmlp eval` measures it: with the
        teacher's own evaluation transform where it has one, else the student's."""
        own = self.teacher_preprocess
        if own is None:
            _, top1 = super().evaluate(trainer, self.teacher_model)
        else:
            val = copy.copy(trainer.data.val)
            val.transform = own.eval_transform()
            batched = own.batched_eval(*val.images.shape[1:3]) if isinstance(val, ArrayDataset) else None
            top1 = self._classify(trainer, self.teacher_model.teacher, val, batched)["top1"]
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


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

"""What a run writes besides its state: checkpoint metadata, the per-epoch side outputs (CSV, plot,
TensorBoard), the test split scored once, and summary.json's content."""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any

from resmlp import reporting
from resmlp.data.loading.assemble import run_spec
from resmlp.evaluation import EVAL_BATCH_SIZE
from resmlp.hostinfo import host_info
from resmlp.inference import load_for_inference
from resmlp.runtime import barrier, precision_name
from resmlp.train.history import keep_best
from resmlp.train.state import STATE_FILE

if TYPE_CHECKING:
    from torch import nn

    from resmlp.train.view import TrainerView


def checkpoint_metadata(trainer: TrainerView, row: dict[str, Any]) -> dict[str, Any]:
    """What best/last.safetensors carry besides weights: classes, preprocessing, dataset, scores."""
    scores = {k: v for k, v in row.items() if k in ("val_top1", "val_top5", "knn_top1")}
    return dict(class_names=trainer.data.class_names, preprocess=trainer.data.preprocess.to_dict(),
                dataset=run_spec(trainer.cfg.data).kind, recipe=trainer.cfg.recipe, epoch=row["epoch"], **scores)


def side_outputs(trainer: TrainerView, row: dict[str, Any], model: nn.Module | None = None, score: float = 0.0,
                 logs: bool = True) -> None:
    """The checkpoint history (train.checkpoint_hist; with `model`), then metrics CSV, learning curves and the
    experiment logs (TensorBoard, W&B, MLflow; with `logs`): a failure of those is a warning, never a lost run."""
    out, history = trainer.out, trainer.history
    if trainer.cfg.train.checkpoint_hist and model is not None:
        keep_best(out, trainer.cfg.train.checkpoint_hist, model, checkpoint_metadata(trainer, row), row["epoch"], score)
    for what, write in (("metrics.csv", lambda: reporting.write_metrics_csv(out / "metrics.csv", history)),
                        ("learning_curves.png", lambda: trainer.task.plot(out / "learning_curves.png", history)),
                        *([("experiment logs", lambda: trainer.tb.log(row))] if logs else [])):
        try:
            write()
        except Exception as e:  # a side output must not stop training: the state is already saved
            warnings.warn(f"could not write {what} in {out} ({type(e).__name__}: {e}); training goes on",
                          stacklevel=2)


def score_test_split(trainer: TrainerView) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """The test split scored once, after training: the selected (best on validation) and the last
    checkpoint, each read back from its file as `resmlp eval` reads it. Never used for any choice."""
    if trainer.data.test is None:
        return None, None
    barrier(trainer.info)  # rank 0 wrote the checkpoints after the last barrier
    scores = []
    for name in ("best", "last"):
        model = load_for_inference(trainer.out / f"{name}.safetensors").model.to(trainer.info.device)
        scores.append(trainer.task.test_scores(trainer, model))
    return scores[0], scores[1]


def run_summary(trainer: TrainerView, selected_test: dict[str, float] | None,
                final_test: dict[str, float] | None) -> dict[str, Any]:
    """summary.json's content: scores, where the files are, and how and where the run ran."""
    t, out, info = trainer.cfg, trainer.out, trainer.info
    best = next(r for r in trainer.history if r["epoch"] == trainer.best_epoch)
    summary = dict(
        **trainer.task.scores(best, selected_test, final_test), selected_epoch=trainer.best_epoch,
        epochs=trainer.epoch, validation=trainer.data.validation,
        wall_seconds=round(trainer.wall_before + time.perf_counter() - trainer.t0, 1),
        checkpoint=str((out / "best.safetensors").resolve()), last_checkpoint=str((out / "last.safetensors").resolve()),
        state=str((out / STATE_FILE).resolve()), recipe=t.recipe, task=trainer.task.name, model=t.model,
        dataset=run_spec(t.data).kind, global_batch=t.train.batch_size, lr=trainer.lr, amp=precision_name(trainer.amp),
        device=str(info.device), world_size=info.world_size, compile=trainer.compile_choice.summary(),
        host=host_info(trainer.amp), metrics=str((out / "metrics.csv").resolve()),
        learning_curves=str((out / "learning_curves.png").resolve()), data_pipeline=trainer.train_batches.summary(),
        **trainer.task.summary_extra(),
    )
    if selected_test is not None:  # how the test split was scored: `resmlp eval` with these gives the same number
        summary["test_scored_with"] = dict(precision=precision_name(trainer.amp), device=str(info.device),
                                           batch_size=EVAL_BATCH_SIZE, processes=info.world_size)
    return summary

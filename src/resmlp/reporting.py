"""Per-epoch metrics (CSV, TensorBoard), learning-curve and confusion-matrix plots; rank 0 only."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from resmlp.fileio import (
    atomic_write,
    held_subfolder,
    write_json,  # noqa: F401 (moved to resmlp.fileio; the trainer imports it from here)
)


def topk_text(top1: float, top5: float | None, sep: str = ", ") -> str:
    """'top-1 X%, top-5 Y%', without top-5 where there is none (5 classes or fewer)."""
    return f"top-1 {top1:.2f}%" + (f"{sep}top-5 {top5:.2f}%" if top5 is not None else "")


def write_metrics_csv(path: str | Path, history: list[dict[str, Any]]) -> Path:
    """The whole history every epoch (rewritten, so a resumed run's file has no duplicate rows)."""
    columns = list(dict.fromkeys(k for row in history for k in row))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    return atomic_write(path, lambda tmp: Path(tmp).write_text(buf.getvalue()))


def plot_learning_curves(path: str | Path, history: list[dict[str, Any]]) -> Path:
    """Loss (train, val) and top-1 accuracy per epoch, two panels, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [row["epoch"] for row in history]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot(epochs, [r["train_loss"] for r in history], "o-", label="train")
    ax_loss.plot(epochs, [r["val_loss"] for r in history], "o-", label="val")
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    ax_loss.legend()
    ax_acc.plot(epochs, [r["val_top1"] for r in history], "o-", label="val top-1")
    ax_acc.set(xlabel="epoch", ylabel="accuracy (%)", title="top-1 accuracy")
    ax_acc.legend()
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_loss, ax_acc):  # epochs are whole: no 1.5 or 2.25 ticks on a 3-epoch run
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return Path(path)


def plot_confusion_matrix(path: str | Path, confusion: np.ndarray, class_names: list[str]) -> Path:
    """Row-normalised confusion matrix (rows: true class) as a PNG; counts in cells for up to 20 classes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    k = len(class_names)
    rates = confusion / np.maximum(confusion.sum(axis=1, keepdims=True), 1)
    size = min(4 + 0.5 * k, 30)
    fig, ax = plt.subplots(figsize=(size, size))
    ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    if k <= 50:  # class names are plain text: a '$' in one must not start matplotlib's mathtext (a parse error)
        ax.set_xticks(range(k), class_names, rotation=90, parse_math=False)
        ax.set_yticks(range(k), class_names, parse_math=False)
    if k <= 20:
        for i in range(k):
            for j in range(k):
                ax.text(j, i, int(confusion[i, j]), ha="center", va="center",
                        color="white" if rates[i, j] > 0.5 else "black", fontsize=8)
    ax.set(xlabel="predicted", ylabel="true", title="confusion matrix")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return Path(path)


class TensorBoardLog:
    """torch.utils.tensorboard scalars under DIR/tensorboard; one add_scalar per metric per epoch."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # SummaryWriter opens its files by path, through whatever is at log_dir: a symlink planted there is refused,
        # and the writer gets a path to the folder held open, so one swapped in later redirects nothing
        self._fd, held = held_subfolder(log_dir)
        self.writer = SummaryWriter(str(held))

    def log(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            if key != "epoch" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        os.close(self._fd)


class ExperimentLogger(Protocol):
    """What a run asks of a logger: one call per epoch with the epoch's row (numbers by name), and a close."""

    def log(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _metrics(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items() if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as section.key entries (MLflow's parameters are flat)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class WandbLog:
    """Weights & Biases (`train.log_wandb`, timm's --log-wandb): one wandb run per training run, the config as
    its config, each epoch's metrics at step = epoch. wandb's own settings apply (WANDB_MODE=offline...); its
    files go to WANDB_DIR where that is set (wandb's own variable: an explicit dir= would override it), else into
    the run folder."""

    def __init__(self, project: str, name: str, config: dict[str, Any], folder: Path) -> None:
        import wandb

        self.run = wandb.init(project=project, name=name, config=config,
                              dir=os.environ.get("WANDB_DIR") or str(folder))

    def log(self, row: dict[str, Any]) -> None:
        self.run.log(_metrics(row), step=row["epoch"])

    def close(self) -> None:
        self.run.finish()


class MlflowLog:
    """MLflow (`train.log_mlflow`): a run in experiment `project` at MLflow's tracking URI (MLFLOW_TRACKING_URI;
    its default, ./mlruns), the config as parameters, each epoch's metrics at step = epoch."""

    def __init__(self, project: str, name: str, config: dict[str, Any]) -> None:
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(project)
        self.run = mlflow.start_run(run_name=name)
        mlflow.log_params({k: str(v)[:500] for k, v in _flat(config).items()})  # MLflow caps a value's length

    def log(self, row: dict[str, Any]) -> None:
        self.mlflow.log_metrics(_metrics(row), step=row["epoch"])

    def close(self) -> None:
        self.mlflow.end_run()


class RunLogs:
    """The loggers of a run (rank 0): TensorBoard always, W&B and MLflow where the config's train section asks
    (their packages are optional: validation names the `pip install` a missing one needs)."""

    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        train = config.get("train", {})
        project, name = train.get("experiment") or "resmlp", Path(out).resolve().name
        self.loggers: list[ExperimentLogger] = [TensorBoardLog(Path(out) / "tensorboard")]
        if train.get("log_wandb"):
            self.loggers.append(WandbLog(project, name, config, Path(out)))
        if train.get("log_mlflow"):
            self.loggers.append(MlflowLog(project, name, config))

    def log(self, row: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(row)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()

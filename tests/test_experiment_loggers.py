"""The optional experiment loggers beside TensorBoard (W&B as timm's --log-wandb, MLflow), each driven through a
local stub of its package's API injected into sys.modules: no package installed, never the network."""

from __future__ import annotations

import sys
import types

from test_run_controls import TINY, sets

from resmlp.cli import main


class StubWandbRun:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def log(self, metrics: dict, step: int) -> None:
        self.calls.append(("log", step, dict(metrics)))

    def finish(self) -> None:
        self.calls.append(("finish",))


def stub_wandb(calls: list) -> types.ModuleType:
    module = types.ModuleType("wandb")

    def init(**kwargs):
        calls.append(("init", kwargs))
        return StubWandbRun(calls)

    module.init = init
    return module


def stub_mlflow(calls: list) -> types.ModuleType:
    module = types.ModuleType("mlflow")
    module.set_experiment = lambda name: calls.append(("experiment", name))
    module.start_run = lambda run_name: calls.append(("start", run_name))
    module.log_params = lambda params: calls.append(("params", dict(params)))
    module.log_metrics = lambda metrics, step: calls.append(("metrics", step, dict(metrics)))
    module.end_run = lambda: calls.append(("end",))
    return module


def test_wandb_and_mlflow_get_the_config_and_every_epoch(tmp_path, monkeypatch):
    wandb_calls, mlflow_calls = [], []
    monkeypatch.setitem(sys.modules, "wandb", stub_wandb(wandb_calls))
    monkeypatch.setitem(sys.modules, "mlflow", stub_mlflow(mlflow_calls))
    run = tmp_path / "run"
    assert main(["train", "--output", str(run), "--log-wandb", "--log-mlflow", *sets(TINY),
                 "--experiment", "fmnist"]) == 0
    (kind, init), *logs, finish = wandb_calls
    assert kind == "init" and init["project"] == "fmnist" and init["name"] == "run" and init["dir"] == str(run)
    assert init["config"]["train"]["log_wandb"] is True and init["config"]["model"]["dim"] == 32
    assert [step for _, step, _ in logs] == [1, 2] and finish == ("finish",)
    assert {"train_loss", "val_top1", "val_loss", "lr"} <= set(logs[0][2]) and "epoch" not in logs[0][2]
    assert mlflow_calls[:2] == [("experiment", "fmnist"), ("start", "run")]
    params = mlflow_calls[2][1]
    assert params["model.dim"] == "32" and params["optim.lr"] == "0.003"
    assert [c[1] for c in mlflow_calls if c[0] == "metrics"] == [1, 2] and mlflow_calls[-1] == ("end",)


def test_a_missing_package_is_one_line_naming_pip_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed, whatever this host has
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["train", "--output", str(tmp_path / "r"), "--log-wandb", *sets(TINY)]) == 2
    err = capsys.readouterr().err
    assert "train.log_wandb: Weights & Biases logging needs the wandb package, which is not installed: " \
           "pip install wandb" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()

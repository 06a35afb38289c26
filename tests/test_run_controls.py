"""Cluster and smoke-run controls of the training commands: --max-steps, the checkpoint history
(--checkpoint-hist), SLURM ranks without torchrun, the validation progress bar, and --dry-run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hostspeed import limit
from safetensors.torch import load_file

from resmlp import runtime
from resmlp.cli import main
from resmlp.fileio import read_json_object
from resmlp.models.resmlp import ResMLP, ResMLPConfig
from resmlp.train import history, train

TINY = {
    "data.kind": "synthetic", "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0],
    "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16, "model.patch_size": 4, "model.dim": 32,
    "model.depth": 2, "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 16,
    "train.progress": False, "optim.lr": 3e-3, "data.synthetic_size": [128, 64], "train.threads": 1,
    "train.deterministic": True,
}


def sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


# ------------------------------------------------------------------------------------------ --max-steps
def test_max_steps_stops_with_a_resumable_state_and_the_resume_matches_a_straight_run(tmp_path, capsys):
    run = tmp_path / "smoke"
    assert main(["train", "--output", str(run), "--max-steps", "3", *sets(TINY)]) == 0
    printed = capsys.readouterr().out
    assert "stopped at the step limit (--max-steps 3): 3 optimizer steps, epoch 1 of 2 at step 3 of 8" in printed
    assert f"continue it with: resmlp train --output {run} --resume" in printed
    state = torch.load(run / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (0, 3, 3)
    assert not (run / "summary.json").exists() and not (run / "best.safetensors").exists()
    assert "max_steps" not in json.dumps(read_json_object(run / "config.json"))  # not part of the recipe

    assert main(["train", "--output", str(run), "--resume"]) == 0  # as printed: to the schedule's end
    train("fashion-mnist-quick", tmp_path / "straight", overrides=TINY)
    a, b = load_file(run / "last.safetensors"), load_file(tmp_path / "straight" / "last.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a), "a run stopped by --max-steps and resumed differs"


def test_max_steps_at_an_epoch_end_finishes_that_epoch_first(tmp_path):
    stopped = train("fashion-mnist-quick", tmp_path / "r", overrides=TINY, max_steps=8)  # 8 steps per epoch
    assert stopped == dict(stopped_at_step=8, state=str(tmp_path / "r" / "last.pth"), epochs=1)
    assert (tmp_path / "r" / "best.safetensors").is_file()  # epoch 1 was evaluated and saved
    assert train("fashion-mnist-quick", tmp_path / "r", overrides=TINY, resume=True, max_steps=100)["epochs"] == 2


@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_max_steps_must_be_a_positive_count(tmp_path, value, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--output", str(tmp_path / "r"), "--max-steps", value])
    assert e.value.code == 2 and "number of steps (1 or more)" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ checkpoint history
def _tiny_model() -> ResMLP:
    return ResMLP(ResMLPConfig(img_size=8, patch_size=4, dim=8, depth=1, num_classes=2, in_chans=1))


def _files(folder: Path) -> set[str]:
    return {p.name for p in folder.glob("checkpoint-*.safetensors")}


def test_checkpoint_history_keeps_the_n_best(tmp_path):
    model = _tiny_model()
    for epoch, score in enumerate([10.0, 30.0, 20.0, 5.0, 20.0], start=1):
        kept = history.keep_best(tmp_path, 2, model, {"epoch": epoch}, epoch, score)
    assert [(e["epoch"], e["score"]) for e in kept] == [(2, 30.0), (3, 20.0)]  # a tie with the worst kept: not kept
    assert _files(tmp_path) == {"checkpoint-2.safetensors", "checkpoint-3.safetensors"}
    assert history.kept_checkpoints(tmp_path) == kept


def test_checkpoint_history_survives_a_crash_at_each_point(tmp_path, monkeypatch):
    model = _tiny_model()
    history.keep_best(tmp_path, 1, model, {}, 1, 10.0)
    # a crash between rewriting the list and deleting: the list never names a missing file...
    def crash(*args, **kwargs):
        raise OSError("killed")

    monkeypatch.setattr(history, "write_json", crash)
    with pytest.raises(OSError):
        history.keep_best(tmp_path, 1, model, {}, 2, 50.0)
    named = {e["file"] for e in history.kept_checkpoints(tmp_path)}
    assert named == {"checkpoint-1.safetensors"} and named <= _files(tmp_path)
    monkeypatch.undo()
    # ... and the next epoch deletes what the crash left behind (checkpoint-2, never listed)
    history.keep_best(tmp_path, 1, model, {}, 3, 20.0)
    assert _files(tmp_path) == {"checkpoint-3.safetensors"}


def test_checkpoint_hist_flag_in_a_run(tmp_path):
    assert main(["train", "--output", str(tmp_path / "r"), "--checkpoint-hist", "1", *sets(TINY)]) == 0
    kept = history.kept_checkpoints(tmp_path / "r")
    assert len(kept) == 1 and _files(tmp_path / "r") == {kept[0]["file"]}
    assert kept[0]["score"] == json.loads((tmp_path / "r" / "summary.json").read_text())["val_top1"]


# ------------------------------------------------------------------------------------------ SLURM
@pytest.mark.parametrize("nodelist, host", [("node07", "node07"), ("gpu[03-05,9],cpu1", "gpu03"),
                                            ("a-b[001-004]-ib", "a-b001-ib"), ("x1,x2", "x1")])
def test_first_slurm_host(nodelist, host):
    assert runtime.first_slurm_host(nodelist) == host


def test_slurm_ranks_are_adopted_and_torchrun_wins():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NNODES": "2",
           "SLURM_NODELIST": "gpu[12-13]"}
    assert runtime.adopt_slurm_ranks(env)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("5", "8", "1", "4")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("gpu12", "29500")
    given = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n1", "MASTER_ADDR": "10.0.0.1"}
    runtime.adopt_slurm_ranks(given)
    assert given["MASTER_ADDR"] == "10.0.0.1"  # given: kept
    torchrun = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "WORLD_SIZE": "1", "RANK": "0"}
    assert not runtime.adopt_slurm_ranks(torchrun) and torchrun["RANK"] == "0"


SLURM_CHILD = textwrap.dedent("""
    import torch, torch.distributed as dist
    from resmlp.runtime import init_distributed, shutdown
    info = init_distributed("cpu")
    total = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(total)
    print(info.rank, info.world_size, int(total.item()))
    shutdown(info)
""")


def test_two_processes_join_from_slurm_variables_alone(tmp_path):
    """Two processes as srun starts them: no torchrun variables, gloo rendezvous on the first node."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR")}
    with socket.socket() as probe:  # a free port: other test runs may share this machine
        probe.bind(("localhost", 0))
        port = probe.getsockname()[1]
    env.update(SLURM_NTASKS="2", SLURM_NNODES="1", SLURM_NODELIST="localhost", MASTER_PORT=str(port),
               PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", SLURM_CHILD], env={**env, "SLURM_PROCID": str(r),
                                                                        "SLURM_LOCALID": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    outputs = [p.communicate(timeout=limit(120)) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outputs]
    assert sorted(o[0].split() for o in outputs) == [["0", "2", "3"], ["1", "2", "3"]]


# ------------------------------------------------------------------------------------------ validation bar
def test_validation_has_a_progress_bar(tmp_path, capfd):
    train("fashion-mnist-quick", tmp_path / "r", overrides={**TINY, "schedule.epochs": 1, "train.progress": True})
    err = capfd.readouterr().err
    assert "validation" in err and "batch" in err


# ------------------------------------------------------------------------------------------ --dry-run
def test_dry_run_of_the_full_size_recipes_without_imagenet(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "deit"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "deit").exists()
    assert "resolved config:" in out and "reference_batch: 2048" in out
    assert "resmlp_s12 built on the meta device: 15.35 M parameters, 1000 classes (assumed" in out
    assert "effective batch:  2048 = 2048 per process x 1 process x 1 accumulation step" in out
    assert "memory estimate:  at least 20.9 GiB per process" in out
    assert "not checked:      the dataset: no data.dir given" in out
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "deit"), "--dry-run",
                 "--set", f"data.dir={tmp_path / 'imagenet'}"]) == 0
    out = capsys.readouterr().out
    assert f"dir: {tmp_path / 'imagenet'}" in out and f"data.dir {tmp_path / 'imagenet'} does not exist here" in out
    monkeypatch.setenv("WORLD_SIZE", "16")  # the cluster launch it is meant for
    assert main(["pretrain", "dino", "--recipe", "dino-imagenet", "--output", str(tmp_path / "dino"),
                 "--dry-run", "--set", "train.grad_accum=2"]) == 0
    out = capsys.readouterr().out
    assert "effective batch:  1024 = 32 per process x 16 processes x 2 accumulation steps" in out
    assert "DINO head and crops" in out and "(task dino)" in out and not (tmp_path / "dino").exists()


def test_dry_run_refuses_what_the_run_would(tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "r"), "--dry-run", "--lr", "-1"]) == 2
    assert "optim.lr" in capsys.readouterr().err
    assert main(["train", "--output", str(tmp_path / "r"), "--dry-run", "--batch-size", "10",
                 "--set", "train.grad_accum=3"]) == 2
    assert "divisible by processes x grad_accum = 1 x 3" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_dry_run_of_a_finetune_and_a_timm_model(tmp_path, capsys):
    ckpt = tmp_path / "tiny.safetensors"
    from resmlp.checkpoint import save

    save(_tiny_model(), ckpt)
    assert main(["finetune", str(ckpt), "--output", str(tmp_path / "ft"), "--dry-run", "--img-size", "16",
                 *sets({"data.kind": "synthetic", "data.synthetic_classes": 3})]) == 0
    out = capsys.readouterr().out
    assert "(task finetune)" in out and "3 classes (data.synthetic_classes)" in out
    assert "img_size: 16" in out and not (tmp_path / "ft").exists()
    assert main(["train", "--output", str(tmp_path / "t"), "--dry-run", "--model", "timm:resnet10t"]) == 0
    out = capsys.readouterr().out
    assert "timm:resnet10t built on the meta device: 4.9" in out and "memory estimate:  none for" in out

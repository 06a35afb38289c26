"""The new user's list of issue 57 item 4, one test each: what a timm/DeiT user tripped on, each fixed where it
happens. Never the network (HF_HUB_OFFLINE=1 and empty caches)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import resmlp
from resmlp.cli import main
from resmlp.models.resmlp import ResMLP, ResMLPConfig

SMALL = ResMLPConfig(img_size=16, patch_size=4, dim=16, depth=2, num_classes=5)
RUN = {"data.kind": "synthetic", "data.synthetic_size": [16, 8], "data.num_workers": 0, "model.img_size": 16,
       "model.patch_size": 4, "model.dim": 16, "model.depth": 1, "schedule.epochs": 1, "schedule.warmup_epochs": 0,
       "train.batch_size": 8, "train.progress": False, "train.threads": 1, "train.compile": False,
       "train.amp": "none"}


def test_the_offline_weight_message_names_the_hf_folder_and_the_tag_from_every_entry_point(tmp_path, monkeypatch,
                                                                                          capsys):
    import timm

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = str(tmp_path / "hf" / "hub" / "models--timm--resmlp_12_224.fb_in1k")
    messages = []
    for make in (lambda: resmlp.create_model("resmlp_s12", pretrained=True),
                 lambda: timm.create_model("resmlp_s12.fb_in1k", pretrained=True)):
        with pytest.raises(resmlp.checkpoint.WeightsUnavailableError) as refused:
            make()
        messages.append(str(refused.value))
    assert main(["eval", "resmlp_s12.fb_in1k", "--data", "synthetic"]) == 2
    messages.append(capsys.readouterr().err.strip())
    for message in messages:
        assert folder in message and "weights resmlp_s12.fb_in1k are not in" in message, message
        assert "resmlp_12_no_dist.pth" in message and "\n" not in message
    assert messages[0] == messages[1]  # the library and timm: the same line
    assert messages[2].split(": run once")[0].endswith(messages[0].split(": run once")[0])  # the CLI too, to its hint


def test_no_cuda_runtime_line_on_a_host_without_a_gpu():
    code = ("import resmlp, logging, torch\n"
            "logging.getLogger('torch.utils.cpp_extension').warning('No CUDA runtime is found, using CUDA_HOME=%s', "
            "'/usr/local/cuda')\n"
            "logging.getLogger('torch.utils.cpp_extension').warning('another warning')\n"
            "import torch.utils.cpp_extension\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "No CUDA runtime" not in done.stderr and "another warning" in done.stderr  # only that line is dropped


def test_timm_create_model_with_a_wrong_architecture_file_says_what_resmlp_create_model_says(tmp_path):
    import timm

    path = resmlp.save(ResMLP(SMALL), tmp_path / "small.safetensors")
    said = []
    for make in (resmlp.create_model, timm.create_model):
        with pytest.raises(resmlp.checkpoint.CheckpointError) as refused:
            make("resmlp_s12", checkpoint_path=str(path), num_classes=5)
        said.append([line for line in str(refused.value).splitlines() if line.startswith("  ") and ": checkpoint "
                     in line and "." not in line.split(":")[0]])
    assert said[0] == said[1] and "  dim: checkpoint 16, model 384" in said[0]


@pytest.mark.parametrize("started,on_path,printed", [
    (".venv/bin/resmlp", False, ".venv/bin/resmlp train"),  # the README's way, .venv/bin not on PATH
    (".venv/bin/resmlp", True, "resmlp train"),  # the same program is `resmlp` on PATH
    ("/usr/bin/python3 -m", None, "-m resmlp train"),  # python -m resmlp
])
def test_the_printed_resume_command_runs_the_program_as_it_was_started(tmp_path, monkeypatch, started, on_path,
                                                                       printed):
    import shutil

    from resmlp.cli import build_parser
    from resmlp.commands.common import continue_command

    program = tmp_path / ".venv" / "bin" / "resmlp"
    program.parent.mkdir(parents=True)
    program.write_text("#!/bin/sh\n")
    monkeypatch.chdir(tmp_path)
    if on_path is None:
        monkeypatch.setattr(sys, "argv", [str(Path(resmlp.__file__).with_name("__main__.py")), "train"])
    else:
        monkeypatch.setattr(sys, "argv", [started, "train"])
        monkeypatch.setattr(shutil, "which", lambda name: str(program) if on_path else None)
    args = build_parser().parse_args(["train", "--output", "runs/x"])
    command = continue_command(args)
    assert printed in command and command.endswith("train --output runs/x --resume")
    if on_path is False:
        assert command.startswith(".venv/bin/resmlp ")


def test_distill_takes_a_run_folder_like_every_other_command(tmp_path, capsys):
    from resmlp.build import parse_model_name
    from resmlp.train import train

    train("fashion-mnist-quick", tmp_path / "teacher", overrides=RUN)
    name = parse_model_name(str(tmp_path / "teacher"))
    assert name.kind == "file" and name.name == str(tmp_path / "teacher" / "best.safetensors")
    capsys.readouterr()
    assert main(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "student"), "--distill",
                 str(tmp_path / "teacher"), *[a for k, v in RUN.items() for a in ("--set", f"{k}={json.dumps(v)}")]
                 ]) == 0
    config = json.loads((tmp_path / "student" / "config.json").read_text())
    assert config["distill"]["teacher"] == str(tmp_path / "teacher")
    with pytest.raises(ValueError, match="folder without best.safetensors"):
        parse_model_name(str(tmp_path))


def test_analyze_states_the_random_init_baseline_beside_the_sparsity_comparison(tmp_path, capsys):
    torch.manual_seed(0)
    path = resmlp.save(ResMLP(SMALL), tmp_path / "m.safetensors")
    assert main(["analyze", str(path), "--out", str(tmp_path / "an"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("sparsity: "))
    assert "Here A is" in line and "A randomly initialised model of this config (the baseline) has" in line
    numbers = json.loads((tmp_path / "an" / "sparsity.json").read_text())
    assert len(numbers["random_init_layers"]) == len(numbers["layers"]) == SMALL.depth
    assert numbers["random_init_layers"] == numbers["layers"]  # the file IS a seed-0 random init: the same numbers


def test_a_dino_smoke_run_message_names_both_flags(tmp_path, capsys):
    assert main(["pretrain", "dino", "--output", str(tmp_path / "d"), "--epochs", "1", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--warmup-epochs" in err and "dino.warmup_teacher_temp_epochs=0" in err
    assert main(["pretrain", "dino", "--output", str(tmp_path / "d"), "--epochs", "1", "--warmup-epochs", "0",
                 "--set", "dino.warmup_teacher_temp_epochs=0", "--dry-run"]) == 0


def test_predicts_table_does_not_wrap_names_when_redirected(tmp_path):
    from PIL import Image

    path = resmlp.save(ResMLP(SMALL), tmp_path / "m.safetensors", metadata={"class_names": [f"class-{i}" for i in
                                                                                           range(5)]})
    folder = tmp_path / "images"
    folder.mkdir()
    names = [f"a_rather_long_file_name_that_a_narrow_table_would_fold_{i:03d}_over_two_lines.png" for i in range(2)]
    for name in names:
        Image.new("RGB", (16, 16), (len(name) % 255, 20, 30)).save(folder / name)
    done = subprocess.run([sys.executable, "-m", "resmlp", "predict", str(path), str(folder), "--top-k", "5"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    for name in names:  # each whole on one line of the redirected output
        assert any(name in line for line in done.stdout.splitlines()), done.stdout


def test_learning_curves_tick_whole_epochs(tmp_path, monkeypatch):
    from matplotlib import pyplot as plt

    from resmlp import reporting

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)
    history = [dict(epoch=e, train_loss=1.0 / e, val_loss=1.1 / e, val_top1=50.0 + e) for e in (1, 2, 3)]
    reporting.plot_learning_curves(tmp_path / "c.png", history)
    for ax in figures[0].axes:
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_dry_run_shows_the_sections_the_task_uses_first(tmp_path, capsys):
    assert main(["pretrain", "dino", "--output", str(tmp_path / "d"), "--epochs", "2", "--warmup-epochs", "0",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    sections = [line.strip().rstrip(":") for line in out.splitlines() if line.startswith("  ") and
                line.rstrip().endswith(":") and not line.startswith("   ")]
    assert sections.index("dino") < sections.index("data") < sections.index("train")
    unused = out[out.index("not used by the dino task"):]
    assert "distill:" in unused and "finetune:" in unused and "dino:" not in unused
    assert main(["train", "--output", str(tmp_path / "t"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.index("optim:") < out.index("not used by the supervised task") < out.index("dino:")


def test_benchmark_plot_without_accuracies_draws_throughput_alone(tmp_path, capsys):
    plot = tmp_path / "throughput.png"
    assert main(["benchmark", "--models", "resmlp_s12", "--plot", str(plot), "--repeats", "1", "--warmup", "1",
                 "--min-time", "0", "--batch-size", "2", "--large-batch", "0", "--img-size", "32", "--no-progress",
                 "--threads", "1"]) == 0
    assert plot.is_file() and plot.stat().st_size > 1000
    from resmlp.analysis.benchmark import tradeoff_figure

    fig = tradeoff_figure([dict(model="a", throughput_img_s=10.0, top1=None, batch_size=2, device="cpu"),
                           dict(model="b", throughput_img_s=30.0, top1=None, batch_size=2, device="cpu")])
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"] and "Top-1" not in ax.get_ylabel()

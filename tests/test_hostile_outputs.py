"""Every write of a command stays inside its output folder and under that folder's lock."""

from __future__ import annotations

import os

import pytest

import resmlp
from resmlp.cli import main
from resmlp.errors import OutputError
from resmlp.fileio import RunLock, guarded_subfolder
from resmlp.reporting import TensorBoardLog

TINY_TRAIN = ["--set", "data.kind=synthetic", "--set", "model.img_size=16", "--set", "model.patch_size=8",
              "--set", "model.dim=8", "--set", "model.depth=1", "--set", "schedule.epochs=1",
              "--set", "schedule.warmup_epochs=0", "--set", "train.batch_size=8", "--set", "train.progress=false",
              "--set", "data.synthetic_size=[16,8]", "--set", "data.num_workers=0", "--set", "train.threads=1"]


def test_a_planted_tensorboard_symlink_is_refused_and_nothing_is_written_through_it(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    with pytest.raises(OutputError, match="tensorboard is a symlink to .*elsewhere; a run writes only inside"):
        TensorBoardLog(run / "tensorboard")
    assert list(elsewhere.iterdir()) == []


def _swap_in_a_symlink(folder, target):
    """What a racing attacker does: move the checked folder away and put a symlink at its name."""
    folder.rename(folder.with_name("moved"))
    folder.symlink_to(target)


@pytest.mark.parametrize("swapped", ["after the check", "after the open"])
def test_a_symlink_swapped_in_while_tensorboard_starts_redirects_nothing(tmp_path, monkeypatch, swapped):
    """The check and TensorBoard's open by path raced: a symlink swapped in between sent event files outside
    the run folder (4 of 12 tries). The folder is now held open and TensorBoard given a path to it."""
    from resmlp import fileio, reporting

    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    real = fileio.guarded_subfolder if swapped == "after the check" else fileio.held_subfolder
    module = fileio if swapped == "after the check" else reporting
    name = "guarded_subfolder" if swapped == "after the check" else "held_subfolder"

    def racing(folder):
        result = real(folder)
        _swap_in_a_symlink(run / "tensorboard", elsewhere)
        return result

    monkeypatch.setattr(module, name, racing)
    try:
        log = TensorBoardLog(run / "tensorboard")
    except OutputError as e:
        assert swapped == "after the check" and "was replaced while the run started" in str(e)
    else:
        log.log({"epoch": 1, "val_top1": 50.0})
        log.close()
        assert [p.name.startswith("events.out") for p in (run / "moved").iterdir()] == [True]
    assert list(elsewhere.iterdir()) == []


def test_the_guarded_subfolder_is_made_when_missing_and_refuses_a_file(tmp_path):
    assert guarded_subfolder(tmp_path / "run" / "tensorboard").is_dir()
    (tmp_path / "run" / "plots").write_text("a file")
    with pytest.raises(OutputError, match="is not a folder"):
        guarded_subfolder(tmp_path / "run" / "plots")


def test_resmlp_train_refuses_a_planted_tensorboard_symlink_in_one_line(tmp_path, capsys):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    elsewhere.mkdir()
    (run / "tensorboard").symlink_to(elsewhere)
    assert main(["train", "--output", str(run), *TINY_TRAIN]) == 2
    err = capsys.readouterr().err
    assert "is a symlink" in err and "Traceback" not in err and list(elsewhere.iterdir()) == []


@pytest.fixture
def checkpoint(tmp_path):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1, num_classes=4, in_chans=1)
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "mean": [0.5], "std": [0.25], "in_chans": 1},
            "class_names": [f"class_{c}" for c in range(4)]}
    return resmlp.save(model, tmp_path / "m.safetensors", metadata=meta)


@pytest.mark.parametrize("command", [
    ["eval", "{ckpt}", "--data", "synthetic", "--output", "{out}"],
    ["eval-knn", "{ckpt}", "--data", "synthetic", "--output", "{out}"],
    ["analyze", "{ckpt}", "--output", "{out}"],
])
def test_a_command_writing_into_a_folder_a_run_holds_is_refused(tmp_path, checkpoint, capsys, command):
    out = tmp_path / "held"
    argv = [a.format(ckpt=checkpoint, out=out) for a in command]
    with RunLock(out):  # a training running there
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert "in use by another run" in err and "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == [".lock"]  # no summary.json, no figure


def test_finished_run_files_get_the_usual_permissions(tmp_path):
    from resmlp import fileio

    run = tmp_path / "run"
    assert main(["train", "--output", str(run), *TINY_TRAIN]) == 0
    expected = 0o666 & ~fileio._UMASK
    for name in ("best.safetensors", "last.safetensors", "summary.json", "metrics.csv", "last.pth"):
        assert os.stat(run / name).st_mode & 0o777 == expected, name

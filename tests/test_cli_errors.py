"""Every user mistake is one message and exit 2, a bug keeps its traceback, a closed pipe is quiet."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hostspeed import limit
from PIL import Image

from resmlp.cli import main
from resmlp.errors import CheckpointError, ConfigError, DataError, OutputError, ResmlpError, user_message

SRC = str(Path(__file__).resolve().parents[1] / "src")


def _raised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException as e:  # noqa: BLE001 (the point is to get a traceback attached)
        return e


def test_project_errors_stay_value_errors_except_output_errors_which_are_os_errors():
    for cls in (CheckpointError, ConfigError, DataError):
        assert issubclass(cls, ResmlpError) and issubclass(cls, ValueError)
    assert issubclass(OutputError, ResmlpError) and issubclass(OutputError, OSError)
    from resmlp.checkpoint import CheckpointError as FromCheckpoint

    assert FromCheckpoint is CheckpointError


@pytest.mark.parametrize("error,expected", [
    (OSError(errno.ENOSPC, "No space left on device", "/out/model.safetensors"), "/out/model.safetensors: the disk"),
    (PermissionError(errno.EACCES, "Permission denied", "/sys/x"), "/sys/x: permission denied"),
    (OSError(errno.EROFS, "Read-only file system", "/ro/x"), "/ro/x: read-only file system"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/f/x"), "/f/x: a component of the path is a file"),
    (OutputError("output folder x is in use by another run (pid 1)"), "in use by another run"),
    (Image.DecompressionBombError("Image size (400000000 pixels) exceeds limit"), "exceeds limit"),
    (MemoryError(), "out of main memory"),
])
def test_user_mistakes_get_one_line(error, expected):
    message = user_message(_raised(error))
    assert message is not None and expected in message and "\n" not in message


def test_yaml_syntax_errors_get_one_line():
    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load("model: [1,\n  dim: 3")
    message = user_message(info.value)
    assert message.startswith("invalid YAML:") and "\n" not in message


def test_bugs_get_no_message():
    assert user_message(_raised(ZeroDivisionError("division by zero"))) is None
    assert user_message(_raised(KeyError("x"))) is None
    with pytest.raises(RuntimeError) as info:  # raised inside torch: a bug in the caller, not the user's
        torch.zeros(2, 3) @ torch.zeros(2, 3)
    assert user_message(info.value) is None


def test_a_yaml_syntax_error_in_set_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["train", "--output", str(tmp_path / "run"), "--set", "model.dim=[1,"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("resmlp train: error: invalid YAML:") and err.count("\n") == 1


def test_resmlp_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("RESMLP_DEBUG", "1")
    with pytest.raises(yaml.YAMLError):
        main(["train", "--output", str(tmp_path / "run"), "--set", "model.dim=[1,"])


@pytest.mark.parametrize("fmt", ["json", "table"])  # print() and rich's Console (which alone would exit 1)
def test_a_reader_that_goes_away_ends_the_command_quietly(fmt):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "resmlp", "models", "--format", fmt],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.close()  # before the command has written anything: its first write meets a closed pipe
    _, err = proc.communicate(timeout=limit(120))
    assert b"Traceback" not in err and b"BrokenPipe" not in err
    assert proc.returncode == 141


def test_runtime_errors_raised_by_the_package_are_messages_but_torch_errors_inside_it_are_bugs():
    from resmlp.data.loading.samplers import collate_skipping
    from resmlp.errors import DataError

    with pytest.raises(DataError) as info:  # was a RuntimeError; a worker re-raises it with its traceback as text
        collate_skipping([None, None])
    assert "unreadable" in user_message(info.value)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    from resmlp.inference import predict

    with pytest.raises(RuntimeError) as info:
        predict(model, torch.zeros(1, 5))  # the shape error is torch's, raised under our predict's line
    assert user_message(info.value) is None

"""Device placement under torchrun: more processes than GPUs is a one-line error naming the fix, not a CUDA
traceback. A GPU is faked (torch.cuda.is_available / device_count), so this runs on every host."""

from __future__ import annotations

import pytest
import torch

from resmlp.cli import main
from resmlp.runtime import init_distributed, resolve_device


@pytest.fixture
def one_fake_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def _second_process_of_two(monkeypatch) -> None:
    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)


def test_more_processes_than_gpus_names_the_fix(one_fake_gpu, monkeypatch):
    _second_process_of_two(monkeypatch)
    for name in ("auto", "cuda"):
        with pytest.raises(ValueError, match=r"only 1 GPU\(s\) are visible.*--nproc_per_node=1.*--device cpu"):
            init_distributed(name)
    assert resolve_device("cuda", 0) == torch.device("cuda:0")  # the first process fits on the one GPU


def test_cpu_processes_are_not_limited_by_the_gpu_count(one_fake_gpu):
    assert resolve_device("cpu", local_rank=5) == torch.device("cpu")


def test_the_cli_says_it_in_one_line(one_fake_gpu, monkeypatch, capsys, tmp_path):
    _second_process_of_two(monkeypatch)
    code = main(["train", "--output", str(tmp_path / "run"), "--set", "data.kind=synthetic"])
    err = capsys.readouterr().err
    assert code != 0 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--nproc_per_node=1" in lines[0], err

"""Hostile configs and exhausted resources: bounded YAML, numbers in range, out-of-memory and full disks as
one-line messages with the last good file intact."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
import torch
from hostspeed import limit

from resmlp.cli import main
from resmlp.complexity import count_params, training_memory_bytes
from resmlp.errors import ConfigError, user_message
from resmlp.fileio import atomic_write
from resmlp.models.pretrained import create_model
from resmlp.models.registry import model_config
from resmlp.models.resmlp import ResMLPConfig
from resmlp.train.config import MAX_YAML_DEPTH, load_config, load_yaml

QUICK = ["data.kind=synthetic", "train.threads=1"]
LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))


def test_a_billion_laughs_recipe_is_refused_at_once(tmp_path):
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text(LAUGHS)
    assert len(LAUGHS) < 500  # 9**9 values once expanded
    load_config("fashion-mnist-quick")  # the imports a first config pays for, which a loaded host makes slow
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="expands to more than .* values .*a recipe is a small document"):
        load_config(recipe)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("levels", [MAX_YAML_DEPTH + 1, 100_000])
def test_deeply_nested_yaml_is_refused_with_its_source(levels):
    with pytest.raises(ConfigError, match=f"--set model.dim: nested deeper than {MAX_YAML_DEPTH}"):
        load_config("fashion-mnist-quick", ["model.dim=" + "[" * levels + "]" * levels])


def test_ordinary_yaml_with_aliases_still_loads():
    assert load_yaml("a: &s [0.5, 1.0]\nb: *s\n", "recipe r") == {"a": [0.5, 1.0], "b": [0.5, 1.0]}


@pytest.mark.parametrize("override,words", [
    ("data.synthetic_classes=0", "data.synthetic_classes=0 (from the overrides (a flag or --set)) is outside the "
                                 "allowed range [1, 100000]"),
    ("train.threads=100000", "train.threads=100000 (from the overrides"),
    ("train.batch_size=0", "train.batch_size=0"),
    ("schedule.epochs=10000000", "schedule.epochs=10000000"),
    ("optim.lr=.nan", "optim.lr=nan (from the overrides (a flag or --set)): expected a finite number"),
    ("dino.knn_temperature=0", "dino.knn_temperature=0.0"),
    ("model.depth=1000000000", "depth=1000000000 is above 1000"),
    ("model.dim=100000", "dim=100000 is above 16384"),
    ("model.img_size=1000000", "img_size=1000000 is above 4096"),
])
def test_numbers_out_of_range_name_key_value_range_and_source(override, words):
    with pytest.raises(ConfigError) as info:
        load_config("fashion-mnist-quick", [*QUICK, override])
    assert words in str(info.value)


def test_a_recipe_value_out_of_range_names_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: {name: resmlp_s12}\ndata: {kind: synthetic, synthetic_classes: 0}\n")
    with pytest.raises(ConfigError, match=f"synthetic_classes=0 \\(from recipe {recipe}\\)"):
        load_config(recipe)


def test_the_model_bounds_hold_for_every_source():
    with pytest.raises(ValueError, match="depth=5000 is above 1000"):
        ResMLPConfig(depth=5000)  # a checkpoint's metadata and the benchmark build through the same class
    with pytest.raises(ValueError, match="mlp_ratio"):
        ResMLPConfig(mlp_ratio=float("inf"))


def test_the_memory_estimate_is_a_lower_bound_and_refuses_what_cannot_fit(monkeypatch):
    config = model_config("resmlp_s12", img_size=32, patch_size=8, dim=32, depth=2, num_classes=10)
    params = count_params(create_model("resmlp_s12", img_size=32, patch_size=8, dim=32, depth=2, num_classes=10))
    # at batch 1 the estimate is mostly weights, gradients and one moment: never above four copies of them
    assert training_memory_bytes(config, 1) < 4 * 4 * params + 1e6
    monkeypatch.setattr("resmlp.runtime.physical_memory_bytes", lambda: 2**30)
    with pytest.raises(ConfigError, match=r"needs at least .* GiB .* more than this device's 1.0 GiB; lower "
                                          "train.batch_size"):
        load_config("fashion-mnist-quick", [*QUICK, "model.dim=4096", "model.depth=48"])
    load_config("fashion-mnist-quick", QUICK)  # the quick recipe fits in 1 GiB


def test_a_hostile_config_is_one_line_per_problem_on_the_command_line(tmp_path, capsys):
    recipe = tmp_path / "laughs.yaml"
    recipe.write_text(LAUGHS)
    assert main(["train", "--recipe", str(recipe), "--output", str(tmp_path / "run")]) == 2
    with pytest.raises(SystemExit) as usage:  # argparse's own usage error, exit 2
        main(["train", "--output", str(tmp_path / "run"), "--threads", "100000"])
    assert usage.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "expands to more than" in err and "threads" in err


def test_checkpoint_json_nested_past_the_recursion_limit_is_refused(tmp_path):
    from safetensors.torch import save_file

    from resmlp.checkpoint import CheckpointError, read_header

    path = tmp_path / "deep.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata={"format": "resmlp", "config": "[" * 100_000 + "]" * 100_000})
    with pytest.raises(CheckpointError, match="nested thousands of levels deep"):
        read_header(path)


@pytest.mark.parametrize("error,words", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 1125899906842624 bytes. Error code 12 (Cannot allocate memory)"),
     "out of main memory (an allocation of 1048576.0 GiB failed); lower the batch size"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 79 GiB"),
     "out of GPU memory (an allocation of 20.00 GiB failed); lower the batch size"),
    (MemoryError(), "out of main memory; lower the batch size"),
])
def test_out_of_memory_is_one_line_naming_what_ran_out(error, words):
    message = user_message(error)
    assert message is not None and words in message and "\n" not in message


def test_a_real_failed_cpu_allocation_gets_the_message():
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**60, dtype=torch.uint8)
    assert user_message(info.value).startswith("out of main memory")


def test_a_full_disk_in_safetensors_or_torch_save_names_the_file_and_keeps_the_last_good_one(tmp_path, monkeypatch):
    from safetensors import SafetensorError

    path = tmp_path / "best.safetensors"
    path.write_bytes(b"last good")

    def safetensors_full(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OSError) as info:
        atomic_write(path, safetensors_full)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(path)
    assert f"{path}: the disk is full" in user_message(info.value)

    # torch.save says only "unexpected pos": the folder's free space tells
    monkeypatch.setattr(os, "statvfs", lambda _: os.statvfs_result((4096, 4096, 1, 1, 0, 1, 1, 1, 0, 255)))

    def torch_full(tmp: Path) -> None:
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    with pytest.raises(OSError) as info:
        atomic_write(path, torch_full)
    assert info.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"last good" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_writer_bug_is_not_reported_as_a_full_disk(tmp_path):
    with pytest.raises(ZeroDivisionError):
        atomic_write(tmp_path / "x", lambda tmp: 1 / 0)


def test_finished_files_get_the_usual_permissions_even_from_safetensors(tmp_path):
    import resmlp
    from resmlp import fileio

    path = resmlp.save(create_model("resmlp_s12", img_size=16, patch_size=8, dim=8, depth=1),
                       tmp_path / "m.safetensors")
    assert path.stat().st_mode & 0o777 == 0o666 & ~fileio._UMASK  # 0644 under umask 022, not mkstemp's 0600


WRITE_UNDER_A_SIZE_LIMIT = """
import resource, sys
import torch
import resmlp
from resmlp.errors import user_message
from resmlp.export import export_torchscript
from resmlp.fileio import atomic_write

resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
model = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=64, depth=2, num_classes=10)
for write in (lambda: atomic_write(sys.argv[1] + "/state.pth", lambda tmp: torch.save(model.state_dict(), tmp)),
              lambda: export_torchscript(model, sys.argv[1] + "/model.pt")):
    try:
        write()
    except Exception as e:
        print(user_message(e))
"""


def test_a_file_size_limit_is_one_line_for_torch_save_and_torchscript(tmp_path):
    """`ulimit -f`: torch.save failed with 'unexpected pos' (a traceback) and torch.jit.save aborted the process
    (exit 134); both are now one line naming the file, no temporary left behind."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    done = subprocess.run([sys.executable, "-c", WRITE_UNDER_A_SIZE_LIMIT, str(tmp_path)], capture_output=True,
                          text=True, timeout=limit(120), env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all("the file would exceed the largest file" in line for line in lines), lines
    assert "state.pth" in lines[0] and "model.pt" in lines[1]
    assert list(tmp_path.iterdir()) == []

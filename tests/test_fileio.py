"""Hostile output folders: planted symlinks, a full disk, two runs on one folder, NaN in summaries."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resmlp.errors import OutputError, user_message
from resmlp.fileio import RunLock, atomic_write, remove_stale_temporaries, write_json


def test_symlinks_planted_at_every_predictable_temporary_name_redirect_nothing(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    # the names the old atomic_write used, for this and nearby PIDs, and the mkstemp prefix without suffix
    for pid in range(os.getpid() - 5, os.getpid() + 5):
        (out / f".model.safetensors.tmp{pid}").symlink_to(victim)
    atomic_write(out / "model.safetensors", lambda tmp: tmp.write_text("weights"))
    assert victim.read_text() == "precious"
    assert (out / "model.safetensors").read_text() == "weights"


def test_a_symlink_at_the_target_name_is_replaced_not_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "summary.json").symlink_to(victim)
    write_json(tmp_path / "summary.json", {"a": 1})
    assert victim.read_text() == "precious"
    assert not (tmp_path / "summary.json").is_symlink()
    assert json.loads((tmp_path / "summary.json").read_text()) == {"a": 1}


def test_a_full_disk_leaves_the_previous_file_intact_and_no_temporary(tmp_path):
    target = tmp_path / "state.pt"
    target.write_text("epoch 3")

    def writer_that_fills_the_disk(tmp: Path) -> None:
        tmp.write_text("half of epoch 4")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))

    with pytest.raises(OSError) as info:
        atomic_write(target, writer_that_fills_the_disk)
    assert target.read_text() == "epoch 3"
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]
    message = user_message(info.value)
    assert message is not None and "disk is full" in message


def test_finished_files_get_the_usual_permissions_not_mkstemps_private_ones(tmp_path):
    path = atomic_write(tmp_path / "x.txt", lambda tmp: tmp.write_text("x"))
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


def test_an_output_path_that_is_a_file_is_an_output_error(tmp_path):
    (tmp_path / "run").write_text("not a folder")
    with pytest.raises(OutputError, match="is a file"):
        atomic_write(tmp_path / "run" / "summary.json", lambda tmp: tmp.write_text("{}"))


def test_stale_temporaries_are_removed_and_real_files_kept(tmp_path):
    for name in (".model.safetensors.tmp1234", ".summary.json.k3x_9abc.tmp", "model.safetensors", ".lock"):
        (tmp_path / name).write_text("x")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == [".model.safetensors.tmp1234", ".summary.json.k3x_9abc.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "model.safetensors"]


def test_write_json_is_strict_json_even_with_nan_and_infinity(tmp_path):
    import numpy as np

    path = write_json(tmp_path / "summary.json", {"loss": float("nan"), "best": [float("inf"), 1.5],
                                                  "top1": np.float32(12.5)})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"loss": None, "best": [None, 1.5], "top1": 12.5}


_HOLD_LOCK = textwrap.dedent("""
    import sys, time
    from resmlp.fileio import RunLock
    with RunLock(sys.argv[1]):
        print("locked", flush=True)
        time.sleep(60)
""")


def test_a_second_run_on_a_locked_folder_fails_fast_naming_the_holder(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputError, match=rf"in use by another run \(pid {holder.pid} on "):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()
        holder.wait()
    # the holder died without cleaning up: its lock file stays, and is no obstacle
    assert (tmp_path / ".lock").exists()
    with RunLock(tmp_path) as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()


def test_the_lock_is_exclusive_within_one_process_and_released_on_exit(tmp_path):
    with RunLock(tmp_path / "new"), pytest.raises(OutputError):
        RunLock(tmp_path / "new").acquire()
    with RunLock(tmp_path / "new"):
        pass


def test_a_symlink_planted_at_the_lock_name_is_refused_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / ".lock").symlink_to(victim)
    with pytest.raises(OSError) as info:
        RunLock(tmp_path / "out").acquire()
    assert info.value.errno == errno.ELOOP and victim.read_text() == "precious"

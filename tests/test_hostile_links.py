"""Locks and temporaries never write through a link (issue 44, T3); benchmark scripts write through resmlp.fileio."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from resmlp.cli import main
from resmlp.errors import OutputError
from resmlp.fileio import RunLock

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_a_hard_link_planted_as_the_lock_is_refused_and_its_target_kept(tmp_path):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("precious\n")
    os.link(victim, out / ".lock")
    with pytest.raises(OutputError, match=r"\.lock is a hard link"):
        RunLock(out).acquire()
    assert victim.read_text() == "precious\n"


def test_a_fifo_planted_as_the_lock_is_refused_without_hanging(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / ".lock")
    with pytest.raises(OutputError, match="not a regular file"):
        RunLock(out).acquire()


def test_resmlp_train_keeps_the_target_of_a_hard_linked_lock(tmp_path, capsys):
    out, victim = tmp_path / "out", tmp_path / "victim"
    out.mkdir()
    victim.write_text("precious\n")
    os.link(victim, out / ".lock")
    assert main(["train", "--output", str(out), "--set", "data.kind=synthetic"]) == 2
    err = capsys.readouterr().err
    assert "hard link" in err and "Traceback" not in err
    assert victim.read_text() == "precious\n"


def test_a_lock_file_of_a_finished_run_is_taken_again(tmp_path):
    with RunLock(tmp_path):
        pass
    with RunLock(tmp_path) as lock:
        assert lock.path.is_file()


def test_a_temporary_replaced_by_a_hard_link_is_refused(tmp_path):
    from resmlp.fileio import atomic_write

    victim = tmp_path / "victim"
    victim.write_text("precious\n")

    def hostile_writer(tmp: Path) -> None:  # what a writer racing an attacker would end up with
        tmp.unlink()
        os.link(victim, tmp)

    with pytest.raises(OutputError, match="hard link"):
        atomic_write(tmp_path / "out.json", hostile_writer)
    assert victim.read_text() == "precious\n" and not (tmp_path / "out.json").exists()


# the scripts that write through the project's writer elsewhere (gpu_report, claims) or only plant hostile inputs
# in temporary folders (adversarial)
_OWN_WRITERS = {"adversarial.py", "gpu_report.py", "claims.py"}
_DIRECT_WRITE = re.compile(r"\.write_(text|bytes)\(|open\([^)]*[\"'][wa]b?[\"']|\.open\([\"'][wa]")


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py") if p.name not in _OWN_WRITERS))
def test_benchmark_scripts_write_their_results_through_fileio(script):
    """A result file written by path follows a symlink or hard link planted at its name; resmlp.fileio's
    atomic_write/write_json create a fresh file and rename it."""
    lines = [line for line in (BENCHMARKS / script).read_text().splitlines()
             if _DIRECT_WRITE.search(line) and "lambda tmp" not in line and "/proc/self" not in line]
    assert not lines, f"{script} writes by path: {lines}"

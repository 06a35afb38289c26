"""Ctrl-C exits within seconds of the stop message (issue 57): a command run as the process's own command line
leaves the objects alive at its end out of the collections Python's teardown repeats (`resmlp.cli.quick_exit`,
seconds after a run on a busy CPU); a call with its own arguments (a test, a notebook) changes nothing."""

from __future__ import annotations

import gc

from resmlp.cli import main


def test_the_command_line_freezes_the_heap_before_the_exit_and_a_call_with_arguments_does_not(monkeypatch, capsys):
    gc.unfreeze()
    try:
        assert main(["models"]) == 0 and gc.get_freeze_count() == 0
        monkeypatch.setattr("sys.argv", ["resmlp", "models"])
        assert main() == 0 and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert "resmlp_s12" in capsys.readouterr().out

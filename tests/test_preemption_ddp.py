"""Preemption across processes (issue 53 item 5): SIGTERM, SIGUSR1 or Ctrl-C reaching one rank, or every rank, of
a two-process gloo run (torchrun, or srun's variables without torchrun) stops both ranks at the same step
boundary; rank 0 writes the state once, every rank exits with 128 + the signal's number, and the printed command,
launched as the run was, ends with exactly the weights of an uninterrupted run at the same process count.

No timing decides a step: the child's loss hook sends the signal during step AT (and, where the signal goes
through a launcher, waits in that step until it arrived), so every rank agrees at the boundary after step AT + 1
(a rank's vote is read one boundary after it is cast). Every subprocess has a generous limit that says so."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="POSIX signals")

OVERRIDES = {
    "data.kind": "synthetic", "data.synthetic_size": [96, 16], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5,  # random augmentation, reproduced on resume
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 1, "train.ema": True,
    "train.ema_decay": 0.9, "schedule.epochs": 2, "schedule.warmup_epochs": 0.5, "train.batch_size": 16,
    "train.progress": False, "train.deterministic": True, "train.threads": 1, "train.compile": False,
    "train.amp": "none", "train.checkpoint_every_steps": 0, "train.device": "cpu",  # gloo, also beside a GPU
}
STEPS_PER_EPOCH = 96 // 16
AT = 3  # the signal comes during step 3 of the first epoch: every rank stops after step 4
LIMIT_S = 900  # a loaded 2-core host runs two torch processes slowly; a hang still ends, saying so

# The child: `resmlp train` as a user runs it, with three hooks: the loss sends the signal during step AT (how:
# `self` to its own process on rank 1; `launcher` to its parent, torchrun, which forwards it to every worker;
# `group` to its process group, as SLURM signals every task of a step); every state write and the step where the
# run stopped are recorded per rank, and so is the command's exit status.
CHILD = """
import os, signal, sys, time
from pathlib import Path
from resmlp.cli import main
from resmlp.train import preemption, trainer as trainer_module
from resmlp.train.tasks import SupervisedTask

record, how, sig, at = Path(sys.argv[1]), sys.argv[2], getattr(signal, sys.argv[3]), int(sys.argv[4])
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
def log(name, value):
    with open(record / f"{name}-rank{rank}", "a") as f:
        f.write(f"{value}\\n")
save_state, stop_early = trainer_module.save_state, trainer_module.stop_early
def recording_save(path, state):
    log("saves", state["global_step"])
    return save_state(path, state)
def recording_stop(trainer, save):
    log("stopped", trainer.global_step)
    return stop_early(trainer, save)
trainer_module.save_state, trainer_module.stop_early = recording_save, recording_stop
build_loss = SupervisedTask.build_loss
def signalling(self, trainer, num_classes):
    inner, calls = build_loss(self, trainer, num_classes), {"n": 0}
    def loss_fn(model, images, targets):
        calls["n"] += 1
        if calls["n"] == at and how == "self" and rank == 1:
            os.kill(os.getpid(), sig)
        if calls["n"] == at and how in ("launcher", "group") and rank == 0:
            os.kill(os.getppid(), sig) if how == "launcher" else os.killpg(0, sig)
            deadline = time.monotonic() + 300
            while preemption.requested() is None:  # forwarded by the launcher: wait for it in this step
                if time.monotonic() > deadline:
                    sys.exit("the signal sent through the launcher never arrived")
                time.sleep(0.01)
        return inner(model, images, targets)
    return loss_fn
SupervisedTask.build_loss = signalling
code = main(sys.argv[5:])
log("exit", code)
sys.exit(code)
"""

# srun's part, without SLURM: start the tasks with SLURM's variables alone (resmlp.runtime.adopt_slurm_ranks),
# outlive a signal to the whole step, report every task's exit status and exit with the largest, as srun does
SRUN = """
import json, os, signal, subprocess, sys
for name in ("SIGTERM", "SIGUSR1", "SIGINT"):
    signal.signal(getattr(signal, name), lambda *_: None)
tasks, port, command = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
env = {k: v for k, v in os.environ.items()
       if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
env.update(SLURM_NTASKS=str(tasks), SLURM_NNODES="1", SLURM_NODELIST="localhost", MASTER_PORT=port)
started = [subprocess.Popen(command, env={**env, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)})
           for r in range(tasks)]
codes = [task.wait() for task in started]
print("task exit codes:", json.dumps(codes), flush=True)
sys.exit(max(codes))
"""


def sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


def torchrun() -> list[str]:
    # torchrun SIGKILLs its workers 30 s after it forwards a signal or one exits: on a loaded host, allow more
    return [shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun", "--standalone",
            "--nproc_per_node=2", "--shutdown-timeout=600"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def srun(tmp_path: Path) -> list[str]:
    script = tmp_path / "srun.py"
    script.write_text(SRUN)
    return [sys.executable, str(script), "2", str(free_port()), sys.executable]  # then a script, or -m resmlp


def launch(command: list[str], what: str) -> subprocess.CompletedProcess:
    """Run to the end, in a session of its own (a signal to the process group reaches the launcher and its
    tasks, not pytest); past LIMIT_S, kill it and fail saying so."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{what} did not end within {LIMIT_S} s (a hang, or a very loaded host); stderr:\n{err[-3000:]}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def child(tmp_path: Path, how: str, name: str, run: Path) -> list[str]:
    script, record = tmp_path / "child.py", tmp_path / "record"
    script.write_text(CHILD)
    record.mkdir(exist_ok=True)
    return [str(script), str(record), how, name, str(AT), "train", "--recipe", "fashion-mnist-quick",
            "--output", str(run), *sets(OVERRIDES)]


def recorded(tmp_path: Path, name: str) -> list[list[str]]:
    """What each rank recorded under `name` (rank 0 first): its lines."""
    return [(tmp_path / "record" / f"{name}-rank{rank}").read_text().split() if
            (tmp_path / "record" / f"{name}-rank{rank}").exists() else [] for rank in range(2)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """The uninterrupted two-process run the resumed ones must match bit for bit."""
    run = tmp_path_factory.mktemp("straight") / "run"
    done = launch([*torchrun(), "-m", "resmlp", "train", "--recipe", "fashion-mnist-quick", "--output", str(run),
                   *sets(OVERRIDES)], "the uninterrupted torchrun run")
    assert done.returncode == 0, done.stderr[-3000:]
    return run


@pytest.mark.slow  # three torchrun/srun launches, each run twice (about 45 s idle)
@pytest.mark.parametrize(("launcher", "how", "name"), [
    ("torchrun", "self", "SIGUSR1"),  # SLURM's warning signal to one rank only
    ("torchrun", "launcher", "SIGINT"),  # Ctrl-C on torchrun: it forwards SIGINT to every worker
    ("srun", "group", "SIGTERM"),  # srun without torchrun: SLURM signals every task of the step
])
def test_a_signal_to_one_rank_or_all_stops_every_rank_at_one_step_and_the_printed_command_resumes_exactly(
        tmp_path, straight, launcher, how, name):
    run = tmp_path / "run"
    start = torchrun() if launcher == "torchrun" else srun(tmp_path)
    stopped = launch([*start, *child(tmp_path, how, name, run)], f"the {launcher} run stopped by {name}")
    code = 128 + int(getattr(signal, name))
    assert recorded(tmp_path, "exit") == [[str(code)]] * 2, stopped.stderr[-3000:]  # every rank's status
    assert stopped.returncode != 0  # torchrun reports its workers' failure (1); srun, their largest status
    if launcher == "srun":
        assert stopped.returncode == code and f"task exit codes: [{code}, {code}]" in stopped.stdout
    # the same boundary on every rank: after step AT + 1, or after step AT where a signal to the whole group
    # (or forwarded to every rank by the launcher) reached a rank still behind, before the boundary whose stop
    # flags it joined: a step earlier
    (at,), other = recorded(tmp_path, "stopped")
    assert other == [at] and int(at) in (AT, AT + 1), stopped.stderr[-3000:]
    at = int(at)
    assert how != "self" or at == AT + 1  # a signal to one rank alone: always the boundary after the next step
    assert recorded(tmp_path, "saves") == [[str(at)], []]  # the state written once, by rank 0
    state = torch.load(run / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"], state["world_size"]) == (0, at, at, 2)
    assert f"stopped by {name}: {at} optimizer steps, epoch 1 of 2 at step {at} of {STEPS_PER_EPOCH}" \
           in stopped.stdout
    assert stopped.stdout.count("stopped by") == 1 and "launched as this run was: 2 processes" in stopped.stdout
    # no rank's traceback (torchrun prints its own for its workers' non-zero status)
    assert not any(f"resmlp{os.sep}{part}" in stopped.stderr for part in ("train", "cli.py", "runtime.py")), \
        stopped.stderr[-3000:]

    # the printed command, launched as the run was (the same launcher, two processes)
    command = [line.split(": ", 1)[1] for line in stopped.stdout.splitlines() if "continue it with:" in line]
    assert command == [shlex.join(["resmlp", "train", "--output", str(run), "--resume"])]
    words = shlex.split(command[0])[1:]
    resumed = launch([*start, "-m", "resmlp", *words], f"the resumed {launcher} run")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for file in ("last.safetensors", "best.safetensors"):
        a, b = load_file(run / file), load_file(straight / file)
        assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a), file


# ------------------------------------------------------------------------------------------ in this process
def test_the_vote_is_read_one_boundary_after_it_is_cast_once_per_boundary(tmp_path, monkeypatch):
    """A one-process gloo group stands for the ranks: a signal received before boundary 1 is cast there and
    read (by every rank alike) at boundary 2; polling a boundary again exchanges nothing."""
    import torch.distributed as dist

    from resmlp.train import preemption

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        vote = preemption.StopVote()
        assert vote.poll(0) is None and vote.poll(0) is None
        monkeypatch.setattr(preemption, "_received", [("SIGUSR1", 0.0)])
        assert vote.poll(0) is None  # boundary 0 was cast already, without the signal
        assert vote.poll(1) is None  # read boundary 0's (none), cast boundary 1's
        assert vote.pending[1].device.type == "cpu"  # the vote never touches the training device
        assert vote.poll(2) == "SIGUSR1" and vote.poll(3) == "SIGUSR1" and vote.pending is None
    finally:
        dist.destroy_process_group()


class FakeVote:
    """The vote of several processes, without them: `result` is what they agreed."""

    def __init__(self) -> None:
        self.result = None

    def poll(self, step: int) -> str | None:
        return self.result

    def close(self) -> None:
        pass


def test_a_repeat_within_seconds_is_one_request_a_later_one_stops_at_once_and_after_the_agreement_none(
        monkeypatch):
    """Several processes: torchrun forwards what it receives and SLURM signals every process of a step, so a
    repeat within REPEAT_S is the same request; a later one (a second Ctrl-C) stops this process at once; once
    the ranks agreed, signals are ignored until the process exits (torchrun signals the rest as one exits)."""
    from resmlp.runtime import DistInfo
    from resmlp.train import preemption

    now = [100.0]
    monkeypatch.setattr(preemption, "_clock", lambda: now[0])
    monkeypatch.setattr(preemption, "StopVote", FakeVote)
    info = DistInfo(world_size=2, rank=1, local_rank=1, device=torch.device("cpu"))
    before = {name: signal.getsignal(getattr(signal, name)) for name in ("SIGINT", "SIGTERM", "SIGUSR1")}
    try:
        with pytest.raises(KeyboardInterrupt), preemption.stop_on_signals(info):
            os.kill(os.getpid(), signal.SIGINT)
            now[0] += preemption.REPEAT_S / 2
            os.kill(os.getpid(), signal.SIGINT)  # the same Ctrl-C, forwarded
            assert preemption.requested() == "SIGINT" and preemption.agreed(5) is None  # not agreed yet
            now[0] += preemption.REPEAT_S
            os.kill(os.getpid(), signal.SIGINT)  # a second Ctrl-C: KeyboardInterrupt, now
            pytest.fail("the second Ctrl-C did not interrupt")
        assert signal.getsignal(signal.SIGINT) is before["SIGINT"]

        with preemption.stop_on_signals(info):
            os.kill(os.getpid(), signal.SIGTERM)
            preemption._vote[0].result = "SIGTERM"  # every rank agreed
            now[0] += 10 * preemption.REPEAT_S
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the run is stopping already
            assert preemption.agreed(5) == "SIGTERM"
        assert all(signal.getsignal(getattr(signal, name)) is signal.SIG_IGN for name in before)
    finally:
        for name, handler in before.items():
            signal.signal(getattr(signal, name), handler)

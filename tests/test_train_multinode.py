"""Past one machine, on the CPU with gloo: two torchrun "nodes" on localhost (c10d rendezvous, one process each)
train the weights of one process with the same global batch, and a run stopped at N processes resumes at M
processes (same global batch) where it stopped, every image of every epoch trained on exactly once.

"Exactly once" is proven from the sampler's keys: every process records each (seed, epoch, global position,
index) it hands to training; the stopped run's keys before its last checkpoint plus the resumed run's keys
must be the uninterrupted run's keys, none twice, none missing."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import assert_same_training
from hostspeed import limit
from safetensors.torch import load_file
from test_train_engine import initial_weights

OVERRIDES = {
    "data.kind": "synthetic", "data.synthetic_size": [64, 16], "data.num_workers": 0, "data.crop_pct": 1.0,
    "data.scale": [0.6, 1.0], "data.hflip": 0.5,  # per-sample seeds make augmentation rank-independent
    "model.img_size": 16, "model.patch_size": 4, "model.dim": 16, "model.depth": 1,
    "schedule.epochs": 2, "schedule.warmup_epochs": 0, "train.batch_size": 16, "train.progress": False,
    "train.amp": "none", "optim.name": "sgd", "optim.lr": 0.1, "train.threads": 1, "train.compile": False,
    "train.checkpoint_every_steps": 1, "train.device": "cpu",  # gloo on the CPU, also where a GPU is visible
}
STEPS_PER_EPOCH = 64 // 16
KILL_AT_STEP = 6  # the 6th step (epoch 2, its 2nd step) kills every process; last.pth holds 5 steps
TIMEOUT = 120

# The child: trains through the Python API; records every sampler key it hands out (one file per run and rank,
# flushed per key so that a SIGKILL loses nothing) and, with a kill step, SIGKILLs itself at that step's loss,
# after the checkpoint of the step before was written (the trainer's barrier follows every checkpoint).
CHILD = """
import json, os, signal, sys
from pathlib import Path
from resmlp.data.loading import samplers
from resmlp.train import train
from resmlp.train.config import load_config
from resmlp.train.tasks import SupervisedTask

out, record, overrides, kill_at, resume = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]), \\
    int(sys.argv[4]), sys.argv[5] == "resume"
keys_file = open(record.with_name(f"{record.name}-rank{os.environ.get('RANK', '0')}.jsonl"), "a")
plain_iter = samplers.ResumableSampler.__iter__
def recording_iter(self):
    for key in plain_iter(self):
        keys_file.write(json.dumps(key) + "\\n")
        keys_file.flush()
        yield key
samplers.ResumableSampler.__iter__ = recording_iter

class KillAtStep(SupervisedTask):
    def build_loss(self, trainer, num_classes):
        inner, calls = super().build_loss(trainer, num_classes), {"n": 0}
        def loss_fn(model, images, targets):
            calls["n"] += 1
            if calls["n"] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return inner(model, images, targets)
        return loss_fn
cfg = load_config("fashion-mnist-quick", overrides)
train(cfg, out, task=KillAtStep(cfg), resume=resume)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun() -> str:
    return shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"


def child_command(tmp_path: Path, processes: int, out: Path, record: str, kill_at: int = 0,
                  resume: bool = False, grad_accum: int = 1) -> list[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    overrides = {**OVERRIDES, "train.grad_accum": grad_accum}
    args = [str(script), str(out), str(tmp_path / record), json.dumps(overrides), str(kill_at),
            "resume" if resume else "new"]
    if processes == 1:  # one plain process, as `resmlp train` runs without torchrun
        return [sys.executable, *args]
    return [torchrun(), "--standalone", f"--nproc_per_node={processes}", *args]


def recorded_keys(tmp_path: Path, record: str) -> list[tuple[int, ...]]:
    return [tuple(json.loads(line)) for path in sorted(tmp_path.glob(f"{record}-rank*.jsonl"))
            for line in path.read_text().splitlines()]


def run(command: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=limit(TIMEOUT), **kw)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> tuple[Path, list[tuple[int, ...]]]:
    """The uninterrupted single-process run every other run is compared with: its folder and sampler keys."""
    root = tmp_path_factory.mktemp("straight")
    done = run(child_command(root, 1, root / "run", "keys"))
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "run", recorded_keys(root, "keys")


def test_two_nodes_with_c10d_rendezvous_match_one_process(tmp_path, straight):
    """`torchrun --nnodes=2` twice on localhost: rank assignment by the c10d rendezvous, gloo between them."""
    endpoint = f"127.0.0.1:{free_port()}"
    sets = [arg for k, v in OVERRIDES.items() if k != "train.checkpoint_every_steps"
            for arg in ("--set", f"{k}={json.dumps(v)}")]
    node = [torchrun(), "--nnodes=2", "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
            "--rdzv-id=resmlp-two-nodes", "-m", "resmlp", "train", "--output", str(tmp_path / "run"), *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = [subprocess.Popen(node, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    try:
        errors = [p.communicate(timeout=limit(TIMEOUT))[1] for p in nodes]
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, err in zip(nodes, errors, strict=True):
        assert p.returncode == 0, err[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["global_batch"] == 16
    a, b = load_file(tmp_path / "run" / "last.safetensors"), load_file(straight[0] / "last.safetensors")
    assert_same_training(initial_weights(OVERRIDES), a, b, "none", "two torchrun nodes")


# 2 -> 1 resumes with grad_accum 2 (same micro-batch per process: what a job back on fewer nodes needs)
@pytest.mark.parametrize(("before", "after", "accum_after"), [(2, 1, 2), (1, 2, 1)])
def test_a_run_stopped_at_n_processes_resumes_at_m_where_it_stopped(tmp_path, straight, before, after,
                                                                     accum_after):
    out = tmp_path / "run"
    killed = run(child_command(tmp_path, before, out, "killed", kill_at=KILL_AT_STEP))
    assert killed.returncode != 0, "the run was meant to be killed mid-epoch"
    state = torch.load(out / "last.pth", weights_only=True)
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (1, 1, 5)
    assert state["world_size"] == before

    resumed = run(child_command(tmp_path, after, out, "resumed", resume=True, grad_accum=accum_after))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == after and summary["epochs"] == 2

    # the killed run's keys up to its checkpoint (a prefetching loader may have drawn a few more), then the
    # resumed run's: together exactly the uninterrupted run's keys, each once
    trained_before = [key for key in recorded_keys(tmp_path, "killed")
                      if (key[1], key[2]) < (state["epoch"], state["step_in_epoch"] * OVERRIDES["train.batch_size"])]
    seen = Counter(trained_before + recorded_keys(tmp_path, "resumed"))
    expected = Counter(straight[1])
    assert len(expected) == 2 * 64 and set(expected.values()) == {1}  # 2 epochs of 64 images, each once
    assert seen == expected, (f"repeated: {sorted(k for k in seen if seen[k] > 1)[:5]}, "
                              f"skipped: {sorted(set(expected) - set(seen))[:5]}")

    a, b = load_file(out / "last.safetensors"), load_file(straight[0] / "last.safetensors")
    assert_same_training(initial_weights(OVERRIDES), a, b, "none", f"stopped at {before}, resumed at {after}")


def test_a_resume_whose_epoch_would_have_another_length_is_refused(tmp_path, capsys):
    """63 images in batches of 16: 3 steps in one process, 4 in two (the sampler pads 63 to 64)."""
    from resmlp.cli import main

    overrides = {**OVERRIDES, "data.synthetic_size": [63, 16]}
    sets = [f"--set={k}={json.dumps(v)}" for k, v in overrides.items() if k != "schedule.epochs"]
    two = run([torchrun(), "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train", "--output",
               str(tmp_path / "run"), "--epochs", "1", *sets])
    assert two.returncode == 0, two.stderr[-3000:]
    assert main(["train", "--output", str(tmp_path / "run"), "--resume", "--epochs", "2", *sets]) == 2
    err = capsys.readouterr().err
    assert "trained at 2 process(es) with 4 steps per epoch" in err and "resume at 2 process(es)" in err


@pytest.mark.parametrize("repeats", [0, 3])  # 3: the DeiT recipe's repeated augmentation (timm's sampler)
def test_every_process_count_continues_the_same_global_order(repeats):
    """The sampler's side of a resume at another process count, for both samplers it wraps: after 2 steps of
    a global batch of 16, the ranks of 1, 2 or 4 processes together hold the rest of one global order."""
    from resmlp.data.loading.samplers import ResumableSampler, repeat_placement

    dataset, batch, steps_done = range(512), 16, 2

    def rest_of_epoch(world: int) -> list[tuple[int, int]]:
        keys = []
        for rank in range(world):
            sampler = ResumableSampler(dataset, seed=5, world_size=world, rank=rank, repeats=repeats)
            if repeats:  # the epoch keeps the placement it started with at one process (the state records it)
                sampler.resumed_placement = (1, repeat_placement(repeats, 1))
            sampler.set_position(epoch=1, skip=steps_done * batch // world)
            keys += [(position, index) for _, _, position, index in sampler]
        return sorted(keys)

    one = rest_of_epoch(1)
    assert [position for position, _ in one] == list(range(steps_done * batch, 512))
    for world in (2, 4):
        assert rest_of_epoch(world) == one, f"{world} processes continue another order than one"

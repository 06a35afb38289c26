"""data.pipeline: auto -- the device path measured against timm's before the first step -- and the fallback to
timm's path when the device path fails (resmlp.data.loading.choice, resmlp.data.loading.batches).

A run that chose a path equals a run forced to it bit for bit; the choice and a switch are in summary.json and
in the state, and a resume goes on on the state's path without a probe; a device failure (RuntimeError, out of
memory, NotImplementedError in decoding, the resample or the augmentation) at the probe or at a later step
switches to timm's path from the same position, and a resume after it equals the uninterrupted run; an error of
the user's data is not a device failure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hostspeed import limit
from safetensors.torch import load_file
from test_device_pipeline import make_jpeg_folder

from resmlp.cli import main
from resmlp.data.device import augment as device_augment
from resmlp.data.device import pipeline as device_pipeline
from resmlp.data.device.augment import DeviceAugment
from resmlp.data.loading import batches as train_batches
from resmlp.data.loading import choice
from resmlp.data.loading.samplers import sample_seed
from resmlp.errors import DataError

pytestmark = pytest.mark.filterwarnings("ignore:skipping unreadable image")

SETS = {"data.kind": "folder", "data.num_workers": 0, "model.img_size": 16, "model.patch_size": 8, "model.dim": 16,
        "model.depth": 1, "model.in_chans": 3, "schedule.epochs": 2, "schedule.warmup_epochs": 0,
        "train.batch_size": 4, "train.progress": False, "train.compile": False, "train.threads": 1,
        "train.amp": "none", "train.device": "cpu", "data.auto_augment": "rand-m9-mstd0.5-inc1",
        "data.reprob": 0.25, "data.mixup": 0.8, "data.cutmix": 1.0, "data.mean": [0.5] * 3, "data.std": [0.25] * 3}
PROBE = re.compile(r"data\.pipeline auto: device (\S+) images/s, timm (\S+) images/s .* -> (device|timm)")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_jpeg_folder(tmp_path_factory.mktemp("choice") / "data")


def train(folder, out, capsys, recipe: str = "deit", extra: list[str] = (), **sets) -> tuple[int, str, str]:
    args = [f"--set={k}={json.dumps(v)}" for k, v in {**SETS, **sets}.items()]
    command = ["pretrain", "dino"] if recipe == "dino-imagenet" else ["train"]
    code = main([*command, "--recipe", recipe, "--data-dir", str(folder), "--output", str(out), *args, *extra])
    printed = capsys.readouterr()
    return code, printed.out, printed.err


def summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())["data_pipeline"]


def weights(out) -> dict[str, torch.Tensor]:
    return load_file(out / "last.safetensors")


def assert_same_weights(a, b) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


# ------------------------------------------------------------------------------------------ the decision
def test_the_faster_path_wins_a_failed_one_loses_and_a_tie_goes_to_timm():
    cpu = torch.device("cpu")
    assert choice.decide({"device": 120.0, "timm": 80.0}, cpu).name == "device"
    assert choice.decide({"device": 80.0, "timm": 120.0}, cpu).name == "timm"
    assert choice.decide({"device": 100.0, "timm": 100.0}, cpu).name == "timm"
    lost = choice.decide({"device": "RuntimeError: nvJPEG refused", "timm": 5.0}, cpu)
    assert lost.name == "timm" and lost.figures == {"device": None, "timm": 5.0} and "nvJPEG refused" in lost.reason


def test_the_probe_is_bounded_in_batches_and_in_time():
    handed = []

    def batches(n):
        for i in range(n):
            handed.append(i)
            yield None, torch.zeros(4), 0

    assert choice.images_per_second(batches(100), torch.device("cpu"), max_batches=5, seconds=60) > 0
    assert len(handed) == 5
    handed.clear()
    choice.images_per_second(batches(100), torch.device("cpu"), max_batches=50, seconds=0)  # the cap: first batch
    assert len(handed) == 1


def test_device_failures_are_the_devices_and_data_errors_are_not():
    assert choice.is_device_failure(RuntimeError("CUDA error: no kernel image is available"))
    assert choice.is_device_failure(torch.OutOfMemoryError("CUDA out of memory"))
    assert choice.is_device_failure(NotImplementedError("'upsample_bicubic2d' not implemented for 'Byte'"))
    assert not choice.is_device_failure(DataError("no image of a batch of 4 could be decoded"))
    assert not choice.is_device_failure(ValueError("a bug"))


# ------------------------------------------------------------------------------------------ auto in a run
@pytest.mark.parametrize(("winner", "workers"), [("device", 0), ("timm", 0), ("device", 1)])
def test_auto_prints_and_records_its_choice_and_equals_the_run_forced_to_it(folder, tmp_path, capsys, monkeypatch,
                                                                              winner, workers):
    real = train_batches.measure

    def measured(paths, device):  # the real probe (every batch read), then the winner we test made faster
        figures = real(paths, device)
        assert all(isinstance(v, float) and v > 0 for v in figures.values()), figures
        return {**figures, winner: max(figures.values()) + 1.0}

    monkeypatch.setattr(train_batches, "measure", measured)
    # with a worker the probe leaves both paths' persistent workers mid-epoch; the chosen one's are kept
    code, out, err = train(folder, tmp_path / "auto", capsys, **{"data.num_workers": workers})
    assert code == 0, err[-2000:]
    line = PROBE.search(out)
    assert line and line.group(3) == winner and out.count("data.pipeline auto:") == 1
    recorded = summary(tmp_path / "auto")
    assert recorded["name"] == winner and set(recorded["figures"]) == {"device", "timm"}
    assert recorded["reason"].startswith("measured faster") and recorded["switched"] is None
    assert ("decoded_on_device" in recorded) == (winner == "device")  # counts of the batches trained on
    assert torch.load(tmp_path / "auto" / "last.pth", weights_only=True)["data_pipeline"]["name"] == winner
    monkeypatch.setattr(train_batches, "measure", real)
    code, out, _ = train(folder, tmp_path / "forced", capsys, **{"data.pipeline": winner, "data.num_workers": workers})
    assert code == 0 and "data.pipeline auto:" not in out
    assert_same_weights(tmp_path / "auto", tmp_path / "forced")


def test_a_resume_goes_on_on_the_recorded_path_without_a_probe(folder, tmp_path, capsys, monkeypatch):
    real = train_batches.measure  # timm's path chosen: its resume is exact bit for bit
    monkeypatch.setattr(train_batches, "measure", lambda paths, device: {**real(paths, device), "device": 1e-3})
    code, out, _ = train(folder, tmp_path / "run", capsys, extra=["--max-steps", "2"])
    assert code == 0 and PROBE.search(out)
    chosen = torch.load(tmp_path / "run" / "last.pth", weights_only=True)["data_pipeline"]["name"]
    code, out, _ = train(folder, tmp_path / "run", capsys, extra=["--resume"])
    assert code == 0 and "data.pipeline auto:" not in out and summary(tmp_path / "run")["name"] == chosen
    code, _, _ = train(folder, tmp_path / "forced", capsys, **{"data.pipeline": chosen})
    assert_same_weights(tmp_path / "run", tmp_path / "forced")


def test_a_state_of_a_forced_path_resumes_under_auto_on_that_path(folder, tmp_path, capsys):
    code, _, _ = train(folder, tmp_path / "run", capsys, extra=["--max-steps", "2"], **{"data.pipeline": "timm"})
    assert code == 0
    code, out, err = train(folder, tmp_path / "run", capsys, extra=["--resume"])  # the recipe's auto
    assert code == 0, err[-2000:]
    assert "data.pipeline auto:" not in out and summary(tmp_path / "run")["name"] == "timm"


def test_where_the_device_path_cant_run_auto_takes_timms_without_a_probe(folder, tmp_path, capsys):
    code, out, _ = train(folder, tmp_path / "run", capsys, **{"data.color_jitter": 0.4, "data.auto_augment": None,
                                                              "schedule.epochs": 1})
    assert code == 0 and "data.pipeline auto:" not in out
    recorded = summary(tmp_path / "run")
    assert recorded["name"] == "timm" and recorded["figures"] == {}
    assert recorded["reason"].startswith("only eligible path") and "color_jitter" in recorded["reason"]


def test_in_memory_arrays_without_randaugment_take_the_batched_path_as_the_only_one(tmp_path, capsys):
    code = main(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "run"), "--epochs", "1",
                 "--set", "data.kind=synthetic", "--set", "data.synthetic_size=[32,8]", "--set", "data.pipeline=auto",
                 "--set", "train.batch_size=8", "--set", "model.depth=1", "--no-progress"])
    assert code == 0 and "data.pipeline auto:" not in capsys.readouterr().out
    recorded = summary(tmp_path / "run")
    assert recorded["name"] == "batched" and recorded["reason"] == "only eligible path"


def test_dino_imagenet_probes_its_multi_crop_against_dinos_transform(folder, tmp_path, capsys):
    dino = {"dino.out_dim": 16, "dino.hidden_dim": 16, "dino.bottleneck_dim": 8, "dino.num_local": 1,
            "dino.local_size": 8, "dino.knn_k": 3, "dino.warmup_teacher_temp_epochs": 0, "schedule.epochs": 1}
    sets = {k: v for k, v in SETS.items() if not k.startswith(("data.auto_augment", "data.reprob", "data.mix",
                                                               "data.cutmix"))}
    code = main(["pretrain", "dino", "--recipe", "dino-imagenet", "--data-dir", str(folder), "--output",
                 str(tmp_path / "run"), *[f"--set={k}={json.dumps(v)}" for k, v in {**sets, **dino}.items()]])
    out = capsys.readouterr().out
    assert code == 0 and PROBE.search(out)
    recorded = summary(tmp_path / "run")
    assert recorded["name"] in ("device", "timm") and set(recorded["figures"]) == {"device", "timm"}


# ------------------------------------------------------------------------------------------ the fallback
FAILURES = {"runtime": RuntimeError("nvJPEG: the image is not supported"),
            "oom": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 58.00 GiB"),
            "kernel": NotImplementedError("'upsample_bicubic2d' not implemented for 'Half'")}


def failing_at(monkeypatch, where: str, error: BaseException, position: int | None) -> None:
    """The device path raises `error` in `where` (decode, augment or resample) for the batch holding the sample
    at `position` of epoch 0 (a file nvJPEG refuses), or (position None) at every call."""
    bad = None if position is None else sample_seed((0, 0, position, 0))

    def hit(seeds) -> bool:
        return bad is None or bad in list(seeds)

    if where == "decode":
        real = device_pipeline.decode_batch

        def decode(batch, *args, **kwargs):
            if hit(batch.seeds):
                raise error
            return real(batch, *args, **kwargs)
        monkeypatch.setattr(device_pipeline, "decode_batch", decode)
    elif where == "augment":
        real_call = DeviceAugment.__call__

        def call(self, images, seeds):
            if hit(seeds):
                raise error
            return real_call(self, images, seeds)
        monkeypatch.setattr(DeviceAugment, "__call__", call)
    else:  # the resample (the batched one; on CPU tensors its per-crop form): no seeds at hand, so every call
        assert position is None

        def resample(*args, **kwargs):
            raise error
        monkeypatch.setattr(device_augment, "resized_crop", resample)
        monkeypatch.setattr(DeviceAugment, "_crops_one_by_one", resample)


@pytest.mark.parametrize(("where", "kind"), [("decode", "runtime"), ("augment", "kernel"), ("resample", "oom")])
def test_a_device_failure_at_the_probe_leaves_timms_path_named(folder, tmp_path, capsys, monkeypatch, where, kind):
    failing_at(monkeypatch, where, FAILURES[kind], None)
    code, out, err = train(folder, tmp_path / "run", capsys, **{"schedule.epochs": 1})
    assert code == 0, err[-2000:]
    assert "the device path failed at the probe" in out and type(FAILURES[kind]).__name__ in out
    recorded = summary(tmp_path / "run")
    assert recorded["name"] == "timm" and recorded["figures"]["device"] is None and recorded["figures"]["timm"] > 0


@pytest.mark.parametrize(("where", "kind"), [("decode", "runtime"), ("augment", "oom"), ("decode", "kernel")])
def test_a_device_failure_mid_run_finishes_on_timms_path_and_resumes_exactly(folder, tmp_path, capsys, monkeypatch,
                                                                             where, kind):
    # data.pipeline=device (no probe); the sample at position 8 of epoch 0 fails: the 3rd step, batch 4
    failing_at(monkeypatch, where, FAILURES[kind], 8)
    code, _, err = train(folder, tmp_path / "whole", capsys, **{"data.pipeline": "device"})
    assert code == 0, err[-2000:]
    assert err.count("data.pipeline: the device path failed at epoch 1, sample 8") == 1
    assert type(FAILURES[kind]).__name__ in err
    recorded = summary(tmp_path / "whole")
    assert recorded["name"] == "timm" and recorded["switched"]["position"] == 8
    assert recorded["switched"]["epoch"] == 0 and type(FAILURES[kind]).__name__ in recorded["switched"]["error"]
    for stop in (1, 4):  # stopped before the failure (the state says device) and after it (timm)
        out = tmp_path / f"stopped{stop}"
        assert train(folder, out, capsys, extra=["--max-steps", str(stop)], **{"data.pipeline": "device"})[0] == 0
        state = torch.load(out / "last.pth", weights_only=True)["data_pipeline"]
        assert state["name"] == ("device" if stop == 1 else "timm")
        assert train(folder, out, capsys, extra=["--resume"], **{"data.pipeline": "device"})[0] == 0
        assert summary(out)["name"] == "timm" and summary(out)["switched"]["position"] == 8
        if stop == 4:  # every step after the resume on timm's path: bit for bit
            assert_same_weights(out, tmp_path / "whole")
        else:  # a resume on the device path itself is exact within float rounding (as before this change)
            wa, wb = weights(out), weights(tmp_path / "whole")
            assert all(torch.allclose(wa[k], wb[k], rtol=0, atol=1e-4) for k in wa)


def test_an_error_of_the_users_data_is_not_a_device_failure(folder, tmp_path, capsys, monkeypatch):
    failing_at(monkeypatch, "decode", DataError("no image of a batch of 4 could be decoded"), 8)
    code, _, err = train(folder, tmp_path / "run", capsys, **{"data.pipeline": "device"})
    assert code != 0 and "no image of a batch of 4 could be decoded" in err and "Traceback" not in err
    assert "device path failed" not in err and not (tmp_path / "run" / "summary.json").exists()


# ------------------------------------------------------------------------------------------ the node report
def test_benchmark_pipeline_reports_each_path_the_raw_step_and_autos_choice(folder, tmp_path, capsys):
    sets = [f"--set={k}={v}" for k, v in {"data.kind": "folder", "data.num_workers": 0, "model.img_size": 16,
                                          "model.patch_size": 8, "model.dim": 16, "model.depth": 1}.items()]
    code = main(["benchmark", "--pipeline", "--recipe", "deit", "--data-dir", str(folder), "--batch-size", "4",
                 "--device", "cpu", "--batches", "3", "--output", str(tmp_path / "report.json"), *sets])
    out = capsys.readouterr().out
    assert code == 0 and "data.pipeline auto would choose:" in out and "raw training step" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert set(report["paths"]) == {"device", "timm"} and report["raw_step_images_per_s"] > 0
    for row in report["paths"].values():
        assert row["images_per_s"] > 0 and row["ops_per_batch"] > 0 and row["host_ms_per_batch"] >= 0
    assert report["paths"]["device"]["ops_per_batch"] > report["paths"]["timm"]["ops_per_batch"]  # it augments
    faster = max(report["paths"], key=lambda n: (report["paths"][n]["images_per_s"], n == "timm"))
    assert report["auto_would_choose"]["name"] == faster


def test_under_torchrun_rank_0_decides_and_every_rank_trains_on_its_choice(folder, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
    sets = [f"--set={k}={json.dumps(v)}" for k, v in {**SETS, "schedule.epochs": 1}.items()]
    done = subprocess.run([torchrun, "--standalone", "--nproc_per_node=2", "-m", "resmlp", "train", "--recipe", "deit",
                           "--data-dir", str(folder), "--output", str(tmp_path / "ddp"), *sets],
                          capture_output=True, text=True, timeout=limit(600))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("data.pipeline auto:") == 1  # rank 0 measured; rank 1 took its choice
    recorded = summary(tmp_path / "ddp")
    assert recorded["name"] in ("device", "timm") and set(recorded["figures"]) == {"device", "timm"}


@pytest.mark.parametrize("recipe", ["deit", "dino-imagenet"])
def test_a_dry_run_says_the_path_is_measured_at_the_start(tmp_path, capsys, monkeypatch, recipe):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    command = ["pretrain", "dino"] if recipe == "dino-imagenet" else ["train"]
    assert main([*command, "--recipe", recipe, "--output", str(tmp_path / "x"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "pipeline: auto" in out and "data.pipeline auto measures the device path against timm's" in out


def test_benchmark_pipeline_without_data_is_one_line(capsys):
    assert main(["benchmark", "--pipeline", "--recipe", "deit", "--device", "cpu"]) != 0
    err = capsys.readouterr().err
    assert "data.dir: the folder dataset needs a folder" in err and "Traceback" not in err


@pytest.mark.parametrize("record", [["device"], {"name": 3}, "timm"])
def test_a_damaged_choice_in_a_state_is_one_line(record):
    from resmlp.errors import CheckpointError

    with pytest.raises(CheckpointError, match="data_pipeline record"):
        choice.PipelineChoice.from_dict(record)
    kept = choice.PipelineChoice.from_dict({"name": "timm", "figures": "x", "switched": 5})
    assert kept == choice.PipelineChoice("timm", "", {}, None)

"""Hostile inputs, fourth round (issue 48), the mechanisms of engineer F: HF labels without a ClassLabel (9), `hf:`
folders that datasets and pyarrow refuse with their own exceptions or that point outside themselves (18), launch
variables (13), `--dry-run --data folder:DIR` (14), `translate average` (15), `checkpoints.json` (16), and the
third round's leftovers (19: `gpu_report.py --merge`, a closed stdout, a sacremoses returning None).

Each test failed before its fix: a traceback, a silent wrong answer, or a size taken from the data unbounded."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import datasets  # the data extra: CI installs it
import numpy as np
import pytest
import torch
from PIL import Image
from test_gpu_report_merge import SHIPPED, _merge, _refused

from resmlp.cli import main
from resmlp.data.records import MAX_CLASSES
from resmlp.data.sources import open_source
from resmlp.errors import CheckpointError, ConfigError, DataError, InstallError
from resmlp.runtime import adopt_slurm_ranks, check_launch_environment
from resmlp.seq2seq.averaging import kept_checkpoints as kept_averaged
from resmlp.train import history


def _one_line(capsys, *words: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


# ------------------------------------------------------------------------------------------ 9, 18: hf:
def _images(n: int) -> list[Image.Image]:
    return [Image.fromarray(np.full((4, 4, 3), 30 * i, np.uint8)) for i in range(n)]


def _plain_labels(labels: list) -> datasets.Dataset:
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    return datasets.Dataset.from_dict({"image": _images(len(labels)), "label": labels}, features=features)


def test_hf_labels_without_a_classlabel_are_bounded_before_the_names_are_made(tmp_path):
    # before: 0..max label became the class names (one row labelled 2**31: two billion names, then the head)
    _plain_labels([0, MAX_CLASSES + 7]).save_to_disk(tmp_path / "huge")
    with pytest.raises(DataError, match=rf"label column's largest label {MAX_CLASSES + 7:,} makes .* confusion"):
        open_source(f"hf:{tmp_path / 'huge'}")
    _plain_labels([0, 2]).save_to_disk(tmp_path / "small")  # within the bound: classes 0..2, as before
    assert open_source(f"hf:{tmp_path / 'small'}").records("train").class_names == ["0", "1", "2"]


def _saved(tmp_path: Path, name: str) -> Path:
    _plain_labels([0, 1]).save_to_disk(tmp_path / name)
    return tmp_path / name


def test_hf_folders_datasets_refuses_are_one_line(tmp_path):
    # two schemas in one split: datasets' DatasetGenerationError (a traceback before)
    (tmp_path / "two").mkdir()
    _plain_labels([0]).to_parquet(tmp_path / "two" / "train-0.parquet")
    datasets.Dataset.from_dict({"image": _images(1), "label": ["x"]},
                               features=datasets.Features({"image": datasets.Image(),
                                                           "label": datasets.Value("string")})
                               ).to_parquet(tmp_path / "two" / "train-1.parquet")
    with pytest.raises(DataError, match="two schemas in one split"):
        open_source(f"hf:{tmp_path / 'two'}")
    # dataset_info.json that lies about the features: datasets' ValueError (a traceback before)
    info = _saved(tmp_path, "lying") / "dataset_info.json"
    described = json.loads(info.read_text())
    described["features"]["extra"] = {"_type": "Value", "dtype": "int64"}
    info.write_text(json.dumps(described))
    with pytest.raises(DataError, match=r"lying: can't be read as a saved dataset: ValueError"):
        open_source(f"hf:{tmp_path / 'lying'}")
    # an empty DatasetDict: an IndexError before
    datasets.DatasetDict({}).save_to_disk(tmp_path / "empty")
    with pytest.raises(DataError, match="names no splits"):
        open_source(f"hf:{tmp_path / 'empty'}")


def test_hf_state_json_may_not_name_data_outside_its_folder(tmp_path):
    # before: datasets opened ../other/*.arrow and the run trained on another dataset
    other, planted = _saved(tmp_path, "other"), _saved(tmp_path, "planted")
    state = json.loads((planted / "state.json").read_text())
    arrow = state["_data_files"][0]["filename"]
    (planted / arrow).unlink()
    state["_data_files"] = [{"filename": f"../other/{arrow}"}]
    (planted / "state.json").write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"data file '\.\./other/.*' is not a file of"):
        open_source(f"hf:{planted}")
    (planted / arrow).symlink_to(other / arrow)  # a link out, under the plain name
    state["_data_files"] = [{"filename": arrow}]
    (planted / "state.json").write_text(json.dumps(state))
    with pytest.raises(DataError, match="is not a file of"):
        open_source(f"hf:{planted}")
    (tmp_path / "dict").mkdir()  # a DatasetDict's split named ../other
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["../other"]}))
    with pytest.raises(DataError, match=r"split '\.\./other' is not one of"):
        open_source(f"hf:{tmp_path / 'dict'}")


# ------------------------------------------------------------------------------------------ 13: launch variables
@pytest.mark.parametrize("env, name", [
    ({"SLURM_NTASKS": "0", "SLURM_PROCID": "0"}, "SLURM_NTASKS"),  # before: ZeroDivisionError further on
    ({"SLURM_NTASKS": "4", "SLURM_PROCID": "x1"}, "SLURM_PROCID"),
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_NNODES": "1_0"}, "SLURM_NNODES"),  # int() takes 1_0
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "5"}, "SLURM_PROCID"),  # a rank past the world
    ({"SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "\u0663"}, "SLURM_LOCALID"),  # int() takes ٣
])
def test_slurm_variables_are_refused_naming_the_variable(env, name):
    with pytest.raises(ConfigError, match=rf"^{name}=.*expected a whole number|^{name}=.* is not below"):
        adopt_slurm_ranks(dict(env))


@pytest.mark.parametrize("name, value", [("WORLD_SIZE", "0"), ("WORLD_SIZE", "two"), ("LOCAL_RANK", "-1"),
                                         ("MASTER_PORT", "70000"), ("MASTER_PORT", "http"), ("RANK", " 1")])
def test_torchrun_variables_are_refused_naming_the_variable(name, value, monkeypatch, capsys):
    with pytest.raises(ConfigError, match=f"^{name}="):
        check_launch_environment({"WORLD_SIZE": "2", name: value})
    monkeypatch.setenv(name, value)  # every command checks them first, in one line
    assert main(["models", "resmlp_s12", "--format", "json"]) == 2
    _one_line(capsys, f"{name}=")


# ------------------------------------------------------------------------------------------ 14: --dry-run
def test_dry_run_counts_the_classes_of_the_data_given(tmp_path, capsys):
    # before: the recipe's dataset (fashion-mnist, 10 classes) was reported for --data folder:DIR
    for name in ("a", "b", "c", "d", "e"):
        (tmp_path / "data" / "train" / name).mkdir(parents=True)
    assert main(["train", "--output", str(tmp_path / "r"), "--data", f"folder:{tmp_path / 'data'}", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"5 classes (the class folders of {tmp_path / 'data' / 'train'})" in out and not (tmp_path / "r").exists()


# ------------------------------------------------------------------------------------------ 15: translate average
def test_a_zero_padded_step_is_not_a_second_checkpoint_of_that_step(tmp_path):
    for name in ("checkpoint_6.pt", "checkpoint_06.pt", "checkpoint_8.pt", "checkpoint_\u0668.pt"):
        torch.save({}, tmp_path / name)
    assert [(step, path.name) for step, path in kept_averaged(tmp_path)] == [(6, "checkpoint_6.pt"),
                                                                             (8, "checkpoint_8.pt")]


# ------------------------------------------------------------------------------------------ 16: checkpoints.json
def _tiny() -> torch.nn.Module:
    from resmlp.models.resmlp import ResMLP, ResMLPConfig

    return ResMLP(ResMLPConfig(img_size=8, patch_size=4, in_chans=1, num_classes=2, dim=8, depth=1))


@pytest.mark.parametrize("entry", [{"score": 1.0, "file": "checkpoint-1.safetensors"},
                                   {"epoch": 1, "score": "90", "file": "checkpoint-1.safetensors"},
                                   {"epoch": 1, "score": float("nan"), "file": "checkpoint-1.safetensors"},
                                   {"epoch": True, "score": 1.0, "file": "checkpoint-1.safetensors"},
                                   {"epoch": 1, "score": 1.0, "file": "checkpoint-7.safetensors"}])
def test_a_checkpoint_history_entry_of_the_wrong_type_is_one_line(tmp_path, entry):
    # before: a KeyError or TypeError at the next epoch's write, in the middle of a run
    (tmp_path / history.INDEX).write_text(json.dumps({"keep": 2, "checkpoints": [entry]}))
    with pytest.raises(CheckpointError, match=r"checkpoints.json: entry 0 .* fix it or delete the file"):
        history.keep_best(tmp_path, 2, _tiny(), {}, 2, 50.0)


def test_a_nan_score_is_never_kept_and_the_history_stays_json(tmp_path):
    model = _tiny()
    history.keep_best(tmp_path, 2, model, {}, 1, 10.0)
    kept = history.keep_best(tmp_path, 2, model, {}, 2, math.nan)  # before: NaN written, then refused by JSON
    assert [e["epoch"] for e in kept] == [1] and history.kept_checkpoints(tmp_path) == kept


# ------------------------------------------------------------------------------------------ 19: leftovers
def test_gpu_report_merge_refuses_a_folder_an_out_file_and_a_part_without_its_numbers(tmp_path):
    (tmp_path / "folder").mkdir()
    _refused(_merge(tmp_path / "folder", out=tmp_path / "m"), "not a regular file")  # before: IsADirectoryError
    (tmp_path / "taken").write_text("keep me")
    _refused(_merge(SHIPPED, out=tmp_path / "taken"), "is not a folder")  # before: NotADirectoryError
    assert (tmp_path / "taken").read_text() == "keep me"
    report = json.loads(SHIPPED.read_text())
    cut = copy.deepcopy(report)
    del cut["parts"]["guard"]["results"]  # before: merged and shown as "guard: ok" with no rows
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    _refused(_merge(tmp_path / "cut.json", out=tmp_path / "m"), "report.parts.guard has exit 0 but no results")


def test_a_closed_stdout_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdout", None)  # what Python makes of `>&-`
    assert main(["models", "resmlp_s12", "--format", "csv"]) == 2  # before: TypeError from csv.writer
    _one_line(capsys, "standard output is closed")


def test_a_sacremoses_whose_tokenizer_returns_none_is_one_line(tmp_path, monkeypatch):
    from resmlp.seq2seq.scoring import tokenized_bleu

    fake = tmp_path / "site" / "sacremoses"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("class MosesTokenizer:\n    def __init__(self, lang):\n        pass\n"
                                      "    def tokenize(self, text, **options):\n        return None\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "sacremoses", raising=False)
    with pytest.raises(InstallError, match="returned NoneType, not text.*pip install --force-reinstall"):
        tokenized_bleu(["a b"], ["a b"])  # before: TypeError from compound_split

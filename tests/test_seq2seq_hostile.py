"""Hostile inputs to `resmlp translate`: corpora, tokenizers, checkpoints, run folders, flags, planted symlinks.

Each case is one line and exit 2 (no traceback), or the run does the right thing (no silent wrong result)."""

from __future__ import annotations

import json
import math
import os
import pickle
from pathlib import Path

import pytest
import torch
from num2words import num2words

from resmlp.cli import main
from resmlp.errors import CheckpointError, ConfigError, DataError
from resmlp.seq2seq import runfolder
from resmlp.seq2seq.data import UNK, Tokenizer, read_parallel
from resmlp.seq2seq.model import Seq2SeqConfig
from resmlp.seq2seq.runfolder import check_training_memory, read_translation_checkpoint


def _corpus(root: Path, offset: int = 0, lang: str = "fr") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, numbers in (("train", range(60)), ("valid", range(60, 66)), ("test", range(66, 72))):
        numbers = [n + offset for n in numbers]
        (root / f"{split}.en").write_text("".join(num2words(n) + "\n" for n in numbers), encoding="utf-8")
        (root / f"{split}.fr").write_text("".join(num2words(n, lang=lang) + "\n" for n in numbers), encoding="utf-8")
    return root


def _train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return ["translate", "train", "--data", str(data), "--src-suffix", "en", "--tgt-suffix", "fr", "--preset", "tiny",
            "--vocab-size", "80", "--max-tokens", "256", "--max-steps", "2", "--eval-every", "2", "--beam", "1",
            "--threads", "1", "--no-progress", "--output", str(out), *extra]


def _one_line_error(capsys, *words: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return _corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def run(corpus, tmp_path_factory) -> Path:
    """A finished two-step run, read by the cases that don't change it."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(_train_args(corpus, out)) == 0
    return out


def _copy_run(run: Path, to: Path) -> Path:
    to.mkdir()
    for name in ("checkpoint.pt", "tokenizer.model", "config.json"):
        (to / name).write_bytes((run / name).read_bytes())
    return to


# ------------------------------------------------------------------------------------------- M8 corpora
@pytest.mark.parametrize("separator", ["\x0c", "\u2028", "\x85", "\x0b", "\x1e", "\x1c", "\u2029"])
def test_line_separators_other_than_newline_stay_inside_their_pair(tmp_path, separator):
    # str.splitlines splits at each of these: one in the source's line 1 and one in the target's line 3 kept the
    # counts equal and shifted pairs 1-2 by one line, silently
    (tmp_path / "a.en").write_text(f"one{separator}x\ntwo\nthree\nfour\n", encoding="utf-8")
    (tmp_path / "a.fr").write_text(f"un\ndeux\ntrois{separator}y\nquatre\n", encoding="utf-8")
    src, tgt = read_parallel(tmp_path / "a.en", tmp_path / "a.fr")
    assert [s.split(separator)[0] for s in src] == ["one", "two", "three", "four"]
    assert [t.split(separator)[0] for t in tgt] == ["un", "deux", "trois", "quatre"]


def test_crlf_files_read_as_their_lines(tmp_path):
    (tmp_path / "a.en").write_bytes(b"one\r\ntwo\r\n")
    (tmp_path / "a.fr").write_bytes(b"un\ndeux")
    assert read_parallel(tmp_path / "a.en", tmp_path / "a.fr") == (["one", "two"], ["un", "deux"])


def test_an_empty_corpus_is_one_line(tmp_path, capsys):
    data = _corpus(tmp_path / "c")
    for side in ("en", "fr"):
        (data / f"train.{side}").write_bytes(b"")
    assert main(_train_args(data, tmp_path / "o")) == 2
    _one_line_error(capsys, "train.en is empty")


@pytest.mark.parametrize("damage", ["truncated", "random", "pickle", "empty"])
def test_a_damaged_tokenizer_is_a_data_error(run, tmp_path, capsys, damage):
    good = (run / "tokenizer.model").read_bytes()
    bad = {"truncated": good[: len(good) // 2], "random": os.urandom(len(good)),
           "pickle": pickle.dumps({"pieces": ["a"]}), "empty": b""}[damage]
    (tmp_path / "t.model").write_bytes(bad)
    with pytest.raises(DataError, match="t.model"):
        Tokenizer.load(tmp_path / "t.model")
    copy = _copy_run(run, tmp_path / "r")
    (copy / "tokenizer.model").write_bytes(bad)
    assert main(["translate", "eval", str(copy), "--beam", "1"]) == 2
    _one_line_error(capsys, "tokenizer.model")


def test_a_vocabulary_smaller_than_the_text_needs_is_one_line(tmp_path, capsys):
    assert main(_train_args(_corpus(tmp_path / "c"), tmp_path / "o", "--vocab-size", "8")) == 2
    _one_line_error(capsys, "--vocab-size 8")


# ------------------------------------------------------------------------------------------- M8/M3 checkpoints
def _edit_checkpoint(run: Path, to: Path, edit) -> Path:
    copy = _copy_run(run, to)
    ckpt = torch.load(copy / "checkpoint.pt", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, copy / "checkpoint.pt")
    return copy


def test_nan_weights_are_refused_by_decode_and_eval(run, corpus, tmp_path, capsys):
    def poison(ckpt):
        ckpt["model"]["src_embed.weight"][5, 0] = math.nan

    copy = _edit_checkpoint(run, tmp_path / "r", poison)
    assert main(["translate", "decode", str(copy), "--beam", "1", "--input", str(corpus / "test.en")]) == 2
    _one_line_error(capsys, "NaN")
    assert main(["translate", "eval", str(copy), "--beam", "1"]) == 2
    _one_line_error(capsys, "NaN")


@pytest.mark.parametrize("edit, words", [
    (lambda c: c.pop("model"), "no model"),
    (lambda c: c.update(step="10"), "'step' is a str"),
    (lambda c: c.update(step=2**70), "step="),
    (lambda c: c.update(extra=1), "unknown entry 'extra'"),
    (lambda c: c["model"].update({7: torch.zeros(1)}), "7"),
    (lambda c: c["model"].update({"src_embed.weight": torch.zeros(1).expand(80, 32)}), "src_embed.weight"),
    (lambda c: c["model"].update({"src_embed.weight": c["model"]["src_embed.weight"].long()}), "dtype"),
    (lambda c: c["model_config"].update(dim=8.0), "dim=8.0"),
    (lambda c: c["model_config"].update(max_len=10**9), "max_len"),
    (lambda c: c["model_config"].update(encoder_layers=100000), "encoder_layers"),
    (lambda c: c.update(model_config=[1, 2]), "model_config"),
], ids=["no-model", "step-str", "step-huge", "unknown-key", "int-key", "stride-0", "int-weights", "float-dim",
        "max-len-1e9", "100000-layers", "config-list"])
def test_malformed_checkpoints_are_refused_before_building(run, tmp_path, capsys, edit, words):
    copy = _edit_checkpoint(run, tmp_path / "r", edit)
    with pytest.raises(CheckpointError, match="checkpoint.pt"):
        read_translation_checkpoint(copy / "checkpoint.pt", for_resume=True)
    assert main(["translate", "eval", str(copy), "--beam", "1"]) == 2
    _one_line_error(capsys, words)


def test_a_checkpoint_claiming_a_huge_model_is_compared_on_the_meta_device(run, tmp_path, monkeypatch):
    """dim 4096, vocabulary 200000, max_len 4096 (each within LIMITS): 3 GB of weights if built; refused with
    every build on the meta device."""
    devices = []
    build = runfolder.build_translation_model

    def watched(config):
        model = build(config)
        devices.append(next(model.parameters()).device.type)
        return model

    monkeypatch.setattr(runfolder, "build_translation_model", watched)
    copy = _edit_checkpoint(run, tmp_path / "r", lambda c: c["model_config"].update(dim=4096, vocab_size=200_000,
                                                                                     max_len=4096, heads=8))
    with pytest.raises(CheckpointError, match="not the model its config describes"):
        read_translation_checkpoint(copy / "checkpoint.pt")
    assert devices == ["meta"]


def test_a_tokenizer_of_another_run_is_refused(run, tmp_path, capsys):
    copy = _copy_run(run, tmp_path / "r")
    other = Tokenizer.train([num2words(n, lang="de") for n in range(300)], 120)
    assert len(other) != len(Tokenizer.load(run / "tokenizer.model"))
    (copy / "tokenizer.model").write_bytes(other.model_bytes)
    assert main(["translate", "eval", str(copy), "--beam", "1"]) == 2
    _one_line_error(capsys, "different runs")


# ------------------------------------------------------------------------------------------- M9 config.json
@pytest.mark.parametrize("text, words", [
    ('{"output": "o", "data": "d", "colour": 1}', "unknown option 'colour'"),
    ("[1, 2]", "JSON object"),
    ('{"data": "d"}', "no `output`"),
    ("[" * 100_000 + "]" * 100_000, "nested"),
    ('{"output": "o", "data": "d", "model_overrides": {"dim": {"a": {"b": 1}}}}', "nested"),
    ('{"output": "o", "data": "d", "vocab_size": "many"}', "--vocab-size 'many'"),
    ('{"output": "o", "data": "d", "eval_every": 0}', "--eval-every 0"),
    ("{", "not valid JSON"),
], ids=["unknown-key", "list", "no-output", "deep", "deep-overrides", "str-vocab", "zero-eval-every", "broken"])
def test_a_malformed_config_json_is_one_line(run, tmp_path, capsys, text, words):
    copy = _copy_run(run, tmp_path / "r")
    (copy / "config.json").write_text(text)
    assert main(["translate", "eval", str(copy), "--beam", "1"]) == 2
    _one_line_error(capsys, "config.json", words)


# ------------------------------------------------------------------------------------------- M11 flags
@pytest.mark.parametrize("flag, value", [
    ("--eval-every", "0"), ("--vocab-size", "0"), ("--vocab-size", "-1"), ("--vocab-size", "4"), ("--max-len", "-5"),
    ("--heads", "0"), ("--label-smoothing", "2"), ("--dropout", "nan"), ("--layerscale-init", "nan"),
    ("--hidden", "0"), ("--encoder-layers", "0"), ("--encoder-layers", "100000"), ("--max-tokens", "0"),
    ("--max-steps", "0"), ("--max-minutes", "nan"), ("--lenpen", "nan"), ("--clip-norm", "nan"), ("--lr", "inf"),
    ("--seed", str(2**70)), ("--max-len", "1000000000"), ("--dim", "100000"), ("--warmup-steps", "-1"),
    ("--train-size", "0"), ("--device", "cudafoo"), ("--output", ""),
])
def test_every_translate_train_flag_is_range_checked_in_one_line(tmp_path, capsys, flag, value):
    args = ["translate", "train", "--task", "numbers-en-de", "--output", str(tmp_path / "o"), flag, value]
    assert main(args) == 2
    _one_line_error(capsys, flag)
    assert not (tmp_path / "o").exists()  # refused before anything is written


@pytest.mark.parametrize("action", ["eval", "decode"])
def test_decoding_flags_are_checked_by_eval_and_decode(run, capsys, action):
    assert main(["translate", action, str(run), "--lenpen", "nan"]) == 2
    _one_line_error(capsys, "--lenpen")


def test_translate_train_of_a_model_too_large_for_memory_writes_nothing(tmp_path, capsys):
    args = ["translate", "train", "--task", "numbers-en-de", "--output", str(tmp_path / "o"), "--dim", "16384",
            "--hidden", "65536", "--heads", "8", "--vocab-size", "1000000", "--encoder-layers", "50",
            "--decoder-layers", "50", "--no-progress"]  # 4.5 TB by the estimate: more than any host
    assert main(args) == 2
    _one_line_error(capsys, "GiB", "--max-tokens")
    assert not (tmp_path / "o").exists()


def test_a_model_too_large_for_memory_is_refused_before_it_is_built():
    config = Seq2SeqConfig(vocab_size=1_000_000, dim=16384, hidden=65536, encoder_layers=50, decoder_layers=50,
                           heads=8, max_len=4096)
    with pytest.raises(ConfigError, match="needs at least .* GiB"):
        check_training_memory(config, max_tokens=4096)


# ------------------------------------------------------------------------------------------- M9 resume
def test_resuming_a_finished_run_trains_no_more(corpus, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(_train_args(corpus, out)) == 0
    before = torch.load(out / "checkpoint.pt", weights_only=True)
    rows = (out / "log.csv").read_text()
    assert main(_train_args(corpus, out, "--resume")) == 0
    after = torch.load(out / "checkpoint.pt", weights_only=True)
    assert after["step"] == before["step"] == 2
    assert all(torch.equal(before["model"][k], after["model"][k]) for k in before["model"])
    assert (out / "log.csv").read_text() == rows
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
    capsys.readouterr()
    assert main(_train_args(corpus, out, "--resume", "--max-steps", "1")) == 2
    _one_line_error(capsys, "--max-steps 1", "not shorten")
    assert main(_train_args(corpus, out, "--resume", "--max-steps", "3")) == 0  # extended: one more step
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 3
    assert json.loads((out / "config.json").read_text())["max_steps"] == 3  # how to repeat the run


@pytest.mark.parametrize("flag, value", [("--optimizer", "adam"), ("--arch", "transformer"), ("--seed", "5"),
                                         ("--max-tokens", "100"), ("--vocab-size", "90"), ("--dim", "64"),
                                         ("--lr", "0.5"), ("--label-smoothing", "0.2")])
def test_a_resume_with_other_options_is_refused(run, tmp_path, capsys, flag, value):
    copy = _copy_run(run, tmp_path / "r")
    config = json.loads((copy / "config.json").read_text())
    before = (copy / "checkpoint.pt").read_bytes()
    assert main(_train_args(Path(config["data"]), copy, "--resume", flag, value)) == 2
    _one_line_error(capsys, flag, "other options")
    assert (copy / "checkpoint.pt").read_bytes() == before
    assert json.loads((copy / "config.json").read_text()) == config


@pytest.mark.parametrize("edit, words", [
    (lambda c: c["optimizer"]["param_groups"][0].update(initial_accumulator_value=1e30), "initial_accumulator_value"),
    (lambda c: c["optimizer"]["param_groups"][0].update(eps=math.nan), "eps"),
    (lambda c: c["optimizer"]["state"][0].update(sum=torch.zeros(3)), "shape"),
    (lambda c: c["optimizer"]["state"][0]["sum"].fill_(math.inf), "not finite"),
    (lambda c: c["scheduler"].update(last_epoch=7), "schedule at step 7"),
    (lambda c: c["scheduler"].update(base_lrs=[100.0]), "100.0"),
    (lambda c: c["optimizer"].update(param_groups=[]), "optimizer"),
    (lambda c: c.update(rng=torch.zeros(3, dtype=torch.uint8)), "state"),
], ids=["setting", "nan-eps", "state-shape", "state-inf", "schedule-step", "schedule-lr", "no-groups", "rng"])
def test_a_resume_restores_state_but_not_other_settings(run, tmp_path, capsys, edit, words):
    copy = _edit_checkpoint(run, tmp_path / "r", edit)
    before = (copy / "checkpoint.pt").read_bytes()
    config = json.loads((copy / "config.json").read_text())
    assert main(_train_args(Path(config["data"]), copy, "--resume", "--max-steps", "3")) == 2
    _one_line_error(capsys, "does not fit this run", words)
    assert (copy / "checkpoint.pt").read_bytes() == before


def test_resume_without_a_checkpoint_is_one_line(corpus, tmp_path, capsys):
    assert main(_train_args(corpus, tmp_path / "o", "--resume")) == 2
    _one_line_error(capsys, "nothing to resume")


def test_a_new_run_owns_its_folder(run, tmp_path):
    """A run killed before its first checkpoint left its tokenizer and config.json (and a temporary); a new run on
    other data in that folder trains its own tokenizer and writes its own config, log and corpus."""
    out = _copy_run(run, tmp_path / "o")
    (out / "checkpoint.pt").unlink()
    (out / "log.csv").write_text("step,epoch\n999,0\n")
    (out / ".checkpoint.pt.abcd1234.tmp").write_bytes(b"half a checkpoint")
    other = _corpus(tmp_path / "other", offset=500, lang="de")
    assert main(_train_args(other, out)) == 0
    assert (out / "tokenizer.model").read_bytes() != (run / "tokenizer.model").read_bytes()
    assert UNK not in Tokenizer.load(out / "tokenizer.model").encode(["fünfhundert"], 10)[0]  # learnt from `other`
    assert json.loads((out / "config.json").read_text())["data"] == str(other)
    assert "999" not in (out / "log.csv").read_text()
    assert not list(out.glob(".*.tmp"))


# ------------------------------------------------------------------------------------------- M10 planted symlinks
def test_a_symlink_planted_at_log_csv_is_not_written_through(corpus, tmp_path):
    out, victim = tmp_path / "o", tmp_path / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / "log.csv").symlink_to(victim)
    assert main(_train_args(corpus, out)) == 0
    assert victim.read_text() == "precious\n"
    assert not (out / "log.csv").is_symlink() and "train_loss" in (out / "log.csv").read_text()


def test_a_symlink_at_log_csv_is_refused_on_resume(run, tmp_path, capsys):
    copy = _copy_run(run, tmp_path / "r")
    (tmp_path / "victim.txt").write_text("precious\n")
    (copy / "log.csv").symlink_to(tmp_path / "victim.txt")
    config = json.loads((copy / "config.json").read_text())
    assert main(_train_args(Path(config["data"]), copy, "--resume", "--max-steps", "3")) == 2
    _one_line_error(capsys, "log.csv")
    assert (tmp_path / "victim.txt").read_text() == "precious\n"


def test_a_fifo_or_huge_log_csv_is_refused_on_resume_without_hanging(run, tmp_path, capsys):
    copy = _copy_run(run, tmp_path / "r")
    config = json.loads((copy / "config.json").read_text())
    os.mkfifo(copy / "log.csv")
    assert main(_train_args(Path(config["data"]), copy, "--resume", "--max-steps", "3")) == 2
    _one_line_error(capsys, "not a regular file")
    (copy / "log.csv").unlink()
    with open(copy / "log.csv", "wb") as f:
        f.truncate(runfolder.LOG_MAX_BYTES + 1)  # sparse: no disk used
    assert main(_train_args(Path(config["data"]), copy, "--resume", "--max-steps", "3")) == 2
    _one_line_error(capsys, "MiB")


def test_a_symlink_planted_at_data_receives_no_corpus(tmp_path, capsys):
    out, elsewhere = tmp_path / "o", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "data").symlink_to(elsewhere)
    assert main(["translate", "train", "--task", "numbers-en-de", "--train-size", "100", "--output", str(out),
                 "--preset", "tiny", "--max-steps", "1", "--no-progress"]) == 2
    _one_line_error(capsys, "symlink")
    assert not list(elsewhere.iterdir())

"""`resmlp translate train --resume` means the run's options (issue 44, T7).

Before: with `--output RUN --resume` alone (no --task/--data), every option flag given was dropped without a
word and the run went on with its config.json's values. Now a flag left out keeps the run's value, and a flag
given must agree with it, or the resume is refused in one line naming the flag, the old and the new value.
One case per flag of the parser: a flag added later fails `test_every_train_flag_has_a_resume_case` until it
gets its case here."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from test_seq2seq_hostile import _copy_run, _corpus, _one_line_error, _train_args

from resmlp.cli import build_parser, main

# flag -> a value other than the fixture run's, and the words the refusal must hold (flag, old value, new value)
DIFFERENT: dict[str, tuple[list[str], tuple[str, ...]]] = {
    "--task": (["numbers-en-de"], ("--task was None", "'numbers-en-de'")),
    "--recipe": (["wmt14-en-de"], ("--preset was 'tiny', now 'base6'", "--vocab-size was 80, now 32000")),
    "--src-suffix": (["de"], ("--src-suffix was 'en', now 'de'",)),
    "--tgt-suffix": (["de"], ("--tgt-suffix was 'fr', now 'de'",)),
    "--train-size": (["7"], ("--train-size was 50000, now 7",)),
    "--arch": (["transformer"], ("--arch was 'resmlp', now 'transformer'",)),
    "--preset": (["small"], ("--preset was 'tiny', now 'small'",)),
    "--dim": (["64"], ("--dim was 32, now 64",)),
    "--hidden": (["32"], ("--hidden was 64, now 32",)),
    "--encoder-layers": (["3"], ("--encoder-layers was 2, now 3",)),
    "--decoder-layers": (["1"], ("--decoder-layers was 2, now 1",)),
    "--heads": (["4"], ("--heads was 2, now 4",)),
    "--max-len": (["20"], ("--max-len was 16, now 20",)),
    "--dropout": (["0.3"], ("--dropout was 0.1, now 0.3",)),
    "--layerscale-init": (["0.5"], ("--layerscale-init was 0.2, now 0.5",)),
    "--positions": (["none"], ("--positions was 'sinusoidal', now 'none'",)),
    "--vocab-size": (["90"], ("--vocab-size was 80, now 90",)),
    "--optimizer": (["adam"], ("--optimizer was 'adagrad', now 'adam'",)),
    "--lr": (["0.5"], ("--lr was 0.2, now 0.5",)),
    "--warmup-steps": (["7"], ("--warmup-steps was 500, now 7",)),
    "--max-tokens": (["100"], ("--max-tokens was 256, now 100",)),
    "--label-smoothing": (["0.2"], ("--label-smoothing was 0.1, now 0.2",)),
    "--clip-norm": (["1.0"], ("--clip-norm was 0.0, now 1.0",)),
    "--precision": (["bf16"], ("--precision was 'fp32', now 'bf16'",)),
    "--seed": (["5"], ("--seed was 0, now 5",)),
    # the batch of an update and the checkpoints averaged: not a resume's to change (docs/translation.md)
    "--update-freq": (["2"], ("--update-freq was 1, now 2",)),
    "--average-last": (["3"], ("--average-last was 1, now 3",)),
    "--activation": (["relu"], ("--activation was 'gelu', now 'relu'",)),
    "--attention-dropout": (["0.2"], ("--attention-dropout was 0.0, now 0.2",)),
    "--activation-dropout": (["0.2"], ("--activation-dropout was 0.0, now 0.2",)),
}
# what a resume may change (seq2seq.config.RESUMABLE_CHANGES), and --output/--resume themselves
MAY_CHANGE = {"--output", "--resume", "--data", "--max-steps", "--max-minutes", "--eval-every", "--beam", "--lenpen",
              "--device", "--threads", "--no-progress", "--test-decode-limit"}


def _train_parser() -> argparse.ArgumentParser:
    def sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]

    return sub(sub(build_parser(), "translate"), "train")


def test_every_train_flag_has_a_resume_case():
    flags = {a.option_strings[-1] for a in _train_parser()._actions if a.option_strings and a.dest != "help"}
    assert flags - MAY_CHANGE == set(DIFFERENT), "each option of translate train needs its resume case here"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("resume")
    out = root / "run"
    assert main(_train_args(_corpus(root / "corpus"), out)) == 0
    return out


@pytest.mark.parametrize("flag", sorted(DIFFERENT))
def test_a_resume_of_the_output_alone_refuses_each_other_option(run, tmp_path, capsys, flag):
    copy = _copy_run(run, tmp_path / "r")
    before = {name: (copy / name).read_bytes() for name in ("checkpoint.pt", "config.json")}
    value, words = DIFFERENT[flag]
    # before: exit 0, the flag dropped without a word
    assert main(["translate", "train", "--output", str(copy), "--resume", "--max-steps", "3", "--no-progress",
                 flag, *value]) == 2
    _one_line_error(capsys, "other options", *words)
    assert {name: (copy / name).read_bytes() for name in before} == before


def test_a_resume_keeps_the_runs_options_and_accepts_them_given_again(run, tmp_path, capsys):
    copy = _copy_run(run, tmp_path / "r")
    config = json.loads((copy / "config.json").read_text())
    # given again at the run's values, defaults included (--seed 0, --optimizer adagrad), is no change
    assert main(["translate", "train", "--output", str(copy), "--resume", "--max-steps", "3", "--seed", "0",
                 "--optimizer", "adagrad", "--dim", "32", "--vocab-size", "80", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3
    after = json.loads((copy / "config.json").read_text())
    changed = {"max_steps", "output", "model_overrides"}  # overrides: {"dim": 32} now, the preset's dim
    assert {k: v for k, v in after.items() if k not in changed} == {k: v for k, v in config.items()
                                                                   if k not in changed}


def test_a_resume_with_the_corpus_given_again_takes_the_other_options_from_the_run(run, tmp_path, capsys):
    # before: --data given again made every flag left out its default (here --max-tokens 4096, --vocab-size
    # 1000...): refused as "other options" the user never gave
    copy = _copy_run(run, tmp_path / "r")
    data = json.loads((copy / "config.json").read_text())["data"]
    assert main(["translate", "train", "--output", str(copy), "--resume", "--data", data, "--src-suffix", "en",
                 "--tgt-suffix", "fr", "--max-steps", "3", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 3


def test_a_resume_without_a_run_config_says_what_is_missing(tmp_path, capsys):
    assert main(["translate", "train", "--output", str(tmp_path / "none"), "--resume"]) == 2
    _one_line_error(capsys, "--task", "config.json")

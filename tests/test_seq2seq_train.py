"""`resmlp translate train|eval|decode` end to end on a tiny corpus (single process), and the scores."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hostspeed import limit
from num2words import num2words

from resmlp.cli import main
from resmlp.runtime import DistInfo
from resmlp.seq2seq import train as seq2seq_train
from resmlp.seq2seq.train import TranslationConfig, load_trained, scores, train_translation


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    splits = {"train": range(0, 400), "valid": range(400, 420), "test": range(420, 440)}
    for split, numbers in splits.items():
        (root / f"{split}.en").write_text("".join(num2words(n) + "\n" for n in numbers), encoding="utf-8")
        (root / f"{split}.fr").write_text("".join(num2words(n, lang="fr") + "\n" for n in numbers),
                                          encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "run"
    args = ["translate", "train", "--data", str(corpus), "--src-suffix", "en", "--tgt-suffix", "fr",
            "--preset", "tiny", "--max-len", "24", "--vocab-size", "150", "--max-tokens", "512",
            "--optimizer", "adam", "--lr", "3e-3", "--warmup-steps", "5", "--max-steps", "16",
            "--eval-every", "8", "--beam", "1", "--output", str(out)]
    assert main(args) == 0
    return out, args


def test_train_writes_summary_checkpoint_tokenizer_and_log(trained):
    out, _ = trained
    summary = json.loads((out / "summary.json").read_text())
    for key in ("bleu", "chrf", "exact_match", "wall_seconds", "tokenized_bleu", "params", "steps"):
        assert key in summary
    assert summary["steps"] == 16 and summary["sentences"] == 20
    assert (out / "tokenizer.model").stat().st_size > 0
    rows = [r for r in csv.DictReader((out / "log.csv").read_text().splitlines()) if r["valid_loss"]]
    assert [int(r["step"]) for r in rows] == [8, 16]
    assert float(rows[1]["valid_loss"]) < float(rows[0]["valid_loss"])  # it learns
    model, tok, ckpt = load_trained(out)
    assert ckpt["step"] == 16 and model.config.max_len == 24 and len(tok) == model.config.vocab_size


def test_existing_run_needs_resume_then_continues(trained, capsys):
    out, args = trained
    assert main(args) == 2
    assert "--resume" in capsys.readouterr().err
    more = [a if a != "16" else "20" for a in args] + ["--resume"]
    assert main(more) == 0
    assert json.loads((out / "summary.json").read_text())["steps"] == 20


def test_eval_and_decode_commands(trained, corpus, capsys, monkeypatch):
    out, _ = trained
    assert main(["translate", "eval", str(out), "--beam", "2", "--src", str(corpus / "valid.en"),
                 "--ref", str(corpus / "valid.fr")]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 0.0 <= result["exact_match"] <= 100.0 and "chrf" in result
    monkeypatch.setattr("sys.stdin", io.StringIO("three hundred\n\nfive\n"))
    assert main(["translate", "decode", str(out / "checkpoint.pt"), "--beam", "2"]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert len(lines) == 4 and lines[1] == ""  # the empty input line stays an empty output line


def test_eval_of_a_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["translate", "eval", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_scores_exact_match_and_labelled_tokenized_bleu():
    refs = ["deux cent mille trois cent un", "neuf cent mille quatre cent deux"]
    perfect = scores(refs, refs)
    assert perfect["exact_match"] == 100.0 and perfect["bleu"] == pytest.approx(100.0)
    half = scores([refs[0], "neuf cent mille quatre cent trois"], refs)
    assert half["exact_match"] == 50.0 and half["chrf"] < 100.0 and half["bleu"] < 100.0
    # compound splitting ("quarante ##AT##-##AT## deux") gives partial credit inside hyphenated words
    hyp, ref = ["mille cent quarante-trois"], ["mille cent quarante-deux"]
    assert scores(hyp, ref)["tokenized_bleu"] > scores(hyp, ref)["bleu"]


def test_torchrun_ddp_two_gloo_processes(corpus, tmp_path):
    out = tmp_path / "ddp"
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--nproc_per_node", "2", "-m", "resmlp", "translate", "train", "--data", str(corpus),
           "--src-suffix", "en", "--tgt-suffix", "fr", "--preset", "tiny", "--max-len", "24",
           "--vocab-size", "150", "--max-tokens", "512", "--optimizer", "adam", "--lr", "3e-3",
           "--warmup-steps", "5", "--max-steps", "6", "--eval-every", "3", "--beam", "1", "--output", str(out),
           "--device", "cpu"]  # gloo on the CPU, whether or not a GPU is visible
    subprocess.run(cmd, check=True, capture_output=True, timeout=limit(300))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and "exact_match" in summary
    rows = [r for r in csv.DictReader((out / "log.csv").read_text().splitlines()) if r["valid_loss"]]
    assert [int(r["step"]) for r in rows] == [3, 6]  # rank 0 alone writes the log


def _tiny_config(corpus, out, **kw) -> TranslationConfig:
    return TranslationConfig(output=str(out), data=str(corpus), src_suffix="en", tgt_suffix="fr", preset="tiny",
                             model_overrides={"max_len": 24}, vocab_size=150, max_tokens=512, optimizer="adam",
                             lr=3e-3, warmup_steps=2, max_steps=2, eval_every=2, beam=1, progress=False, **kw)


def _record_devices(monkeypatch, info: DistInfo | None = None) -> list[set[torch.device]]:
    """Every forward of the trained model records the devices of its parameters and inputs; with `info`,
    the run's DistInfo is that one."""
    seen: list[set[torch.device]] = []
    build = seq2seq_train.build_translation_model

    def build_and_watch(cfg):
        model = build(cfg)

        def hook(module, inputs):
            seen.append({p.device for p in module.parameters()} | {x.device for x in inputs})

        model.register_forward_pre_hook(hook)
        return model

    monkeypatch.setattr(seq2seq_train, "build_translation_model", build_and_watch)
    if info is not None:
        monkeypatch.setattr(seq2seq_train, "init_distributed", lambda device_name: info)
    return seen


def test_trainer_puts_model_and_batches_on_the_device_of_its_dist_info(corpus, tmp_path, monkeypatch):
    info = DistInfo(world_size=1, rank=0, local_rank=0, device=torch.device("cpu"))
    seen = _record_devices(monkeypatch, info)
    summary = train_translation(_tiny_config(corpus, tmp_path / "run"))
    assert summary["steps"] == 2 and summary["device"] == "cpu"
    assert len(seen) >= 3  # two training steps and the validation batches
    assert all(devices == {info.device} for devices in seen)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_training_runs_on_the_gpu(corpus, tmp_path, monkeypatch, precision):
    seen = _record_devices(monkeypatch)
    summary = train_translation(_tiny_config(corpus, tmp_path / "run", device="auto", precision=precision))
    gpu = torch.device("cuda", torch.cuda.current_device())
    assert summary["steps"] == 2 and summary["device"] == str(gpu)
    assert seen and all(devices == {gpu} for devices in seen)
    model, _, _ = load_trained(tmp_path / "run", device=gpu)
    assert {p.device for p in model.parameters()} == {gpu}


@pytest.mark.parametrize("action", ["decode", "eval"])
def test_a_beam_outside_1_to_64_is_one_line_and_exit_2(trained, capsys, action):
    out, _ = trained
    for beam in ("0", "65"):
        assert main(["translate", action, str(out), "--beam", beam]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "from 1 to 64" in err


def test_a_run_prints_its_budget_in_updates_and_epochs_of_its_corpus(corpus, tmp_path, capsys, monkeypatch):
    """Issue 49: the warm-up and the run in epochs of the corpus the trainer batches (counted from its own
    batches here, not from the budget's formula)."""
    batched = []
    token_batches = seq2seq_train.token_batches
    monkeypatch.setattr(seq2seq_train, "token_batches", lambda *a, **k: batched.append(token_batches(*a, **k))
                        or batched[-1])
    import dataclasses

    train_translation(dataclasses.replace(_tiny_config(corpus, tmp_path / "run"), warmup_steps=3, max_steps=4))
    per_epoch = len(batched[0])  # one process, --update-freq 1: an update per batch
    budget = [line for line in capsys.readouterr().err.splitlines() if line.startswith("budget: ")]
    assert budget == [f"budget: 512 tokens per update at most (512 per batch x 1 batches (--update-freq) x 1 "
                      f"processes); this corpus (400 pairs, {budget[0].split(' pairs, ')[1].split(' tokens')[0]} "
                      f"tokens) is {per_epoch} updates an epoch; warm-up 3 updates = {3 / per_epoch:.2f} epochs; "
                      f"run 4 updates (--max-steps) = {4 / per_epoch:.2f} epochs, unless --max-minutes 20 ends it "
                      "first"]


def test_the_final_test_decoding_shows_progress_like_training(corpus, tmp_path, capsys):
    import dataclasses

    train_translation(dataclasses.replace(_tiny_config(corpus, tmp_path / "run"), progress=True))
    err = capsys.readouterr().err
    # the 20 test sentences decoded under a bar: plain lines here, where stderr is no terminal
    assert "train: 1/2 step" in err and "translate: 1/1 batch (100%)" in err and "\r" not in err
    train_translation(_tiny_config(corpus, tmp_path / "quiet"))
    assert "translate" not in capsys.readouterr().err

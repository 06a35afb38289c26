"""Progress bars on a terminal, plain log lines elsewhere (a redirected stderr, a cluster job's log)."""

from __future__ import annotations

import csv
import io
import json

from tqdm import tqdm

from resmlp.cli import main
from resmlp.progress import LineProgress, progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_bar_and_a_file_gets_lines():
    assert isinstance(progress_bar(total=3, file=Terminal()), tqdm)
    log = io.StringIO()
    bar = progress_bar(total=4, desc="epoch 1/2", unit="step", file=log, min_interval_s=3600)
    assert isinstance(bar, LineProgress)
    bar.update(1)
    bar.set_postfix(loss="0.5000", lr="1.00e-03")  # the first numbers: a line at once
    bar.update(1)
    bar.set_postfix(loss="0.4000")  # within the interval: none
    bar.update(2)
    bar.close()  # the end: a last line
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2
    assert lines[0].startswith("epoch 1/2: 1/4 step (25%), loss 0.5000, lr 1.00e-03, ")
    assert lines[1].startswith("epoch 1/2: 4/4 step (100%), loss 0.4000, ")


def test_an_iterable_gives_a_line_at_its_first_item_and_at_its_end():
    log = io.StringIO()
    assert list(progress_bar(range(5), desc="eval", unit="batch", total=5, file=log)) == list(range(5))
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == ["eval: 1/5 batch (20%)",
                                                                           "eval: 5/5 batch (100%)"]


def test_a_redirected_training_run_logs_plain_lines_at_the_read_interval(tmp_path, capsys):
    sets = {"data.kind": "synthetic", "data.synthetic_size": [64, 16], "data.num_workers": 0, "model.img_size": 16,
            "model.patch_size": 8, "model.dim": 16, "model.depth": 1, "schedule.epochs": 2,
            "schedule.warmup_epochs": 0, "train.batch_size": 8, "train.threads": 1, "train.compile": False,
            "train.log_every_steps": 3}
    args = ["train", "--output", str(tmp_path / "run")] + [f"--set={k}={json.dumps(v)}" for k, v in sets.items()]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    steps = [line.split(",")[0] for line in err.splitlines() if line.startswith("epoch ")]
    # every third step's read (as log_every_steps says), and each epoch's last step
    assert steps == [f"epoch {e}/2: {n}/8 step ({100 * n / 8:.0f}%)" for e in (1, 2) for n in (3, 6, 8)]


def test_translate_train_logs_its_first_step(tmp_path):
    from test_seq2seq_train import _tiny_config

    from resmlp.seq2seq.train import train_translation

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "valid", "test"):
        (corpus / f"{split}.en").write_text("one\ntwo\nthree\nfour\n")
        (corpus / f"{split}.fr").write_text("un\ndeux\ntrois\nquatre\n")
    import dataclasses

    cfg = dataclasses.replace(_tiny_config(corpus, tmp_path / "run"), max_steps=3, eval_every=50, log_every=50)
    train_translation(cfg)
    rows = list(csv.DictReader((tmp_path / "run" / "log.csv").read_text().splitlines()))
    assert [int(r["step"]) for r in rows] == [1, 3]


def test_a_phase_change_gives_a_line_as_the_benchmark_names_its_steps():
    log = io.StringIO()
    with progress_bar(total=4, unit="step", file=log, min_interval_s=0) as bar:
        bar.set_description_str("memory resmlp_s12", refresh=False)
        bar.update()
        bar.set_description_str("build resmlp_s12", refresh=False)
        bar.update(3)
    assert [line.split(",")[0] for line in log.getvalue().splitlines()] == [
        "memory resmlp_s12: 0/4 step (0%)", "build resmlp_s12: 1/4 step (25%)", "build resmlp_s12: 4/4 step (100%)"]

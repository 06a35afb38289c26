"""Hostile translation text (issue 44, T8): lone carriage returns, invisible-only lines, byte order marks.

Before: a corpus with old-Mac line ends ("\\r" only) was read as one sentence (a 3-sentence test set scored as
1), a line of only U+200B or U+FEFF passed the empty-line check, and a BOM stayed in the first reference of
`translate eval --ref` (and in the first source of every file)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from test_seq2seq_hostile import _corpus, _one_line_error, _train_args

from resmlp.cli import main
from resmlp.errors import DataError
from resmlp.seq2seq.data import read_parallel


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("text")
    out = root / "run"
    assert main(_train_args(_corpus(root / "corpus"), out)) == 0
    return out


def _pair(tmp_path: Path, src: bytes, tgt: bytes) -> tuple[Path, Path]:
    (tmp_path / "a.en").write_bytes(src)
    (tmp_path / "a.fr").write_bytes(tgt)
    return tmp_path / "a.en", tmp_path / "a.fr"


# ------------------------------------------------------------------------------------------- lone "\r"
@pytest.mark.parametrize("src, line", [(b"one\rtwo\rthree\r", 1), (b"one\ntwo\rx\nthree\n", 2)],
                         ids=["old-mac", "stray"])
def test_a_lone_carriage_return_is_refused_naming_the_line(tmp_path, src, line):
    with pytest.raises(DataError, match=rf"a\.en line {line} holds a carriage return.*tr '\\r' '\\n' <"):
        read_parallel(*_pair(tmp_path, src, b"un\ndeux\ntrois\n"))


def test_eval_of_an_old_mac_test_set_is_refused_not_scored_as_one_sentence(run, tmp_path, capsys):
    src, ref = _pair(tmp_path, b"one\rtwo\rthree\r", b"un\rdeux\rtrois\r")
    assert main(["translate", "eval", str(run), "--beam", "1", "--src", str(src), "--ref", str(ref)]) == 2
    _one_line_error(capsys, "a.en line 1", "carriage return")


def test_the_printed_conversion_makes_a_corpus_that_reads(tmp_path):
    import subprocess

    src, _ = _pair(tmp_path, b"one\rtwo\rthree\r", b"un\ndeux\ntrois\n")
    with pytest.raises(DataError) as refusal:
        read_parallel(src, tmp_path / "a.fr")
    command = str(refusal.value).split("convert it: ")[1].rstrip(")")
    subprocess.run(command, shell=True, check=True, cwd=tmp_path)
    assert read_parallel(f"{src}.lf", tmp_path / "a.fr")[0] == ["one", "two", "three"]


def test_decode_refuses_a_lone_carriage_return_on_stdin(run, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\rtwo\n"))
    assert main(["translate", "decode", str(run), "--beam", "1", "--no-progress"]) == 2
    _one_line_error(capsys, "stdin line 1", "carriage return")


# ------------------------------------------------------------------------------------------- invisible lines
@pytest.mark.parametrize("line", ["\u200b", "\ufeff", "\u2060", "\u00ad", "\u200c\u200d", "\u3164", " \u200b\t",
                                  "\u2028"])
def test_a_line_of_only_invisible_characters_is_an_empty_line(tmp_path, line):
    paths = _pair(tmp_path, f"one\n{line}\nthree\n".encode(), b"un\ndeux\ntrois\n")
    with pytest.raises(ValueError, match=r"1 empty line\(s\) .* \(line 2\)"):
        read_parallel(*paths)


@pytest.mark.parametrize("line", ["a\u200bb", "\u00e9", "\u0301", "x"])
def test_a_line_with_a_visible_character_is_not_empty(tmp_path, line):
    paths = _pair(tmp_path, f"one\n{line}\n".encode(), b"un\ndeux\n")
    assert read_parallel(*paths)[0] == ["one", line]


def test_decode_gives_an_invisible_line_an_empty_translation_without_the_model(run, capsys, monkeypatch):
    from resmlp.seq2seq.data import Tokenizer

    seen = []
    encode = Tokenizer.encode
    monkeypatch.setattr(Tokenizer, "encode", lambda self, lines, *a, **k: seen.extend(lines) or encode(self, lines,
                                                                                                        *a, **k))
    monkeypatch.setattr(sys, "stdin", io.StringIO("one\n\u200b\u200b\ntwo\n"))
    assert main(["translate", "decode", str(run), "--beam", "1", "--no-progress"]) == 0
    assert capsys.readouterr().out.split("\n")[1] == ""
    assert seen == ["one", "two"]


# ------------------------------------------------------------------------------------------- byte order marks
def test_a_bom_is_dropped_from_sources_and_targets(tmp_path):
    paths = _pair(tmp_path, "\ufeffone\ntwo\n".encode(), "\ufeffun\r\ndeux\r\n".encode())
    assert read_parallel(*paths) == (["one", "two"], ["un", "deux"])


def test_eval_reads_the_bom_free_reference(run, tmp_path, monkeypatch):
    # the scores' own inputs: the first reference reaches sacrebleu without the BOM
    import resmlp.seq2seq.train as seq2seq_train

    seen = {}
    real = seq2seq_train.scores
    monkeypatch.setattr(seq2seq_train, "scores", lambda hyps, refs, *a, **k: seen.update(refs=refs) or real(hyps, refs,
                                                                                                            *a, **k))
    _pair(tmp_path, "\ufeffone\ntwo\n".encode(), "\ufeffun\ndeux\n".encode())
    assert main(["translate", "eval", str(run), "--beam", "1", "--no-progress", "--src", str(tmp_path / "a.en"),
                 "--ref", str(tmp_path / "a.fr")]) == 0
    assert seen["refs"] == ["un", "deux"]


def test_decode_drops_a_bom_on_stdin(run, capsys, monkeypatch):
    from resmlp.seq2seq.data import Tokenizer

    seen = []
    encode = Tokenizer.encode
    monkeypatch.setattr(Tokenizer, "encode", lambda self, lines, *a, **k: seen.extend(lines) or encode(self, lines,
                                                                                                        *a, **k))
    monkeypatch.setattr(sys, "stdin", io.StringIO("\ufeffone\n"))
    assert main(["translate", "decode", str(run), "--beam", "1", "--no-progress"]) == 0
    assert seen == ["one"]


# ------------------------------------------------------------------------------------------- broken sacremoses
@pytest.mark.parametrize("failure", ["raise RuntimeError('boom')", "raise SyntaxError('invalid syntax')",
                                     "import resmlp_no_such_dependency", "MosesTokenizer = None"])
def test_a_broken_sacremoses_install_is_one_line_before_any_work(run, tmp_path, capsys, monkeypatch, failure):
    # before: a traceback, or (a missing dependency) the scores silently switched to the 13a tokenizer
    fake = tmp_path / "site" / "sacremoses"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(failure + "\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "sacremoses", raising=False)
    assert main(["translate", "eval", str(run), "--beam", "1", "--no-progress"]) == 2
    _one_line_error(capsys, "sacremoses", "is installed but fails to load", "pip install --force-reinstall sacremoses")
    monkeypatch.delitem(sys.modules, "sacremoses", raising=False)
    data = Path(json.loads((run / "config.json").read_text())["data"])
    assert main(_train_args(data, tmp_path / "new")) == 2
    _one_line_error(capsys, "sacremoses")
    assert not (tmp_path / "new").exists()


def test_without_sacremoses_the_scores_say_so(run, capsys, monkeypatch):
    from resmlp.seq2seq.scoring import MISSING_MOSES

    monkeypatch.setitem(sys.modules, "sacremoses", None)  # import raises ModuleNotFoundError: not installed
    assert main(["translate", "eval", str(run), "--beam", "1", "--no-progress"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["tokenized_bleu"] is None and result["tokenized_bleu_tokens"] == MISSING_MOSES

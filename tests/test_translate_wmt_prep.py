"""The WMT preparation of docs/translation.md, run as the document shows it (issue 44, T9).

Before: `paste corpus.en corpus.de | awk ... | cut` paired corpora of different lengths without a word: a line
missing on one side shifted every later pair, the empty-side filter dropped the tail, and the training's own
line-count check never saw it (both train files had the same count). The block now compares the counts first
and writes nothing when they differ."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hostspeed import limit

DOC = Path(__file__).resolve().parents[1] / "docs" / "translation.md"
pytestmark = pytest.mark.skipif(not all(shutil.which(t) for t in ("bash", "paste", "awk", "cut", "wc")),
                                reason="needs bash and the coreutils the document uses")


def _pairing_block() -> str:
    """The bash block of the document that pairs corpus.en with corpus.de."""
    blocks = re.findall(r"^```bash\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)
    found = [b for b in blocks if "paste corpus.en corpus.de" in b]
    assert len(found) == 1, "docs/translation.md should pair the training corpora in one bash block"
    return found[0]


def _run(tmp_path: Path, en: list[str], de: list[str]) -> subprocess.CompletedProcess:
    (tmp_path / "DIR").mkdir()
    (tmp_path / "corpus.en").write_text("".join(line + "\n" for line in en), encoding="utf-8")
    (tmp_path / "corpus.de").write_text("".join(line + "\n" for line in de), encoding="utf-8")
    return subprocess.run(["bash", "-c", _pairing_block()], cwd=tmp_path, capture_output=True, text=True,
                          timeout=limit(60))


def test_aligned_corpora_are_paired_without_their_empty_or_tabbed_pairs(tmp_path):
    done = _run(tmp_path, ["one", "", "three", "four\tfive", "six"], ["eins", "zwei", "drei", "vier", "sechs"])
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "DIR" / "train.en").read_text().split("\n") == ["one", "three", "six", ""]
    assert (tmp_path / "DIR" / "train.de").read_text().split("\n") == ["eins", "drei", "sechs", ""]


@pytest.mark.parametrize("missing", [0, 4, 9])
def test_corpora_of_different_lengths_are_refused_and_nothing_is_written(tmp_path, missing):
    en = [f"sentence {i}" for i in range(10)]
    de = [f"Satz {i}" for i in range(10) if i != missing]  # one line lost on the German side
    done = _run(tmp_path, en, de)
    assert done.returncode != 0
    assert "corpus.en has 10 lines, corpus.de 9" in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["DIR", "corpus.de", "corpus.en"]

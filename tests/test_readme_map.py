"""The README is a map: under 200 lines, the two set-up commands first, one current figure per row with its
command, host and date, no row saying who measured it (the history lives in docs/benchmarks.md)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_is_a_short_map_with_dated_current_figures():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) < 200
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    assert blocks[:2] == ["bash .ci/setup && .venv/bin/resmlp train --recipe fashion-mnist-quick --output "
                          "runs/quickstart\n", "bash .ci/setup && .venv/bin/python -m pytest -q\n"]
    for heading in ("## What is in it", "## Interoperability: what loads where", "## Measured results"):
        assert heading in text
    results = text.split("## Measured results", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in results.splitlines() if line.startswith("| ") and not line.startswith("| what")]
    assert len(rows) >= 10
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 5 and re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[4]), row  # a date, not a session
        assert "`" in cells[2] or "command" in cells[2], row  # the command that measures it
    assert not re.search(r"\bsession", text, re.I)
    assert (ROOT / "docs" / "benchmarks.md").is_file() and "docs/benchmarks.md" in results

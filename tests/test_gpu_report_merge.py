"""`benchmarks/gpu_report.py --merge` reads what it merges as untrusted and writes only through the atomic
writer (issue 44, T12).

Before: it wrote OUT/gpu_report.json.tmp and .md.tmp by name, so a symlink or hard link planted there had its
target outside OUT overwritten; a report with records of the wrong type or range gave a traceback (or wrote
NaN and impossible numbers into the report); a FIFO hung it; /dev/zero read until memory ran out; a part in
two reports was silently replaced by the second."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import hostspeed
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_report.py"
SHIPPED = ROOT / "docs" / "gpu" / "report-2026-11-25.json"  # a real report of the H100 run


def _merge(*paths: Path, out: Path, memory_mib: int = 1024) -> subprocess.CompletedProcess:
    """The script in a subprocess with an address-space limit and a timeout: the old code hung on a FIFO and
    read /dev/zero until memory ran out."""
    limit = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({memory_mib << 20}, {memory_mib << 20}))"
    code = f"{limit}; import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    cmd = [sys.executable, "-c", code, str(SCRIPT), "--merge", *map(str, paths), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=hostspeed.limit(60), env=env)


def _refused(done: subprocess.CompletedProcess, *words: str) -> None:
    err = done.stderr.strip()
    assert done.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_the_shipped_report_merges_into_itself(tmp_path):
    done = _merge(SHIPPED, out=tmp_path / "m")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "m" / "gpu_report.json").read_text()) == json.loads(SHIPPED.read_text())
    assert (tmp_path / "m" / "gpu_report.md").read_text() == SHIPPED.with_suffix(".md").read_text()


def _set(path: list, value):
    def edit(report: dict) -> None:
        target = report
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _delete(path: list):
    def edit(report: dict) -> None:
        target = report
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return edit


GUARD_ROW = ["parts", "guard", "results", 0]
# a record made wrong, and the words naming it in the one-line refusal
HOSTILE = {
    "exit-word": (_set(["parts", "guard", "exit"], "maybe"), "report.parts.guard.exit is 'maybe'"),
    "exit-bool": (_set(["parts", "guard", "exit"], True), "report.parts.guard.exit is True"),
    "exit-huge": (_set(["parts", "guard", "exit"], 1e308), "report.parts.guard.exit"),
    "seconds-negative": (_set(["parts", "quickstart", "seconds"], -4), "report.parts.quickstart.seconds is -4"),
    "seconds-text": (_set(["parts", "quickstart", "seconds"], "fast"), "report.parts.quickstart.seconds is 'fast'"),
    "count-negative": (_set(["parts", "cuda-tests", "counts", "passed"], -3), "counts.passed is -3"),
    "count-text": (_set(["parts", "cuda-tests", "counts", "passed"], "21"), "counts.passed is '21'"),
    "guard-row-missing": (_delete([*GUARD_ROW, "plain_ms"]), "report.parts.guard.results[0] has no plain_ms"),
    "guard-row-text": (_set([*GUARD_ROW, "guarded_ms"], "43"), "results[0].guarded_ms is '43'"),
    "guard-not-rows": (_set(["parts", "guard", "results"], {"a": 1}), "report.parts.guard.results is {'a': 1}"),
    "img-s-list": (_set(["parts", "raw-step", "batch128", "img_s"], [1, 2]), "batch128.img_s is [1, 2]"),
    "img-s-huge": (_set(["parts", "raw-step", "batch128", "img_s", "ours"], 1e300), "img_s.ours is 1e+300"),
    "ratio-none": (_set(["parts", "raw-step", "batch256", "ratios", "ours / timm"], None), "ratios.ours / timm"),
    "trainer-no-command": (_delete(["parts", "trainer-vs-raw", "trainer", "command"]), "trainer has no command"),
    "over-negative": (_set(["parts", "trainer-vs-raw", "trainer_over_raw"], -0.7), "trainer_over_raw is -0.7"),
    "unknown-part": (_set(["parts", "evil"], {"exit": 0}), "report.parts.'evil': not a part"),
    "part-list": (_set(["parts", "guard"], [1]), "report.parts.guard is [1]"),
    "unknown-record": (_set(["parts", "guard", "extra"], 1), "report.parts.guard.extra: not a record"),
    "no-exit": (_delete(["parts", "inference", "exit"]), "report.parts.inference has no exit"),
    "machines-object": (_set(["machines"], {"gpu": "x"}), "report.machines is {'gpu': 'x'}"),
    "machine-list-value": (_set(["machines", 0, "gpu"], ["a"]), "report.machines[0].gpu is a list"),
    "no-parts": (_delete(["parts"]), "report has no parts"),
    "skipped-number": (_set(["parts", "suite", "skipped"], 3), "report.parts.suite.skipped is 3"),
    "deep": (_set(["parts", "inference", "results"], json.loads("[" * 40 + "]" * 40)), "nested more than"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_record_is_one_line_naming_it_and_nothing_is_written(tmp_path, case):
    edit, words = HOSTILE[case]
    report = copy.deepcopy(json.loads(SHIPPED.read_text()))
    edit(report)
    (tmp_path / "r.json").write_text(json.dumps(report))
    _refused(_merge(tmp_path / "r.json", out=tmp_path / "m"), f"--merge {tmp_path / 'r.json'}", words)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("text, words", [
    ('{"machines": [], "parts": {"guard": {"exit": 0, "seconds": NaN}}}', "NaN"),
    ('{"machines": [], "parts": {"guard": {"exit": 0, "seconds": Infinity}}}', "Infinity"),
    ('{"machines": [], "parts": {"guard": {"exit": 0, "seconds": 1e999}}}', "report.parts.guard.seconds is inf"),
    ('{"machines": [], "parts": {"guard": {"exit": 0, "seconds": 1' + "0" * 5000 + "}}}", "not JSON"),
    ("[" * 100_000 + "]" * 100_000, "nested more than"),
    ("[1, 2]", "report is [1, 2]"),
], ids=["nan", "infinity", "overflow", "huge-int", "very-deep", "list"])
def test_impossible_numbers_and_shapes_are_refused(tmp_path, text, words):
    (tmp_path / "r.json").write_text(text)
    _refused(_merge(tmp_path / "r.json", out=tmp_path / "m"), words)
    assert not (tmp_path / "m").exists()


def test_bytes_that_are_not_utf8_are_refused(tmp_path):
    (tmp_path / "r.json").write_bytes(b'{"machines": ["\xff\xfe"], "parts": {}}')
    _refused(_merge(tmp_path / "r.json", out=tmp_path / "m"), "not JSON")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    _refused(_merge(tmp_path / "fifo.json", out=tmp_path / "m"), "not a regular file")  # before: hung (timeout)


def test_dev_zero_is_refused_without_reading_it(tmp_path):
    _refused(_merge(Path("/dev/zero"), out=tmp_path / "m", memory_mib=512), "not a regular file")


def test_a_file_larger_than_any_report_is_refused_reading_a_bounded_amount(tmp_path):
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB of zero bytes, read within a 512 MiB address space
    _refused(_merge(tmp_path / "big.json", out=tmp_path / "m", memory_mib=512), "more than 16 MiB")


def test_a_part_in_two_reports_is_refused_not_replaced(tmp_path):
    report = json.loads(SHIPPED.read_text())
    for name in ("a", "b"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"machines": report["machines"][:1],
                                                           "parts": {"guard": report["parts"]["guard"]}}))
    _refused(_merge(tmp_path / "a.json", tmp_path / "b.json", out=tmp_path / "m"), "part guard is also in")


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
@pytest.mark.parametrize("name", ["gpu_report.json.tmp", "gpu_report.md.tmp", "gpu_report.json"])
def test_a_link_planted_in_out_is_never_written_through(tmp_path, link, name):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "m"
    out.mkdir()
    (os.symlink if link == "symlink" else os.link)(victim, out / name)
    done = _merge(SHIPPED, out=out)
    assert done.returncode == 0, done.stderr
    assert victim.read_text() == "precious"  # before: the report's JSON or Markdown at the .tmp names
    assert json.loads((out / "gpu_report.json").read_text()) == json.loads(SHIPPED.read_text())

"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs in a fresh interpreter (the package's own import path, nothing downloaded: HF_HUB_OFFLINE=1)
with a temporary folder as its working directory. Markers, HTML comments on the lines right before a block:

- `<!-- snippet: skip (REASON) -->`: not run (downloads, long training); reported as skipped with REASON.
- `<!-- snippet: needs PATH[, PATH...] -->`: the test first writes a stand-in for each PATH under the
  temporary folder: a `.safetensors` file is a tiny Fashion-MNIST-shaped ResMLP checkpoint with the metadata a
  training run writes (class names, preprocessing, dataset), a `.png` a 28x28 grayscale image.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from hostspeed import limit
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 120  # a block imports torch and timm (2 s idle, 10-20 s on a loaded 2-core host) and runs tiny models

FENCE = re.compile(r"^```python\s*\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!--\s*snippet:\s*(skip|needs)\s*(.*?)\s*-->")


@dataclass
class Snippet:
    source: str  # file:line, the test's id
    code: str
    skip: str | None  # the reason, when the block is marked skip
    needs: list[str]  # files the block reads that the test provides


def markers_before(text: str, start: int) -> list[tuple[str, str]]:
    """The snippet markers on the consecutive comment lines right above position `start`."""
    found = []
    for line in reversed(text[:start].splitlines()[-3:]):
        match = MARKER.fullmatch(line.strip())
        if match is None:
            break
        found.append((match.group(1), match.group(2)))
    return found


def collect() -> list[Snippet]:
    snippets = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.finditer(text):
            skip, needs = None, []
            for kind, arg in markers_before(text, block.start()):
                if kind == "skip":
                    skip = arg.strip("()") or "marked skip"
                else:
                    needs += [p.strip() for p in arg.split(",") if p.strip()]
            line = text.count("\n", 0, block.start()) + 1
            snippets.append(Snippet(f"{doc.relative_to(ROOT)}:{line}", block.group(1), skip, needs))
    return snippets


SNIPPETS = collect()


def write_checkpoint(path: Path) -> None:
    """A tiny ResMLP shaped like the quickstart's (28x28 grayscale, 10 classes) with a training run's metadata."""
    import torch

    import resmlp
    from resmlp.data.sources.fashion_mnist import CLASS_NAMES

    torch.manual_seed(0)
    model = resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, in_chans=1, num_classes=10, dim=16,
                                depth=4)
    preprocess = dict(img_size=28, crop_pct=1.0, interpolation="bilinear", mean=[0.286], std=[0.353], in_chans=1)
    resmlp.save(model, path, metadata=dict(class_names=list(CLASS_NAMES), preprocess=preprocess,
                                           dataset="fashion-mnist", recipe="fashion-mnist-quick"))


def write_image(path: Path) -> None:
    pixels = np.random.default_rng(0).integers(0, 256, (28, 28), dtype=np.uint8)
    Image.fromarray(pixels, mode="L").save(path)


FIXTURES = {".safetensors": write_checkpoint, ".png": write_image}


def provide(needed: str, cwd: Path) -> None:
    path = cwd / needed
    writer = FIXTURES.get(path.suffix)
    if writer is None:
        raise AssertionError(f"no stand-in for {needed!r}: the test makes {sorted(FIXTURES)} files")
    path.parent.mkdir(parents=True, exist_ok=True)
    writer(path)


def test_every_doc_has_been_read():
    assert SNIPPETS, "no ```python block found in README.md and docs/*.md"
    assert any(s.source.startswith("README.md") for s in SNIPPETS)


@pytest.mark.parametrize("snippet", SNIPPETS, ids=[s.source for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path: Path):
    if snippet.skip:
        pytest.skip(f"{snippet.source}: {snippet.skip}")
    for needed in snippet.needs:
        provide(needed, tmp_path)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", snippet.code], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=limit(TIMEOUT_S))
    assert result.returncode == 0, f"{snippet.source} failed:\n{snippet.code}\n--- stderr ---\n{result.stderr[-3000:]}"

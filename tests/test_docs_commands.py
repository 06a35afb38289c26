"""Every shell command of README.md and docs/*.md runs as the document shows it, in its tiny form.

Collected: every line of a ```bash block (`\\` continuations joined, `#` comments dropped) and every `$ ` line of
another block (a transcript: the command, then what it printed). A block is one test: its commands run in order
in one temporary folder, so a later command reads what an earlier one wrote (`resmlp eval runs/quickstart`
after the training). Each must exit as the document implies: 0, or, in a block marked `fails`, 2 with the
printed lines of the transcript among its messages.

The substitution rule, the only change made to what the document shows:
1. Programs: `resmlp`, `.venv/bin/resmlp` and `python -m resmlp` are `resmlp.cli.main` of this checkout, run in
   this process; `bash .ci/setup && ` (which made this environment) and the scheduling prefixes `nice -n N`,
   `taskset -c N` are left out; `VAR=value` prefixes are set for the command.
2. Size: the default Fashion-MNIST location holds a tiny generated copy (TRAIN_IMAGES training and TEST_IMAGES
   test images in the IDX format), and every command gets its sub-command's TINY flags appended, which win
   over the document's: one epoch and a 64-image validation split for training, one round at 32 px for
   `benchmark`, two steps of the tiny preset for `translate train`.
3. Placeholders: an all-capitals word (CHECKPOINT, CKPT, DIR, FMNIST...) or a /path/to/ path stands for a
   stand-in the test makes (`placeholders`, `provide`); `...` stands for the rest of a command (an --output
   of its own); a synopsis's
   `[optional parts]` are left out and `a|b` takes `a`.

Markers, HTML comments on the lines right before a block (as for the Python snippets, tests/test_docs_snippets.py):
- `<!-- commands: skip (REASON) -->`: not run, reported as skipped with REASON (a GPU, a cluster, the network, hours
  of measurement);
- `<!-- commands: needs PATH[, PATH...] -->`: stand-ins the test makes first (a run folder, an image, weights);
- `<!-- commands: fails -->`: the transcript shows an error.
"""

from __future__ import annotations

import gzip
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TRAIN_IMAGES, TEST_IMAGES = 320, 64
EPOCH = ["--set", "schedule.epochs=1", "--set", "schedule.warmup_epochs=0", "--set", "train.compile=false",
         "--set", "data.val_size=64", "--no-progress", "--threads", "1"]  # one epoch, a validation split of 64

BLOCK = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!--\s*commands:\s*(skip|needs|fails)\s*(.*?)\s*-->")
PROGRAMS = {"resmlp", ".venv/bin/resmlp"}
# appended to each sub-command (the first words after the program); later flags win over the document's
TINY = {
    ("train",): EPOCH,
    ("finetune",): EPOCH,
    ("pretrain", "dino"): [*EPOCH, "--set", "dino.warmup_teacher_temp_epochs=0"],
    ("benchmark",): ["--repeats", "1", "--warmup", "1", "--min-time", "0", "--batch-size", "2", "--large-batch", "0",
                     "--img-size", "32", "--no-progress", "--threads", "1"],
    ("translate", "train"): ["--max-steps", "2", "--train-size", "64", "--preset", "tiny", "--no-progress",
                             "--threads", "1"],
    ("translate", "eval"): ["--no-progress"],
    ("data", "shards"): ["--val-size", "64"],
    ("eval",): ["--no-progress", "--threads", "1"],
    ("eval-knn",): ["--no-progress", "--threads", "1"],
    ("eval-linear",): ["--no-progress", "--threads", "1"],
    ("analyze",): ["--no-progress", "--threads", "1"],
}
OPTIONAL = re.compile(r"\s\[[^\[\]]*(?:\[[^\[\]]*\][^\[\]]*)*\]")  # ' [--flag VALUE [--more]]' of a synopsis
ALTERNATIVES = re.compile(r"(?<=\s)([\w.-]+)(?:\|[\w.-]+)+")  # 'fp32|tf32|bf16' -> 'fp32'


@dataclass
class Block:
    source: str  # file:line, the test's id
    commands: list[str]
    printed: list[str] = field(default_factory=list)  # a transcript's lines after its command
    skip: str | None = None
    needs: list[str] = field(default_factory=list)
    fails: bool = False


def markers_before(text: str, start: int) -> list[tuple[str, str]]:
    found = []
    for line in reversed(text[:start].splitlines()[-3:]):
        match = MARKER.fullmatch(line.strip())
        if match is None:
            break
        found.append((match.group(1), match.group(2)))
    return found


def shell_lines(body: str, transcript: bool) -> tuple[list[str], list[str]]:
    """(commands, printed lines): a bash block's lines, or a transcript's `$ ` lines and what follows them."""
    commands, printed, current, continuing = [], [], "", False
    for line in body.splitlines():
        if transcript and not continuing and not line.startswith("$ "):
            printed.append(line.strip())
            continue
        if transcript and not continuing:
            line = line[2:]
        text = line.split(" #")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if text.endswith("\\"):
            current, continuing = current + text[:-1] + " ", True
            continue
        current, continuing = current + text, False
        if current.strip():
            commands.append(" ".join(current.split()))
        current = ""
    return commands, printed


def collect() -> list[Block]:
    blocks = []
    for doc in DOCS:
        text = doc.read_text()
        for match in BLOCK.finditer(text):
            language, body = match.group(1), match.group(2)
            if language == "python":
                continue
            transcript = language != "bash"
            commands, printed = shell_lines(body, transcript)
            if not commands:
                continue
            line = text.count("\n", 0, match.start()) + 1
            block = Block(f"{doc.relative_to(ROOT)}:{line}", commands, printed)
            for kind, arg in markers_before(text, match.start()):
                if kind == "skip":
                    block.skip = arg.strip("()") or "marked skip"
                elif kind == "needs":
                    block.needs += [p.strip() for p in arg.split(",") if p.strip()]
                else:
                    block.fails = True
            blocks.append(block)
    return blocks


BLOCKS = collect()


# ------------------------------------------------------------------------------------------ stand-ins
def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(header + array.astype(np.uint8).tobytes())


def tiny_fashion_mnist(folder: Path) -> Path:
    """Fashion-MNIST's four IDX files with a few learnable images: each class a bright band at its own row."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", TRAIN_IMAGES), ("t10k", TEST_IMAGES)):
        labels = np.arange(count) % 10
        images = rng.integers(0, 60, (count, 28, 28))
        for i, label in enumerate(labels):
            images[i, 2 + 2 * label: 4 + 2 * label] += 180
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels)
    return folder


def image_folder(folder: Path, count: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(np.random.default_rng(i).integers(0, 256, (28, 28), dtype=np.uint8), mode="L").save(
            folder / f"{i}.png")


def translation_folder(folder: Path) -> None:
    """A WMT-layout corpus: {train,valid,test}.{en,de}, a sentence per line."""
    from num2words import num2words

    folder.mkdir(parents=True, exist_ok=True)
    for split, start in (("train", 0), ("valid", 1000), ("test", 2000)):
        numbers = range(start, start + (64 if split == "train" else 8))
        for language in ("en", "de"):
            (folder / f"{split}.{language}").write_text("".join(num2words(n, lang=language) + "\n" for n in numbers))


def fashion_mnist_module():
    """resmlp.data.sources.fashion_mnist, the module (resmlp.data's attribute of that name is its loader function)."""
    import importlib

    return importlib.import_module("resmlp.data.sources.fashion_mnist")


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[str, Path]:
    """The tiny Fashion-MNIST copy, and a quickstart run trained on it once (the stand-in of every run folder
    and checkpoint a block reads without making it)."""
    import contextlib
    import io

    from resmlp.cli import main

    fashion_mnist = fashion_mnist_module()
    root = tmp_path_factory.mktemp("doc_commands")
    data = tiny_fashion_mnist(root / "fashion-mnist")
    original, fashion_mnist.DEFAULT_DIR = fashion_mnist.DEFAULT_DIR, data
    run = root / "quickstart"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--output", str(run), *TINY[("train",)]]) == 0
    for scratch in ("last.pth", "tensorboard"):
        shutil.rmtree(run / scratch, ignore_errors=True) if scratch == "tensorboard" else (run / scratch).unlink()
    fashion_mnist.DEFAULT_DIR = original
    return {"fashion-mnist": data, "run": run}


def provide(needed: str, cwd: Path, stand_ins: dict[str, Path]) -> None:
    """The stand-in of one `needs` path: a run folder (runs/NAME), a checkpoint (.safetensors: the run's), an
    image (.png, .jpg), a folder of images (NAME/), weights of a ResNet-18 teacher (.pth: timm's for w.pth,
    torchvision's for tv.pth), English sentences (.txt)."""
    path = cwd / needed
    path.parent.mkdir(parents=True, exist_ok=True)
    if needed.endswith("/"):
        image_folder(path)
    elif path.suffix in (".png", ".jpg"):
        image_folder(path.parent, 1)
        (path.parent / "0.png").rename(path) if path.name != "0.png" else None
    elif path.suffix == ".safetensors":
        shutil.copy(stand_ins["run"] / "best.safetensors", path)
    elif path.suffix == ".pth":
        import torch

        if path.name.startswith("tv"):
            import torchvision

            net = torchvision.models.resnet18(num_classes=10)
        else:
            import timm

            net = timm.create_model("resnet18", num_classes=10, in_chans=1)
        torch.save(net.state_dict(), path)
    elif path.suffix == ".txt":
        path.write_text("forty-two\none hundred and seven\n")
    elif not path.suffix:
        shutil.copytree(stand_ins["run"], path)
    else:
        raise AssertionError(f"no stand-in for {needed!r}")


def placeholders(cwd: Path, stand_ins: dict[str, Path]) -> dict[str, str]:
    """What each placeholder word stands for; made on first use."""
    checkpoint = cwd / "stand-in" / "best.safetensors"
    if not checkpoint.is_file():
        shutil.copytree(stand_ins["run"], checkpoint.parent)
    corpus = cwd / "corpus"
    if not corpus.is_dir():
        translation_folder(corpus)
    data = str(stand_ins["fashion-mnist"])
    return {"CHECKPOINT": str(checkpoint), "CKPT": str(checkpoint), "T": str(checkpoint), "DIR": str(corpus),
            "FMNIST": data, "/path/to/fashion-mnist": data}


# ------------------------------------------------------------------------------------------ running
def tiny_form(command: str, words: dict[str, str], index: int = 0) -> tuple[dict[str, str], list[str]]:
    """(environment, argv after the program) of a `resmlp` command, by the substitution rule; `...` is an
    output folder of its own (`index`: the command's place in its block)."""
    command = ALTERNATIVES.sub(r"\1", OPTIONAL.sub("", command)).replace("bash .ci/setup && ", "")
    argv = shlex.split(command)
    env = {}
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    while argv and argv[0] in ("nice", "taskset"):
        argv = argv[3:]  # nice -n N / taskset -c N
    if argv[:3] in (["python", "-m", "resmlp"], [".venv/bin/python", "-m", "resmlp"]):
        argv = ["resmlp", *argv[3:]]
    if not argv or argv[0] not in PROGRAMS:
        raise AssertionError(f"not a resmlp command; mark its block skip with the reason: {command}")
    args = [part for word in argv[1:]
            for part in (["--output", f"runs/more{index}"] if word == "..." else [words.get(word, word)])]
    sub = next((key for key in sorted(TINY, key=len, reverse=True) if tuple(args[:len(key)]) == key), None)
    return env, args + (TINY[sub] if sub else [])


def run_command(argv: list[str], env: dict[str, str], monkeypatch, capsys) -> tuple[int, str]:
    from resmlp.cli import main

    with monkeypatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        try:
            code = main(argv)
        except SystemExit as e:  # argparse: a usage error
            code = e.code if isinstance(e.code, int) else 2
    out = capsys.readouterr()
    return code, out.out + out.err


def test_every_document_has_been_read():
    sources = {b.source.split(":")[0] for b in BLOCKS}
    assert "README.md" in sources and len(BLOCKS) > 20


@pytest.mark.parametrize("block", BLOCKS, ids=[b.source for b in BLOCKS])
def test_commands_run(block: Block, stand_ins, tmp_path, monkeypatch, capsys):
    if block.skip:
        pytest.skip(f"{block.source}: {block.skip}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fashion_mnist_module(), "DEFAULT_DIR", stand_ins["fashion-mnist"])
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for needed in block.needs:
        provide(needed, tmp_path, stand_ins)
    words = placeholders(tmp_path, stand_ins)
    for index, command in enumerate(block.commands):
        env, argv = tiny_form(command, words, index)
        code, output = run_command(argv, env, monkeypatch, capsys)
        if block.fails:
            assert code == 2, f"{block.source}: `{command}` should fail\n{output[-3000:]}"
            shown = [line for line in block.printed if line]
            assert all(line in output for line in shown), f"{block.source}: printed\n{output}\nnot\n{shown}"
        else:
            assert code == 0, f"{block.source}: `{command}` exited {code}\nran: resmlp {shlex.join(argv)}\n" \
                              f"{output[-3000:]}"

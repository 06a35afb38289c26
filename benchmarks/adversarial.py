"""Hostile inputs and faults against the library and the `resmlp` command: is each handled cleanly?

Usage: PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/adversarial.py [--markdown]

Each case plants one hostile input (a code-running pickle, a symlink, a bomb image, a lying checkpoint,
a full disk...) and checks the outcome: refused or skipped with a message naming the problem, no code
run, nothing written outside the output folder, no traceback from the CLI, nothing allocated beyond the
file's size. It prints a table: case, handled cleanly (yes/no), how (the message or what happened).
CLI cases run `python -m resmlp ...` in a subprocess with this checkout's src/ first on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import io
import json
import os
import pickle
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file

import resmlp
from resmlp.checkpoint import read_checkpoint
from resmlp.data import SkippingImageFolder, build_dataset
from resmlp.data.images import open_image
from resmlp.errors import ResmlpError
from resmlp.fileio import RunLock, atomic_write
from resmlp.preprocess import Preprocess
from resmlp.seq2seq.decoding import beam_search
from resmlp.seq2seq.model import build_translation_model, translation_model_config

SRC = str(Path(__file__).resolve().parents[1] / "src")
TINY = dict(img_size=16, patch_size=8, dim=8, depth=2, num_classes=3)
TRAIN_TINY = ["--set", "data.kind=synthetic", "--set", "model.img_size=16", "--set", "model.patch_size=4",
              "--set", "model.dim=16", "--set", "model.depth=1", "--set", "schedule.epochs=1",
              "--set", "schedule.warmup_epochs=0", "--set", "train.batch_size=16", "--set", "train.progress=false",
              "--set", "data.synthetic_size=[32,16]", "--set", "data.num_workers=0", "--set", "train.threads=1"]
CASES: list[tuple[str, Callable[[Path], tuple[bool, str]]]] = []


def case(name: str):
    def register(fn: Callable[[Path], tuple[bool, str]]):
        CASES.append((name, fn))
        return fn
    return register


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def refused(fn: Callable[[], object], *types: type[BaseException]) -> tuple[bool, str]:
    """(True, message) when fn raises one of `types` (default: the project's errors), else (False, what)."""
    caught = types or (ResmlpError,)
    try:
        fn()
    except caught as e:
        return True, f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
    return False, "accepted silently"


def cli(*args: str, timeout: float = 300, env: dict | None = None) -> tuple[int, str]:
    run_env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    run_env.pop("RESMLP_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "resmlp", *args], capture_output=True, text=True, timeout=timeout,
                          env=run_env, errors="replace")  # a message may quote bytes of a hostile file
    return proc.returncode, proc.stderr.strip()


def clean_cli_failure(rc: int, err: str, expect: str = "") -> tuple[bool, str]:
    """A clean failure: non-zero exit, no traceback, the expected words in the message."""
    last = err.splitlines()[-1] if err else "(no message)"
    traceback = "Traceback" in err
    return rc != 0 and not traceback and expect in err, f"exit {rc}: {'traceback: ' * traceback}{last[:150]}"


def tiny_model() -> resmlp.ResMLP:
    return resmlp.create_model("resmlp_s12", **TINY)


def tiny_checkpoint(path: Path, metadata: dict | None = None, **raw: str) -> Path:
    """Our tiny model's tensors under whatever raw header metadata a case wants."""
    tensors = {k: v.contiguous() for k, v in tiny_model().state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "resmlp", **raw,
                                             **({"extra": json.dumps(metadata)} if metadata else {})})
    return path


def cifar_with_payload(root: Path, marker: Path) -> Path:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"a"] * 10, b"x": _Payload(marker)}, f, protocol=2)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(base / name, "wb") as f:
            pickle.dump({b"data": np.zeros((1, 3072), np.uint8), b"labels": [0]}, f, protocol=2)
    return root


def bomb_png(path: Path, side: int = 20000) -> Path:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(b"\0" * (side + 1))) + chunk(b"IEND", b""))
    return path


def saved_with_preprocess(path: Path, **pre) -> Path:
    meta = {"preprocess": {"img_size": 16, "crop_pct": 0.875, "mean": [0.5] * 3, "std": [0.25] * 3, **pre},
            "class_names": ["a", "b", "c"]}
    return resmlp.save(tiny_model(), path, metadata=meta)


def an_image(path: Path) -> Path:
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(path)
    return path


# ------------------------------------------------------------------------------------------ code from data
@case("CIFAR batches.meta with an os.mkdir payload (library)")
def _(d: Path):
    root = cifar_with_payload(d / "c", d / "pwned")
    ok, how = refused(lambda: build_dataset("cifar10", "test", root, 3))
    return ok and not (d / "pwned").exists(), how


@case("CIFAR payload via `resmlp eval --data cifar10 --data-dir DIR`")
def _(d: Path):
    root = cifar_with_payload(d / "c", d / "pwned")
    ckpt = resmlp.save(resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=8, depth=1, num_classes=10),
                       d / "m.safetensors")
    ok, how = clean_cli_failure(*cli("eval", str(ckpt), "--data", "cifar10", "--data-dir", str(root)), "refusing")
    return ok and not (d / "pwned").exists(), how


@case("torch .pth checkpoint with a payload")
def _(d: Path):
    torch.save({"model": {"w": torch.zeros(1)}, "x": _Payload(d / "pwned")}, d / "evil.pth")
    ok, how = refused(lambda: resmlp.load(d / "evil.pth"))
    return ok and not (d / "pwned").exists(), how


@case("YAML recipe with a !!python/object/apply payload")
def _(d: Path):
    (d / "evil.yaml").write_text(f"model:\n  dim: !!python/object/apply:os.mkdir [{str(d / 'pwned')!r}]\n")
    ok, how = clean_cli_failure(*cli("train", "--recipe", str(d / "evil.yaml"), "--output", str(d / "o")), "YAML")
    return ok and not (d / "pwned").exists(), how


# ------------------------------------------------------------------------------------------ writes
@case("symlinks planted at predictable temporary names")
def _(d: Path):
    (d / "victim").write_text("precious")
    for pid in range(os.getpid() - 50, os.getpid() + 50):
        (d / f".m.safetensors.tmp{pid}").symlink_to(d / "victim")
    resmlp.save(tiny_model(), d / "m.safetensors")
    return (d / "victim").read_text() == "precious", "temporary made by mkstemp (O_EXCL, random name)"


@case("symlink at the target name of a write")
def _(d: Path):
    (d / "victim").write_text("precious")
    (d / "m.safetensors").symlink_to(d / "victim")
    resmlp.save(tiny_model(), d / "m.safetensors")
    ok = (d / "victim").read_text() == "precious" and not (d / "m.safetensors").is_symlink()
    return ok, "os.replace swaps the directory entry; the link is replaced, not followed"


@case("disk full (ENOSPC) during a checkpoint write")
def _(d: Path):
    path = resmlp.save(tiny_model(), d / "m.safetensors")
    before = path.read_bytes()

    def full(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp))
    ok, how = refused(lambda: atomic_write(path, full), OSError)
    intact = path.read_bytes() == before and [p.name for p in d.iterdir()] == ["m.safetensors"]
    return ok and intact, "previous file intact, temporary removed; " + how


@case("second RunLock on a held output folder (library)")
def _(d: Path):
    with RunLock(d):
        return refused(lambda: RunLock(d).acquire())


@case("`resmlp train` into a folder another run holds")
def _(d: Path):
    with RunLock(d / "run"):
        return clean_cli_failure(*cli("train", "--output", str(d / "run"), *TRAIN_TINY), "in use")


@case("`resmlp train --output` that is a file")
def _(d: Path):
    (d / "f").write_text("x")
    return clean_cli_failure(*cli("train", "--output", str(d / "f"), *TRAIN_TINY))


@case("`resmlp predict --output` under /sys")
def _(d: Path):
    ckpt = saved_with_preprocess(d / "m.safetensors")
    return clean_cli_failure(*cli("predict", str(ckpt), str(an_image(d / "x.png")), "--output", "/sys/x.json"))


# ------------------------------------------------------------------------------------------ bounds
@case("1 kB-scale safetensors whose config says depth 1e9")
def _(d: Path):
    path = tiny_checkpoint(d / "m.safetensors", config=json.dumps({**tiny_model().config.to_dict(), "depth": 10**9}))
    start = time.perf_counter()
    ok, how = refused(lambda: resmlp.load(path))
    return ok, f"{how} ({time.perf_counter() - start:.2f} s)"


@case("timm metadata naming vit_giant_patch14_224 on tiny tensors")
def _(d: Path):
    path = tiny_checkpoint(d / "m.safetensors", timm=json.dumps({"name": "vit_giant_patch14_224", "kwargs": {}}))
    start = time.perf_counter()
    ok, how = refused(lambda: resmlp.load(path))
    return ok, f"{how} ({time.perf_counter() - start:.2f} s, built on the meta device)"


@case("timm metadata with depth=1e9")
def _(d: Path):
    path = tiny_checkpoint(d / "m.safetensors", timm=json.dumps({"name": "test_vit", "kwargs": {"depth": 10**9}}))
    return refused(lambda: resmlp.load(path))


@case("beam search with beam 100000")
def _(d: Path):
    model = build_translation_model(translation_model_config("tiny", 19)).eval()
    return refused(lambda: beam_search(model, torch.randint(3, 19, (1, 4)), beam=100_000))


# ------------------------------------------------------------------------------------------ images
@case("decompression bomb PNG (20000x20000 declared, <1 kB)")
def _(d: Path):
    return refused(lambda: open_image(bomb_png(d / "b.png")))


@case("decompression bomb inside an image folder")
def _(d: Path):
    for cls in ("a", "b"):
        (d / cls).mkdir()
        an_image(d / cls / "ok.png")
    bomb_png(d / "a" / "bomb.png")
    folder = SkippingImageFolder(d, transform=lambda im: im)
    import warnings
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        items = [folder[i] for i in range(len(folder))]
    skipped = sum(x is None for x in items)
    return skipped == 1, f"{skipped} skipped and counted, {len(items) - skipped} read"


@case("`resmlp predict` on a decompression bomb")
def _(d: Path):
    ckpt = saved_with_preprocess(d / "m.safetensors")
    rc, err = cli("predict", str(ckpt), str(bomb_png(d / "b.png")), str(an_image(d / "x.png")))
    return rc != 0 and "Traceback" not in err, f"exit {rc}: {err.splitlines()[-1][:150] if err else ''}"


@case("16-bit PNG vs its 8-bit version")
def _(d: Path):
    eight = np.random.default_rng(0).integers(0, 256, (16, 16), dtype=np.uint8)
    Image.fromarray(eight).save(d / "8.png")
    Image.fromarray(eight.astype(np.uint16) * 257).save(d / "16.png")
    pre = Preprocess(16, 3, (0.5,) * 3, (0.25,) * 3, crop_pct=1.0)
    diff = float((pre.load(d / "8.png") - pre.load(d / "16.png")).abs().max() * 0.25)
    return diff <= 1 / 255 + 1e-6, f"max difference {diff * 255:.2f}/255 after scaling by the 16-bit range"


# ------------------------------------------------------------------------------------------ silent wrong answers
@case("NaN weights (library load)")
def _(d: Path):
    model = tiny_model()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    path = resmlp.save(model, d / "nan.safetensors")
    return refused(lambda: resmlp.load(path))


@case("NaN weights via `resmlp eval`")
def _(d: Path):
    model = tiny_model()
    with torch.no_grad():
        model.head.weight[0, 0] = float("nan")
    path = saved_with_preprocess(d / "nan.safetensors")
    resmlp.save(model, path, metadata=resmlp.read_metadata(path))
    return clean_cli_failure(*cli("eval", str(path), "--data", "synthetic"), "NaN")


@case("non-finite logits in predict (weights loaded with allow_nonfinite)")
def _(d: Path):
    model = tiny_model()
    with torch.no_grad():
        model.head.bias.fill_(float("inf"))
    from resmlp.inference import predict
    return refused(lambda: predict(model.eval(), torch.randn(1, 3, 16, 16)))


@case("int8 tensor where a float weight is expected")
def _(d: Path):
    tensors = {k: v.contiguous() for k, v in tiny_model().state_dict().items()}
    tensors["head.weight"] = tensors["head.weight"].to(torch.int8)
    save_file(tensors, str(d / "i.safetensors"), metadata={"config": json.dumps(tiny_model().config.to_dict())})
    return refused(lambda: resmlp.load(d / "i.safetensors"))


@case("crop_pct 0 in preprocessing metadata (`resmlp predict`)")
def _(d: Path):
    ckpt = saved_with_preprocess(d / "m.safetensors", crop_pct=0)
    return clean_cli_failure(*cli("predict", str(ckpt), str(an_image(d / "x.png"))), "crop_pct")


@case("crop_pct 0 in preprocessing metadata (`resmlp eval`)")
def _(d: Path):
    ckpt = saved_with_preprocess(d / "m.safetensors", crop_pct=0)
    return clean_cli_failure(*cli("eval", str(ckpt), "--data", "synthetic"), "crop_pct")


@case("std 0 in preprocessing metadata")
def _(d: Path):
    pre = {"img_size": 16, "mean": [0.5] * 3, "std": [0.0] * 3}
    return refused(lambda: Preprocess.from_metadata({"preprocess": pre}, tiny_model()))


# ------------------------------------------------------------------------------------------ malformed metadata
for _label, _raw in (("config null", {"config": "null"}), ("config a list", {"config": "[1, 2]"}),
                     ("timm spec without a name", {"timm": '{"kwargs": {}}'}),
                     ("config with dim 'wide'", {"config": json.dumps({**TINY, "dim": "wide"})})):
    @case(f"checkpoint metadata: {_label} (`resmlp predict`)")
    def _(d: Path, raw=_raw):
        path = tiny_checkpoint(d / "m.safetensors", **raw)
        return clean_cli_failure(*cli("predict", str(path), str(an_image(d / "x.png"))))


@case("truncated safetensors file")
def _(d: Path):
    path = resmlp.save(tiny_model(), d / "m.safetensors")
    path.write_bytes(path.read_bytes()[:200])
    return refused(lambda: read_checkpoint(path))


@case("timm model saved by resmlp.save: `resmlp predict`")
def _(d: Path):
    import timm
    path = resmlp.save(timm.create_model("test_resnet", num_classes=3), d / "t.safetensors",
                       metadata={"class_names": ["a", "b", "c"]})
    rc, err = cli("predict", str(path), str(an_image(d / "x.png")))
    return "Traceback" not in err, f"exit {rc}" + (f": {err.splitlines()[-1][:150]}" if err else "")


for _command in ("export", "analyze"):
    @case(f"timm model saved by resmlp.save: `resmlp {_command}`")
    def _(d: Path, command=_command):
        import timm
        path = resmlp.save(timm.create_model("test_resnet", num_classes=3), d / "t.safetensors")
        rc, err = cli(command, str(path), "--output" if command == "export" else "--out", str(d / "o"))
        return "Traceback" not in err, f"exit {rc}" + (f": {err.splitlines()[-1][:150]}" if err else "")


# ------------------------------------------------------------------------------------------ CLI plumbing
@case("YAML syntax error in --set")
def _(d: Path):
    return clean_cli_failure(*cli("train", "--output", str(d / "o"), "--set", "model.dim=[1,"), "invalid YAML")


@case("`resmlp models --format json` into a closed pipe")
def _(d: Path):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "resmlp", "models", "--format", "json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    return b"Traceback" not in err, f"exit {proc.returncode}, stderr {'empty' if not err else err[-80:]!r}"


# ------------------------------------------------------------------------------------------ unbounded configs
LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True))


@case("billion-laughs recipe (nested YAML aliases, <500 bytes) to `resmlp train`")
def _(d: Path):
    (d / "laughs.yaml").write_text(LAUGHS)
    start = time.perf_counter()
    ok, how = clean_cli_failure(*cli("train", "--recipe", str(d / "laughs.yaml"), "--output", str(d / "o"),
                                     timeout=120), "small document")
    return ok, f"{how} ({time.perf_counter() - start:.1f} s)"


@case("recipe nested 100000 levels deep")
def _(d: Path):
    (d / "deep.yaml").write_text("model: " + "[" * 100_000 + "]" * 100_000 + "\n")
    return clean_cli_failure(*cli("train", "--recipe", str(d / "deep.yaml"), "--output", str(d / "o")), "nested")


for _override, _words in (("model.depth=1000000000", "depth"), ("model.dim=1000000", "dim"),
                          ("model.img_size=1000000", "img_size"), ("data.synthetic_classes=0", "synthetic_classes"),
                          ("train.batch_size=100000000", "batch_size"), ("optim.lr=.nan", "finite"),
                          ("model.dim=16384", "needs at least")):
    @case(f"`resmlp train --set {_override}`")
    def _(d: Path, override=_override, words=_words):
        start = time.perf_counter()
        ok, how = clean_cli_failure(*cli("train", "--output", str(d / "o"), *TRAIN_TINY, "--set", override), words)
        return ok, f"{how} ({time.perf_counter() - start:.1f} s)"


@case("`resmlp train --threads 100000`")
def _(d: Path):
    return clean_cli_failure(*cli("train", "--output", str(d / "o"), *TRAIN_TINY, "--threads", "100000"), "thread")


@case("`resmlp benchmark --img-size 1000000`")
def _(d: Path):
    return clean_cli_failure(*cli("benchmark", "--models", "resmlp_s12", "--img-size", "1000000", "--threads", "1",
                                  "--no-progress"), "img_size")


@case("checkpoint whose config metadata is JSON nested 100000 deep")
def _(d: Path):
    return refused(lambda: read_checkpoint(tiny_checkpoint(d / "m.safetensors", config="[" * 100_000 + "]" * 100_000)))


# ------------------------------------------------------------------------------------------ exhausted resources
@case("torch CPU allocation failure: one line naming memory")
def _(d: Path):
    from resmlp.errors import user_message
    try:
        torch.empty(2**60, dtype=torch.uint8)
    except RuntimeError as e:
        message = user_message(e) or "no message (a traceback)"
        return message.startswith("out of main memory"), message[:150]
    return False, "allocated 1 EiB?"


@case("disk full inside safetensors (SafetensorError) during a checkpoint write")
def _(d: Path):
    from safetensors import SafetensorError

    from resmlp.errors import user_message
    path = resmlp.save(tiny_model(), d / "m.safetensors")
    before = path.read_bytes()

    def full(tmp: Path) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    try:
        atomic_write(path, full)
    except OSError as e:
        intact = path.read_bytes() == before and [p.name for p in d.iterdir()] == ["m.safetensors"]
        return intact and e.errno == errno.ENOSPC, f"previous file intact; {user_message(e)}"
    return False, "no error"


# ------------------------------------------------------------------------------------------ writes outside the folder
@case("`resmlp train` with a planted tensorboard/ symlink")
def _(d: Path):
    (d / "run").mkdir()
    (d / "elsewhere").mkdir()
    (d / "run" / "tensorboard").symlink_to(d / "elsewhere")
    ok, how = clean_cli_failure(*cli("train", "--output", str(d / "run"), *TRAIN_TINY), "symlink")
    return ok and not any((d / "elsewhere").iterdir()), how


@case("`resmlp eval --output` into a folder a training holds")
def _(d: Path):
    ckpt = saved_with_preprocess(d / "m.safetensors")
    with RunLock(d / "run"):
        ok, how = clean_cli_failure(*cli("eval", str(ckpt), "--data", "synthetic", "--output", str(d / "run")),
                                    "in use")
    return ok and not (d / "run" / "summary.json").exists(), how


@case("permissions of best/last.safetensors after `resmlp train` (umask 022)")
def _(d: Path):
    old = os.umask(0o022)
    try:
        rc, err = cli("train", "--output", str(d / "run"), *TRAIN_TINY)
    finally:
        os.umask(old)
    modes = {n: oct(os.stat(d / "run" / n).st_mode & 0o777) for n in ("best.safetensors", "last.safetensors")
             if (d / "run" / n).exists()}
    return rc == 0 and set(modes.values()) == {"0o644"}, f"exit {rc}, {modes}"


# ------------------------------------------------------------------------------------------ values that mean nothing
for _temperature in ("0", "nan"):
    @case(f"`resmlp eval-knn --temperature {_temperature}`")
    def _(d: Path, temperature=_temperature):
        ckpt = saved_with_preprocess(d / "m.safetensors")
        return clean_cli_failure(*cli("eval-knn", str(ckpt), "--data", "synthetic", "--temperature", temperature),
                                 "--temperature")


@case("`resmlp analyze --threshold nan`")
def _(d: Path):
    return clean_cli_failure(*cli("analyze", str(resmlp.save(tiny_model(), d / "m.safetensors")), "--output",
                                  str(d / "a"), "--threshold", "nan"), "threshold")


def _gray(values: np.ndarray, path: Path, mode: str) -> np.ndarray:
    import warnings
    Image.fromarray(values, mode=mode).save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(open_image(path, in_chans=1)).astype(int)


@case("float TIFF holding 0-255")
def _(d: Path):
    eight = np.tile(np.arange(0, 256, 16, dtype=np.uint8), (16, 1))
    diff = int(np.abs(_gray(eight.astype(np.float32), d / "f.tif", "F") - eight).max())
    return diff == 0, f"max difference {diff}/255 from the 8-bit version"


@case("32-bit integer TIFF above 65535")
def _(d: Path):
    read = _gray(np.tile(np.arange(16, dtype=np.int32) * 1_000_000, (16, 1)), d / "i.tif", "I")
    return len(np.unique(read)) == 16, f"{len(np.unique(read))} distinct gray levels of 16 after reading"


@case("EXIF orientation 6 (a phone photo held upright)")
def _(d: Path):
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(np.zeros((8, 16, 3), np.uint8)).save(d / "p.png", exif=exif)
    size = open_image(d / "p.png").size
    return size == (8, 16), f"read as {size[0]}x{size[1]} (stored 16x8)"


for _dtype in ("float8_e4m3fn", "complex64", "bool"):
    @case(f"checkpoint of {_dtype} tensors (NaN check, dtype)")
    def _(d: Path, dtype=_dtype):
        tensors = {k: v.to(getattr(torch, dtype)) for k, v in tiny_model().state_dict().items()}
        if dtype.startswith("float8"):
            tensors["head.weight"][0, 0] = float("nan")
        save_file(tensors, str(d / "x.safetensors"), metadata={"config": json.dumps(tiny_model().config.to_dict())})
        return refused(lambda: resmlp.load(d / "x.safetensors"))


for _label, _content in (("corrupt gzip", b"\x1f\x8b\x08 not really gzip"),
                         ("zero-dimension IDX header", None)):
    @case(f"Fashion-MNIST folder with a {_label} (`resmlp eval-knn`)")
    def _(d: Path, content=_content):
        import gzip
        data = d / "fm"
        data.mkdir()
        for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                     "t10k-labels-idx1-ubyte"):
            (data / f"{name}.gz").write_bytes(content or gzip.compress(bytes([0, 0, 8, 0, 7])))
        ckpt = resmlp.save(resmlp.create_model("resmlp_s12", img_size=28, patch_size=7, dim=8, depth=1, in_chans=1),
                           d / "m.safetensors", metadata={"preprocess": {"img_size": 28, "in_chans": 1,
                                                                        "mean": [0.5], "std": [0.25]}})
        return clean_cli_failure(*cli("eval-knn", str(ckpt), "--data", "fashion-mnist", "--data-dir", str(data)),
                                 "ubyte.gz")


# ------------------------------------------------------------------------------------------ issue 36, image side
class _WrongArguments:
    """Pickles as a call of an allowed callable (argparse.Namespace) with arguments it can't take."""

    def __reduce__(self):
        return (argparse.Namespace, (1, 2))


@case("M1 weights-only pickle calling argparse.Namespace with wrong arguments")
def _(d: Path):
    torch.save({"args": _WrongArguments(), "model": {"w": torch.ones(2)}}, d / "c.pth")
    return refused(lambda: resmlp.load(d / "c.pth"))


@case("M1 int tensor names, a meta tensor, a sparse tensor")
def _(d: Path):
    results = []
    for i, state in enumerate(({3: torch.ones(2)}, {"w": torch.empty(3, device="meta")},
                               {"w": torch.eye(3).to_sparse()})):
        torch.save(state, d / f"c{i}.pth")
        results.append(refused(lambda i=i: read_checkpoint(d / f"c{i}.pth")))
    return all(ok for ok, _ in results), " / ".join(how[:60] for _, how in results)


@case("M2 checkpoint config dim=8.0, depth=1e400; no config and no channel_mlp")
def _(d: Path):
    config = {**tiny_model().config.to_dict(), "dim": 8.0}
    first = refused(lambda: resmlp.load(tiny_checkpoint(d / "a.safetensors", config=json.dumps(config))))
    deep = json.dumps(tiny_model().config.to_dict()).replace('"depth": 2', '"depth": 1e400')
    second = refused(lambda: resmlp.load(tiny_checkpoint(d / "b.safetensors", config=deep)))
    torch.save({k: v for k, v in tiny_model().state_dict().items() if "channel_mlp.fc1" not in k}, d / "c.pth")
    third = refused(lambda: resmlp.load(d / "c.pth"))
    return first[0] and second[0] and third[0], f"{first[1][:60]} / {second[1][:60]} / {third[1][:60]}"


@case("M3 20 kB .pth whose head.weight is zeros(1).expand(30000, 30000)")
def _(d: Path):
    state = {**tiny_model().state_dict(), "head.weight": torch.zeros(1).expand(30000, 30000)}
    torch.save(state, d / "c.pth")
    start = time.perf_counter()
    ok, how = refused(lambda: resmlp.load(d / "c.pth"))
    return ok and time.perf_counter() - start < 5, how


@case("M3 torch zip with a deflated 64 MB record (a few kB on disk)")
def _(d: Path):
    import zipfile

    torch.save({"w": torch.zeros(16 << 20)}, d / "plain.pth")
    with zipfile.ZipFile(d / "plain.pth") as src, zipfile.ZipFile(d / "c.pth", "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    return refused(lambda: read_checkpoint(d / "c.pth"))


def _cifar_batch(root: Path, batch: dict) -> Path:
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True)
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [b"a"] * 10}, f, protocol=2)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(base / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    return root


@case("M4 CIFAR float labels [0.0, 1.5, 2.7, 3.9] (were truncated and scored)")
def _(d: Path):
    root = _cifar_batch(d / "c", {b"data": np.zeros((4, 3072), np.uint8), b"labels": [0.0, 1.5, 2.7, 3.9]})
    return refused(lambda: build_dataset("cifar10", "test", root, 3))


@case("M4 CIFAR data as a list naming one row 60,000 times")
def _(d: Path):
    row = list(range(256)) * 12
    root = _cifar_batch(d / "c", {b"data": [row] * 60000, b"labels": [0] * 60000})
    return refused(lambda: build_dataset("cifar10", "test", root, 3))


@case("M5 `resmlp eval` on a folder whose val images are all unreadable")
def _(d: Path):
    for cls in ("a", "b", "c"):
        (d / "data" / "val" / cls).mkdir(parents=True)
        (d / "data" / "val" / cls / "x.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    ckpt = saved_with_preprocess(d / "m.safetensors")
    return clean_cli_failure(*cli("eval", str(ckpt), "--data", str(d / "data"), "--split", "val", "--no-progress"),
                             "unreadable")


@case("M6 `resmlp predict` on a 1 x 20,000 px PNG (an aspect-ratio bomb)")
def _(d: Path):
    Image.fromarray(np.zeros((1, 20000, 3), np.uint8)).save(d / "strip.png")
    rc, err = cli("predict", str(saved_with_preprocess(d / "m.safetensors")), str(d / "strip.png"))
    return clean_cli_failure(rc, err, "side ratio")


@case("M7 a FIFO named x.png and two symlinks to .. in a class folder")
def _(d: Path):
    (d / "data" / "a").mkdir(parents=True)
    an_image(d / "data" / "a" / "ok.png")
    os.mkfifo(d / "data" / "a" / "x.png")
    os.symlink("..", d / "data" / "a" / "up1")
    os.symlink("..", d / "data" / "a" / "up2")
    start = time.perf_counter()
    samples = SkippingImageFolder(d / "data").samples
    return len(samples) == 1 and time.perf_counter() - start < 10, f"{len(samples)} image, FIFO and loops skipped"


@case("M7 `resmlp predict '/proc/self/**/*.png'`")
def _(d: Path):
    rc, err = cli("predict", str(saved_with_preprocess(d / "m.safetensors")), "/proc/self/**/*.png", timeout=60)
    return clean_cli_failure(rc, err, "no such file")


@case("M12 `--set train.device=cudafoo`, `data.std=[-1]`, `model.depth=2.5`, a recipe key `1.5:`")
def _(d: Path):
    results = [clean_cli_failure(*cli("train", *TRAIN_TINY, "--set", "data.mean=[0.5]", "--set", s, "--output",
                                      str(d / f"o{i}")), key)
               for i, (s, key) in enumerate((("train.device=cudafoo", "train.device"),
                                             ("data.std=[-1]", "data.std: every value must be > 0"),
                                             ("model.depth=2.5", "depth=2.5 is not an integer")))]
    (d / "r.yaml").write_text("model:\n  name: resmlp_s12\n1.5: 3\n")
    results.append(clean_cli_failure(*cli("train", "--recipe", str(d / "r.yaml"), "--output", str(d / "o")),
                                     "not names"))
    return all(ok for ok, _ in results) and not (d / "o1" / "last.pth").exists(), results[1][1]


@case("M13 a run folder whose config.json is [1, 2] or nested 100,000 deep (`resmlp eval`)")
def _(d: Path):
    results = []
    for i, content in enumerate(("[1, 2]", "[" * 100_000 + "]" * 100_000)):
        run = d / f"run{i}"
        saved_with_preprocess(run / "best.safetensors")
        (run / "config.json").write_text(content)
        results.append(clean_cli_failure(*cli("eval", str(run)), "run config"))
    return all(ok for ok, _ in results), results[1][1]


@case("M14 `resmlp export` to TorchScript under `ulimit -f` (aborted, exit 134)")
def _(d: Path):
    import resource

    ckpt = saved_with_preprocess(d / "m.safetensors")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "resmlp", "export", str(ckpt), "--output", str(d / "m.pt")],
                          capture_output=True, text=True, timeout=300, env=env,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY)))
    ok, how = clean_cli_failure(proc.returncode, proc.stderr.strip(), "largest file")
    return ok and sorted(p.name for p in d.iterdir()) == ["m.safetensors"], how


@case("M15 a kill between last.safetensors and last.pth, then resume")
def _(d: Path):
    from resmlp.checkpoint import read_metadata
    from resmlp.train import train

    overrides = [a for a in TRAIN_TINY if a != "--set"] + ["schedule.epochs=2", "train.compile=false"]
    real_replace = os.replace

    class Killed(BaseException):
        pass

    def die_after_last_safetensors(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if os.path.basename(dst) == "last.safetensors":
            raise Killed

    os.replace = die_after_last_safetensors
    try:
        train("fashion-mnist-quick", d / "run", overrides)
    except Killed:
        pass
    finally:
        os.replace = real_replace
    state = d / "run" / "last.pth"
    consistent = not state.exists() or torch.load(state, weights_only=True)["epoch"] == read_metadata(
        d / "run" / "last.safetensors")["epoch"]
    summary = train("fashion-mnist-quick", d / "run", overrides, resume=state.exists())
    best = read_metadata(d / "run" / "best.safetensors")["epoch"]
    ok = consistent and summary["selected_epoch"] == best and summary["epochs"] == 2
    return ok, f"state written last; resumed run selects epoch {summary['selected_epoch']}, best file holds {best}"


@case("M16 `dino.local_size=4096 dino.num_local=64`; 100,000 synthetic classes (confusion matrix)")
def _(d: Path):
    from resmlp.complexity import evaluation_memory_bytes
    from resmlp.train.config import load_config

    try:
        load_config("dino-fashion-mnist", {"dino.local_size": 4096, "dino.num_local": 64})
        refused = ""
    except ResmlpError as e:
        refused = str(e).splitlines()[-1].strip()[:80]
    # 100,000 classes: the evaluation sums per-class counts, not a K x K matrix (issue 55), so the run is bounded
    counts = evaluation_memory_bytes(100_000)
    return bool(refused) and counts < 2**24, f"{refused} / 100,000 classes: {counts / 2**20:.1f} MiB of counts"


@case("M17 a symlink swapped in at OUT/tensorboard after the check")
def _(d: Path):
    from resmlp import reporting
    from resmlp.fileio import held_subfolder

    (d / "run").mkdir()
    (d / "elsewhere").mkdir()

    def racing(folder):
        held = held_subfolder(folder)
        (d / "run" / "tensorboard").rename(d / "run" / "moved")
        (d / "run" / "tensorboard").symlink_to(d / "elsewhere")
        return held

    reporting.held_subfolder, original = racing, reporting.held_subfolder
    try:
        log = reporting.TensorBoardLog(d / "run" / "tensorboard")
        log.log({"epoch": 1, "val_top1": 1.0})
        log.close()
    finally:
        reporting.held_subfolder = original
    return list((d / "elsewhere").iterdir()) == [], "the writer holds the checked folder open (/proc/self/fd)"


@case("Also: `resmlp eval` without --output writes nothing beside the checkpoint; --output '' refused")
def _(d: Path):
    data = d / "data" / "val"
    for cls in ("a", "b", "c"):
        (data / cls).mkdir(parents=True)
        an_image(data / cls / "x.png")
    ckpt = saved_with_preprocess(d / "ckpt" / "m.safetensors")
    rc, _ = cli("eval", str(ckpt), "--data", str(d / "data"), "--split", "val", "--no-progress")
    refused_empty = clean_cli_failure(*cli("eval", str(ckpt), "--output", ""), "--output is empty")
    ok = rc == 0 and [p.name for p in (d / "ckpt").iterdir()] == ["m.safetensors"] and refused_empty[0]
    return ok, "no PNG beside the checkpoint; " + refused_empty[1]


@case("Also: an uncompressed IDX file larger than the bound")
def _(d: Path):
    import importlib

    fm = importlib.import_module("resmlp.data.sources.fashion_mnist")
    (d / "x-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + struct.pack(">I", 4096) + bytes(4096))
    fm.MAX_IDX_BYTES, bound = 1024, fm.MAX_IDX_BYTES
    try:
        return refused(lambda: fm.read_idx(d / "x-idx1-ubyte"))
    finally:
        fm.MAX_IDX_BYTES = bound


@case("Also: a fresh run clears the temporaries of a killed write")
def _(d: Path):
    from resmlp.train import train

    (d / "run").mkdir()
    (d / "run" / ".last.safetensors.abc123.tmp").write_bytes(b"half")
    train("fashion-mnist-quick", d / "run", [a for a in TRAIN_TINY if a != "--set"] + ["train.compile=false"])
    return not (d / "run" / ".last.safetensors.abc123.tmp").exists(), "removed under the run's lock"


# ------------------------------------------------------------------------------------------ issue 44: image side
# One case per mechanism of issue 44 on the image side (T1 zip records, T2 constructor arguments, T3 links, T4
# pixel bound, T6 benchmark specs, T11 `models ''`, T14 '$' in class names, R resume options); the cases of its
# translation side are in their own group below. Names start with "I44" (`-k I44` runs them alone).
def _shared_records(path: Path, entries: int = 250, numel: int = 4096) -> Path:
    """torch.save of `entries` equal tensors whose directory entries all point at the first data record."""
    import zipfile

    torch.save({f"w{i}": torch.zeros(numel) for i in range(entries)}, path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        first = next(r for r in archive.infolist() if r.filename.endswith("/data/0"))
    at = data.find(b"PK\x01\x02")
    while at >= 0:
        name = bytes(data[at + 46: at + 46 + struct.unpack_from("<H", data, at + 28)[0]]).decode()
        if "/data/" in name:
            struct.pack_into("<I", data, at + 42, first.header_offset)
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))
    return path


@case("I44 T1 .pth whose 250 directory entries share one stored record (library read)")
def _(d: Path):
    from resmlp.checkpoint_reader import read_torch_file

    return refused(lambda: read_torch_file(_shared_records(d / "shared.pth")))


for _label, _argv in (("predict FILE IMAGE", ["predict", "{f}", "{img}"]),
                      ("eval FILE", ["eval", "{f}", "--data", "synthetic"]),
                      ("train --model FILE", ["train", "--output", "{d}/t", "--model", "{f}"]),
                      ("train --distill FILE", ["train", "--output", "{d}/k", "--distill", "{f}"]),
                      ("translate decode FILE", ["translate", "decode", "{f}"])):
    @case(f"I44 T1 shared-record .pth via `resmlp {_label}`")
    def _(d: Path, argv=_argv):
        shared, image = _shared_records(d / "shared.pth", 3, 1000), an_image(d / "a.png")
        return clean_cli_failure(*cli(*[a.format(f=shared, img=image, d=d) for a in argv]), "overlap")


for _label, _kwargs in (("checkpoint_path='aux.pth'", {"checkpoint_path": "aux.pth"}),
                        ("global_pool=''", {"global_pool": ""}), ("features_only=true", {"features_only": True})):
    @case(f"I44 T2 timm metadata with {_label} (`resmlp predict`)")
    def _(d: Path, kwargs=_kwargs):
        import timm

        tensors = {k: v.contiguous() for k, v in timm.create_model("test_resnet", num_classes=3).state_dict().items()}
        torch.save(tensors, d / "aux.pth")
        path = d / "m.safetensors"
        save_file(tensors, str(path), metadata={"format": "resmlp", "timm": json.dumps(
            {"name": "test_resnet", "kwargs": {"num_classes": 3, **kwargs}})})
        return clean_cli_failure(*cli("predict", str(path), str(an_image(d / "a.png"))))


for _override in ("model.depth=100000", "model.checkpoint_path=aux.pth", "model.global_pool=''"):
    @case(f"I44 T2 `resmlp train --model timm:test_resnet --set {_override}`")
    def _(d: Path, override=_override):
        start = time.perf_counter()
        ok, how = clean_cli_failure(*cli("train", "--output", str(d / "o"), "--model", "timm:test_resnet",
                                         "--set", override, *TRAIN_TINY[:2]))
        return ok and time.perf_counter() - start < 60, f"{how} ({time.perf_counter() - start:.1f} s)"


@case("I44 T3 a hard link planted as OUT/.lock (`resmlp train`)")
def _(d: Path):
    (d / "o").mkdir()
    victim = d / "victim"
    victim.write_text("precious\n")
    os.link(victim, d / "o" / ".lock")
    ok, how = clean_cli_failure(*cli("train", "--output", str(d / "o"), *TRAIN_TINY), "hard link")
    intact = victim.read_text() == "precious\n"
    return ok and intact, f"{how}; victim intact: {intact}"


@case("I44 T3 a FIFO planted as OUT/.lock (`resmlp eval --output`)")
def _(d: Path):
    (d / "o").mkdir()
    os.mkfifo(d / "o" / ".lock")
    path = tiny_checkpoint(d / "m.safetensors")
    return clean_cli_failure(*cli("eval", str(path), "--data", "synthetic", "--output", str(d / "o"), timeout=60),
                             "not a regular file")


@case("I44 T4 RESMLP_MAX_IMAGE_PIXELS=abc (`resmlp eval` on a folder)")
def _(d: Path):
    for split in ("train", "val", "test"):
        for cls in ("a", "b", "c"):
            (d / "data" / split / cls).mkdir(parents=True)
            an_image(d / "data" / split / cls / "x.png")
    path = saved_with_preprocess(d / "m.safetensors", img_size=16, crop_pct=1.0, mean=[0.5] * 3, std=[0.5] * 3,
                                 in_chans=3)
    return clean_cli_failure(*cli("eval", str(path), "--data", str(d / "data"),
                                  env={"RESMLP_MAX_IMAGE_PIXELS": "abc"}), "RESMLP_MAX_IMAGE_PIXELS")


@case("I44 T6 `resmlp benchmark --models 'timm:resnet10t[drop_rate=nan]'`")
def _(d: Path):
    return clean_cli_failure(*cli("benchmark", "--models", "timm:resnet10t[drop_rate=nan]"), "drop_rate")


@case("I44 T11 `resmlp models ''`")
def _(d: Path):
    return clean_cli_failure(*cli("models", ""), "matches ''")


@case("I44 T14 '$' in class names: the confusion matrix is written")
def _(d: Path):
    from resmlp.reporting import plot_confusion_matrix

    path = plot_confusion_matrix(d / "cm.png", np.eye(3, dtype=int), ["$^$", "$$", r"$\frac$"])
    return path.stat().st_size > 0, f"{path.name} written, {path.stat().st_size} bytes"


for _flags in (["--set", "train.seed=5"], ["--drop-path", "0.2"], ["--opt", "sgd"]):
    @case(f"I44 R `resmlp train --resume {' '.join(_flags)}` of a run trained otherwise")
    def _(d: Path, flags=_flags):
        rc, err = cli("train", "--output", str(d / "o"), *TRAIN_TINY)
        if rc:
            return False, f"the run to resume failed: {err.splitlines()[-1][:150]}"
        return clean_cli_failure(*cli("train", "--output", str(d / "o"), "--resume", *flags), "was")


@case("I44 R `resmlp finetune CKPT --output RUN --resume` of a --freeze 1 run (the run's options kept)")
def _(d: Path):
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, dim=16, depth=1, num_classes=4, in_chans=1)
    start = resmlp.save(model, d / "start.safetensors")
    sets = [a for a in TRAIN_TINY if not a.startswith("model.") and a != "--set"]
    flags = [x for s in sets for x in ("--set", s)]
    rc, err = cli("finetune", str(start), "--output", str(d / "o"), "--freeze", "1", *flags)
    if rc:
        return False, f"the run to resume failed: {err.splitlines()[-1][:150]}"
    rc, err = cli("finetune", str(start), "--output", str(d / "o"), "--resume", "--epochs", "2")
    return rc == 0, f"exit {rc}{': ' + err.splitlines()[-1][:150] if rc else ', resumed to epoch 2'}"


# ------------------------------------------------------------------------------------------ translation corpora
def _corpus(root: Path, bad: dict[str, bytes]) -> Path:
    root.mkdir()
    for split, start in (("train", 0), ("valid", 60), ("test", 70)):
        for lang in ("en", "fr"):
            lines = "".join(f"{lang} {n} {n % 7}\n" for n in range(start, start + 10 if split != "train" else 60))
            (root / f"{split}.{lang}").write_bytes(bad.get(f"{split}.{lang}", lines.encode()))
    return root


for _label, _bad, _words in (
        ("invalid UTF-8", {"train.fr": b"un\n\xff\xfe deux\n" * 30}, "UTF-8"),
        ("an empty line", {"valid.en": b"one\n\ntwo\n" + b"x\n" * 7}, "empty"),
        ("mismatched line counts", {"test.fr": b"un\n" * 3}, "lines"),
        ("a 10 MB line", {"train.en": b"word " * 2_000_000 + b"\n" + b"en 1 1\n" * 59}, "")):
    @case(f"`resmlp translate train` on a corpus with {_label}")
    def _(d: Path, bad=_bad, words=_words):
        data = _corpus(d / "c", bad)
        rc, err = cli("translate", "train", "--data", str(data), "--src-suffix", "en", "--tgt-suffix", "fr",
                      "--preset", "tiny", "--vocab-size", "40", "--max-tokens", "256", "--max-steps", "2",
                      "--eval-every", "2", "--beam", "1", "--threads", "1", "--output", str(d / "o"))
        if words:
            return clean_cli_failure(rc, err, words)
        warned = [line for line in err.splitlines() if "dropped" in line]  # the over-long pair, as fairseq
        return "Traceback" not in err and rc == 0 and bool(warned), f"exit {rc}: {(warned or ['no warning'])[0][:150]}"


# ------------------------------------------------------------------------------------------ translation: issue 36
# One case per mechanism of the translation side (M8 corpora, tokenizer, NaN weights; M9 run folders and resume;
# M10 planted symlinks; M11 flags; M3 checkpoint sizes). A tiny run is trained once and copied into each case.
_TRANSLATION_TRAIN = ["--src-suffix", "en", "--tgt-suffix", "fr", "--preset", "tiny", "--vocab-size", "60",
                      "--max-tokens", "256", "--max-steps", "2", "--eval-every", "2", "--beam", "1", "--threads", "1",
                      "--no-progress"]
_TRANSLATION_RUN: dict[str, Path] = {}
_KEEP = tempfile.TemporaryDirectory()  # the trained run, shared by the cases, removed at exit


def _translation_run(d: Path) -> Path:
    """A copy, in `d`, of a finished two-step run (its corpus stays where config.json names it)."""
    if not _TRANSLATION_RUN:
        root = Path(_KEEP.name)
        data = _corpus(root / "corpus", {})
        rc, err = cli("translate", "train", "--data", str(data), *_TRANSLATION_TRAIN, "--output", str(root / "run"))
        if rc != 0:
            raise RuntimeError(f"training the shared run failed: {err[-300:]}")
        _TRANSLATION_RUN.update(run=root / "run", data=data)
    copy = d / "run"
    copy.mkdir()
    for name in ("checkpoint.pt", "tokenizer.model", "config.json", "log.csv"):
        (copy / name).write_bytes((_TRANSLATION_RUN["run"] / name).read_bytes())
    return copy


def _resume(run: Path, *extra: str) -> tuple[int, str]:
    return cli("translate", "train", "--data", str(_TRANSLATION_RUN["data"]), *_TRANSLATION_TRAIN, "--output",
               str(run), "--resume", *extra)


def _edit_translation_checkpoint(run: Path, edit: Callable[[dict], None]) -> Path:
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, run / "checkpoint.pt")
    return run


@case("translation corpus with a form feed and U+2028 inside lines (M8: pairs stay aligned)")
def _(d: Path):
    from resmlp.seq2seq.data import read_parallel

    (d / "a.en").write_text("one\x0cx\ntwo\nthree\n", encoding="utf-8")
    (d / "a.fr").write_text("un\ndeux\ntrois\u2028y\n", encoding="utf-8")
    src, tgt = read_parallel(d / "a.en", d / "a.fr")
    pairs = [(s[:3], t[:2]) for s, t in zip(src, tgt, strict=True)]
    return pairs == [("one", "un"), ("two", "de"), ("thr", "tr")], f"{len(pairs)} pairs: {pairs}"


@case("`resmlp translate train` on an empty corpus (M8)")
def _(d: Path):
    data = _corpus(d / "c", {"train.en": b"", "train.fr": b""})
    return clean_cli_failure(*cli("translate", "train", "--data", str(data), *_TRANSLATION_TRAIN, "--output",
                                  str(d / "o")), "empty")


@case("`resmlp translate eval` with a truncated tokenizer.model (M8)")
def _(d: Path):
    run = _translation_run(d)
    (run / "tokenizer.model").write_bytes((run / "tokenizer.model").read_bytes()[:100])
    return clean_cli_failure(*cli("translate", "eval", str(run), "--beam", "1"), "sentencepiece")


@case("`resmlp translate decode` with NaN weights in checkpoint.pt (M8)")
def _(d: Path):
    run = _edit_translation_checkpoint(_translation_run(d),
                                       lambda c: c["model"]["src_embed.weight"].__setitem__((5, 0), float("nan")))
    return clean_cli_failure(*cli("translate", "decode", str(run), "--input", str(_TRANSLATION_RUN["data"] /
                                                                                  "test.en")), "NaN")


@case("translation checkpoint.pt claiming dim 4096, vocabulary 200000, max_len 1e9 (M3)")
def _(d: Path):
    run = _edit_translation_checkpoint(_translation_run(d), lambda c: c["model_config"].update(
        dim=4096, vocab_size=200_000, max_len=10**9))
    t0 = time.time()
    rc, err = cli("translate", "eval", str(run), "--beam", "1")
    ok, how = clean_cli_failure(rc, err, "max_len")
    return ok, f"{how} ({time.time() - t0:.1f} s)"


@case("translation checkpoint.pt within limits but larger than its tensors (M3: compared on the meta device)")
def _(d: Path):
    from resmlp.seq2seq.runfolder import read_translation_checkpoint

    run = _edit_translation_checkpoint(_translation_run(d), lambda c: c["model_config"].update(
        dim=4096, vocab_size=200_000, max_len=4096, heads=8))
    return refused(lambda: read_translation_checkpoint(run / "checkpoint.pt"))


@case("translation checkpoint.pt with step a string (M9)")
def _(d: Path):
    run = _edit_translation_checkpoint(_translation_run(d), lambda c: c.update(step="2"))
    return clean_cli_failure(*_resume(run, "--max-steps", "3"), "step")


@case("translation config.json nested 100000 levels deep (M9)")
def _(d: Path):
    run = _translation_run(d)
    (run / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    return clean_cli_failure(*cli("translate", "eval", str(run), "--beam", "1"), "config.json")


@case("`resmlp translate train --resume` of a finished run (M9: trains no more)")
def _(d: Path):
    run = _translation_run(d)
    before = (run / "checkpoint.pt").read_bytes()
    rc, err = _resume(run)
    after = torch.load(run / "checkpoint.pt", weights_only=True)
    same = (run / "checkpoint.pt").read_bytes() == before
    return rc == 0 and same and after["step"] == 2, f"exit {rc}, step {after['step']}, checkpoint unchanged: {same}"


@case("`resmlp translate train --resume --optimizer adam` of an adagrad run (M9)")
def _(d: Path):
    return clean_cli_failure(*_resume(_translation_run(d), "--optimizer", "adam"), "--optimizer")


@case("new translation run over one killed before its first checkpoint, other data (M9: own tokenizer)")
def _(d: Path):
    run = _translation_run(d)
    old = (run / "tokenizer.model").read_bytes()
    (run / "checkpoint.pt").unlink()
    (run / ".checkpoint.pt.x1y2z3.tmp").write_bytes(b"half")
    other = _corpus(d / "other", {f"{split}.fr": "".join(f"autre {n} ü\n" for n in range(count)).encode()
                                  for split, count in (("train", 60), ("valid", 10), ("test", 10))})
    rc, err = cli("translate", "train", "--data", str(other), *_TRANSLATION_TRAIN, "--output", str(run))
    own = (run / "tokenizer.model").read_bytes() != old
    config = json.loads((run / "config.json").read_text())["data"] == str(other)
    stale = list(run.glob(".*.tmp"))
    return rc == 0 and own and config and not stale, (f"exit {rc}, new tokenizer: {own}, config names the new data: "
                                                      f"{config}, temporaries left: {len(stale)}")


@case("`resmlp translate train` with a log.csv symlink planted in the output folder (M10)")
def _(d: Path):
    out, victim = d / "o", d / "victim.txt"
    out.mkdir()
    victim.write_text("precious\n")
    (out / "log.csv").symlink_to(victim)
    data = _corpus(d / "c", {})
    rc, err = cli("translate", "train", "--data", str(data), *_TRANSLATION_TRAIN, "--output", str(out))
    intact, replaced = victim.read_text() == "precious\n", not (out / "log.csv").is_symlink()
    return rc == 0 and intact and replaced, f"exit {rc}, victim intact: {intact}, log.csv now a file: {replaced}"


@case("`resmlp translate train --task` with a data/ symlink planted in the output folder (M10)")
def _(d: Path):
    out, elsewhere = d / "o", d / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "data").symlink_to(elsewhere)
    rc, err = cli("translate", "train", "--task", "numbers-en-de", "--train-size", "100", "--preset", "tiny",
                  "--max-steps", "1", "--no-progress", "--output", str(out))
    ok, how = clean_cli_failure(rc, err, "symlink")
    return ok and not list(elsewhere.iterdir()), how


for _flag, _value in (("--eval-every", "0"), ("--layerscale-init", "nan"), ("--max-minutes", "nan"),
                      ("--vocab-size", "4"), ("--encoder-layers", "100000"), ("--lenpen", "nan")):
    @case(f"`resmlp translate train {_flag} {_value}` (M11)")
    def _(d: Path, flag=_flag, value=_value):
        return clean_cli_failure(*cli("translate", "train", "--task", "numbers-en-de", "--output", str(d / "o"),
                                      flag, value), flag)

# ------------------------------------------------------------------------------------------ issue 44t: translation
# ------------------------------------------------------------------------------------------ and gpu_report --merge
# (issue 44's T7 resume options, T8 corpus text, T9 the documented WMT pairing, T10 a broken sacremoses, T12
# gpu_report --merge; the image side's cases of issue 44 are another group)
def _resume_output_alone(run: Path, *extra: str) -> tuple[int, str]:
    """`translate train --output RUN --resume ...` without --task/--data: before, every option flag was dropped."""
    return cli("translate", "train", "--output", str(run), "--resume", "--no-progress", *extra)


for _flag, _value, _old in (("--dropout", "0.3", "0.1"), ("--dim", "64", "32"), ("--seed", "5", "0"),
                            ("--lr", "0.5", "0.2"), ("--recipe", "wmt14-en-de", "'tiny'"),
                            ("--vocab-size", "90", "60"), ("--label-smoothing", "0.2", "0.1"),
                            ("--arch", "transformer", "'resmlp'"), ("--max-tokens", "100", "256"),
                            ("--optimizer", "adam", "'adagrad'")):
    @case(f"T7 `resmlp translate train --output RUN --resume {_flag} {_value}` (no --data)")
    def _(d: Path, flag=_flag, value=_value, old=_old):
        run = _translation_run(d)
        before = (run / "checkpoint.pt").read_bytes()
        ok, how = clean_cli_failure(*_resume_output_alone(run, "--max-steps", "3", flag, value), f"was {old}")
        return ok and (run / "checkpoint.pt").read_bytes() == before, how


@case("T8 `resmlp translate eval --src --ref` on a 3-sentence test set with old-Mac (CR) line ends")
def _(d: Path):
    run = _translation_run(d)
    (d / "t.en").write_bytes(b"en 1 1\ren 2 2\ren 3 3\r")
    (d / "t.fr").write_bytes(b"fr 1 1\rfr 2 2\rfr 3 3\r")
    return clean_cli_failure(*cli("translate", "eval", str(run), "--beam", "1", "--src", str(d / "t.en"),
                                  "--ref", str(d / "t.fr")), "carriage return")


for _label, _line in (("U+200B", "\u200b"), ("U+FEFF", "\ufeff"), ("U+2060 and U+200C", "\u2060\u200c")):
    @case(f"T8 `resmlp translate train` on a corpus with a line of only {_label}")
    def _(d: Path, line=_line):
        data = _corpus(d / "c", {"valid.en": f"en 1 1\n{line}\n".encode() + b"en 3 3\n" * 8})
        return clean_cli_failure(*cli("translate", "train", "--data", str(data), *_TRANSLATION_TRAIN, "--output",
                                      str(d / "o")), "empty line")


@case("T8 a BOM before the first reference of `translate eval --ref` (and the first source)")
def _(d: Path):
    from resmlp.seq2seq.data import read_parallel

    (d / "t.en").write_bytes("\ufeffone\ntwo\n".encode())
    (d / "t.fr").write_bytes("\ufeffun\r\ndeux\r\n".encode())
    pairs = read_parallel(d / "t.en", d / "t.fr")
    return pairs == (["one", "two"], ["un", "deux"]), f"read {pairs}"


@case("T9 the WMT pairing of docs/translation.md on corpora of 30 and 29 lines")
def _(d: Path):
    import re

    doc = (Path(SRC).parent / "docs" / "translation.md").read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"^```bash\n(.*?)^```", doc, re.S | re.M) if "paste corpus.en" in b)
    (d / "DIR").mkdir()
    (d / "corpus.en").write_text("".join(f"s{i}\n" for i in range(30)))
    (d / "corpus.de").write_text("".join(f"t{i}\n" for i in range(30) if i != 5))
    done = subprocess.run(["bash", "-c", block], cwd=d, capture_output=True, text=True, timeout=60)
    written = sorted(p.name for p in (d / "DIR").iterdir())
    return done.returncode != 0 and not written, f"exit {done.returncode}: {done.stderr.strip()[:150]}; wrote {written}"


@case("T10 a broken sacremoses install (raises on import) under `resmlp translate eval`")
def _(d: Path):
    run = _translation_run(d)
    (d / "site" / "sacremoses").mkdir(parents=True)
    (d / "site" / "sacremoses" / "__init__.py").write_text("raise RuntimeError('half-upgraded')\n")
    return clean_cli_failure(*cli("translate", "eval", str(run), "--beam", "1",
                                  env={"PYTHONPATH": f"{d / 'site'}{os.pathsep}{SRC}"}), "sacremoses")


_REPORT = Path(SRC).parent / "docs" / "gpu" / "report-2026-11-25.json"  # a real report (the H100 run)


def _merge(*paths: Path, out: Path) -> tuple[int, str]:
    """gpu_report.py --merge in a subprocess: 1 GiB of address space, 60 s (a FIFO hung it; /dev/zero ran out of
    memory)."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    cmd = [sys.executable, str(Path(SRC).parent / "benchmarks" / "gpu_report.py"), "--merge", *map(str, paths),
           "--out", str(out)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, preexec_fn=limit,
                              env={**os.environ, "PYTHONPATH": SRC})
    except subprocess.TimeoutExpired:
        return -1, "hung for 60 s"
    return proc.returncode, proc.stderr.strip()


for _link in ("symlink", "hard link"):
    @case(f"T12 `gpu_report.py --merge` with a {_link} planted at OUT/gpu_report.json.tmp")
    def _(d: Path, link=_link):
        victim, out = d / "victim.txt", d / "out"
        victim.write_text("precious\n")
        out.mkdir()
        (os.symlink if link == "symlink" else os.link)(victim, out / "gpu_report.json.tmp")
        rc, err = _merge(_REPORT, out=out)
        intact = victim.read_text() == "precious\n"
        return rc == 0 and intact, f"exit {rc}, victim intact: {intact}"


for _label, _text, _words in (
        ("an exit status 'maybe'", lambda r: r["parts"]["guard"].update(exit="maybe"), "parts.guard.exit"),
        ("a negative img/s", lambda r: r["parts"]["raw-step"]["batch128"]["img_s"].update(ours=-5),
         "img_s.ours"),
        ("a guard row without plain_ms", lambda r: r["parts"]["guard"]["results"][0].pop("plain_ms"), "plain_ms"),
        ("summary a list", lambda r: r["parts"]["quickstart"].update(summary=[1]), "summary")):
    @case(f"T12 `gpu_report.py --merge` of a report with {_label}")
    def _(d: Path, edit=_text, words=_words):
        report = json.loads(_REPORT.read_text())
        edit(report)
        (d / "r.json").write_text(json.dumps(report))
        ok, how = clean_cli_failure(*_merge(d / "r.json", out=d / "out"), words)
        return ok and not (d / "out").exists(), how


for _label, _text in (("NaN", '{"machines": [], "parts": {"guard": {"exit": 0, "seconds": NaN}}}'),
                      ("1e999", '{"machines": [], "parts": {"guard": {"exit": 0, "seconds": 1e999}}}'),
                      ("nesting 100000 deep", "[" * 100_000 + "]" * 100_000)):
    @case(f"T12 `gpu_report.py --merge` of a report holding {_label}")
    def _(d: Path, text=_text):
        (d / "r.json").write_text(text)
        return clean_cli_failure(*_merge(d / "r.json", out=d / "out"), "not a gpu_report.json")


@case("T12 `gpu_report.py --merge` of a FIFO and of /dev/zero")
def _(d: Path):
    os.mkfifo(d / "fifo.json")
    results = [clean_cli_failure(*_merge(path, out=d / "out"), "not a regular file")
               for path in (d / "fifo.json", Path("/dev/zero"))]
    return all(ok for ok, _ in results), "; ".join(how for _, how in results)


@case("T12 `gpu_report.py --merge` of two reports holding the same part")
def _(d: Path):
    return clean_cli_failure(*_merge(_REPORT, _REPORT, out=d / "out"), "is also in")


# ------------------------------------------------------------------------------------------ issue 48
# One case (or a few) per mechanism of issue 48 (hostile inputs, fourth round: the new data sources trust their own
# bookkeeping), each written from the issue's description against the CLI and API as documented. Names start with
# "I48 N" (N: the mechanism's number; `-k I48` runs them alone). Where the issue names memory, the case runs in a
# child process and reads that child's peak resident memory.
FOLDER_TINY = ["--set", "model.img_size=16", "--set", "model.patch_size=4", "--set", "model.dim=16", "--set",
               "model.depth=1", "--set", "model.in_chans=3", "--set", "schedule.epochs=1", "--set",
               "schedule.warmup_epochs=0", "--set", "train.batch_size=4", "--set", "train.progress=false",
               "--set", "data.num_workers=0", "--set", "train.threads=1", "--set", "train.compile=false"]
PEAK_MIB = 1024  # what a refusal may take: the interpreter, numpy, torch, and the first bytes of the input
# the child's peak from /proc (VmHWM, of its own address space since exec): getrusage's ru_maxrss keeps the
# resident size of the parent it was forked from, which after the 8000x8000 case is above the bound
CHILD = """
import re, sys
try:
    exec(sys.argv[1])
    outcome = "accepted"
except Exception as e:
    from resmlp.errors import ResmlpError
    first = str(e).splitlines()[0][:150] if str(e) else ""
    clean = isinstance(e, (ResmlpError, FileNotFoundError))
    outcome = f"{'refused' if clean else 'uncaught'} {type(e).__name__}: {first}"
print(outcome)
print(int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1)) >> 10)
"""


def in_child(code: str, timeout: float = 300, env: dict | None = None) -> tuple[str, int]:
    """`code` run in a child interpreter: its outcome ('accepted', 'refused TYPE: message', 'uncaught ...',
    'killed ...') and its peak resident memory in MiB."""
    run_env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", **(env or {})}
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, code], capture_output=True, text=True, timeout=timeout,
                              env=run_env)
    except subprocess.TimeoutExpired:
        return f"hung for {timeout:.0f} s", 0
    lines = proc.stdout.strip().splitlines()
    if proc.returncode or len(lines) < 2:
        return f"killed (exit {proc.returncode}): {(proc.stderr.strip().splitlines() or [''])[-1][:150]}", 0
    return lines[-2], int(lines[-1])


def refused_small(outcome: str, peak: int, words: str = "") -> tuple[bool, str]:
    """Refused in one line (naming `words`) within PEAK_MIB of memory."""
    return outcome.startswith("refused") and words in outcome and peak < PEAK_MIB, f"{outcome} (peak {peak} MiB)"


def image_folder(root: Path, splits: tuple[str, ...] = ("train",), classes: tuple[str, ...] = ("a", "b"),
                 per_class: int = 2) -> Path:
    for split in splits:
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            for i in range(per_class):
                an_image(root / split / cls / f"{i}.png")
    return root


class _Killed(Exception):
    """Raised by the shard writer's log after its first shard: a kill at a shard boundary."""


def killed_shards(d: Path) -> tuple[Path, Path]:
    """A folder source and an OUT where `resmlp data shards` was killed after its first shard (index.partial.json
    left behind)."""
    from resmlp.data.shards import write_shards
    from resmlp.data.sources import open_source

    src, out = image_folder(d / "src", per_class=3), d / "shards"

    def kill(line: str) -> None:
        raise _Killed(line)
    with contextlib.suppress(_Killed):
        write_shards(open_source(f"folder:{src}"), out, 1 << 30, shard_records=2, log=kill)
    return src, out


def finished_shards(d: Path, seed: int = 0) -> Path:
    """OUT of a finished `resmlp data shards` of a small folder (6 training images, 2 carved into val)."""
    from resmlp.data.shards import write_shards
    from resmlp.data.sources import open_source

    src = d / "src" if (d / "src").is_dir() else image_folder(d / "src", per_class=3)
    write_shards(open_source(f"folder:{src}"), d / "shards", 1 << 30, seed=seed, shard_records=2, val_size=2,
                 log=lambda line: None)
    return d / "shards"


@case("I48 1 `resmlp data shards` with a symlink planted at OUT/train-000000.tar.tmp")
def _(d: Path):
    src, out, victim = image_folder(d / "src"), d / "out", d / "victim"
    victim.write_text("precious\n")
    out.mkdir()
    (out / "train-000000.tar.tmp").symlink_to(victim)
    rc, err = cli("data", "shards", f"folder:{src}", str(out))
    intact = victim.read_bytes() == b"precious\n"  # bytes: a tar written through the link is not text
    return intact and "Traceback" not in err, f"exit {rc}, victim intact: {intact}"


for _flags, _words in ((["--shard-records", "-1"], "shard"), (["--val-size", "-3"], "val"),
                       (["--val-size", "100"], "val")):
    @case(f"I48 2 `resmlp data shards {' '.join(_flags)}` (4 training records)")
    def _(d: Path, flags=_flags, words=_words):
        try:
            rc, err = cli("data", "shards", f"folder:{image_folder(d / 'src')}", str(d / "out"), *flags, timeout=60)
        except subprocess.TimeoutExpired:
            return False, "ran for 60 s (a loop)"
        return clean_cli_failure(rc, err, words)


for _label, _edit in (("a negative position", lambda s: s["next"].update(train=-5)),
                      ("a huge position", lambda s: s["next"].update(train=10**15)),
                      ("a shard named ../victim.tar", lambda s: s["splits"]["train"][0].update(name="../victim.tar")),
                      ("a string position", lambda s: s["next"].update(train="2"))):
    @case(f"I48 3 `resmlp data shards` resumed over an index.partial.json with {_label}")
    def _(d: Path, edit=_edit):
        src, out = killed_shards(d)
        (d / "victim.tar").write_text("precious\n")
        state = json.loads((out / "index.partial.json").read_text())
        edit(state)
        (out / "index.partial.json").write_text(json.dumps(state))
        ok, how = clean_cli_failure(*cli("data", "shards", f"folder:{src}", str(out), "--shard-records", "2"))
        return ok and (d / "victim.tar").read_bytes() == b"precious\n", how


@case("I48 3 `resmlp data shards` resumed after an image was added to the source")
def _(d: Path):
    src, out = killed_shards(d)
    an_image(src / "train" / "a" / "added.png")
    return clean_cli_failure(*cli("data", "shards", f"folder:{src}", str(out), "--shard-records", "2"))


@case("I48 4 WebDataset labels '²', '--1', 5,000 digits and a .json nested 100000 deep: skipped and counted")
def _(d: Path):
    import webdataset as wds

    from resmlp.data.records import StreamPlan, Unreadable
    from resmlp.data.sources import open_source

    png = an_image(d / "x.png").read_bytes()
    with open(d / "train-000000.tar", "wb") as stream, wds.TarWriter(stream, encoder=False) as writer:
        for key, member, value in (("good", "cls", b"1"), ("sup", "cls", "²".encode()), ("neg", "cls", b"--1"),
                                   ("long", "cls", b"9" * 5000), ("deep", "json", b"[" * 100_000 + b"]" * 100_000)):
            writer.write({"__key__": key, "png": png, member: value})
    (d / "classes.txt").write_text("a\nb\n")
    try:
        records = open_source(f"wds:{d}/train-{{000000..000000}}.tar", class_map=str(d / "classes.txt"))
        got = list(records.records("train").samples(StreamPlan(train=False)))
    except Exception as e:  # noqa: BLE001 - one bad label must not stop the run
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
    bad = sum(isinstance(payload, Unreadable) for _, payload, _ in got)
    return bad == 4 and len(got) == 5, f"{len(got) - bad} read, {bad} skipped as unreadable"


for _label, _edit in (("a shard listed twice", lambda i: i["splits"]["train"].append(i["splits"]["train"][0])),
                      ("a negative count", lambda i: i["splits"]["train"][0].update(samples=-2)),
                      ("a boolean count", lambda i: i["splits"]["train"][0].update(samples=True)),
                      ("a class named twice", lambda i: i.update(classes=["a", "a"]))):
    @case(f"I48 5 WebDataset index.json with {_label}")
    def _(d: Path, edit=_edit):
        from resmlp.data.sources import open_source

        out = finished_shards(d)
        index = json.loads((out / "index.json").read_text())
        edit(index)
        (out / "index.json").write_text(json.dumps(index))
        return refused(lambda: open_source(f"wds:{out}"))


@case("I48 6 WebDataset mid-epoch resume over shards rewritten with the same counts and sizes")
def _(d: Path):
    out = finished_shards(d)
    # 4 training records in batches of 2: the state after step 1 is in the middle of the epoch
    args = ["train", "--output", str(d / "run"), "--data", f"wds:{out}", *FOLDER_TINY, "--set",
            "train.batch_size=2", "--set", "train.checkpoint_every_steps=1", "--max-steps", "1"]
    rc, err = cli(*args)
    if rc:
        return False, f"the run to resume failed: {err.splitlines()[-1][:150] if err else rc}"
    for path in out.iterdir():
        path.unlink()
    finished_shards(d, seed=1)  # the same images in another order: the same counts and sizes
    return clean_cli_failure(*cli("train", "--output", str(d / "run"), "--resume"), "shard")


def _undecodable_jpegs(root: Path, splits: tuple[str, ...] = ("train", "val")) -> Path:
    """JPEGs whose headers are sound and whose scans are garbage: they pass the workers' header check and
    fail in the device's decoder."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buffer, "JPEG")
    data = buffer.getvalue()
    scan = data.index(b"\xff\xda")
    broken = data[:scan + 12] + bytes(range(256)) * 4 + b"\xff\xd9"
    for split in splits:
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(2):
                (root / split / cls / f"{i}.jpg").write_bytes(broken)
    return root


@case("I48 7 device pipeline: a batch in which no image decodes (`resmlp train --set data.pipeline=device`)")
def _(d: Path):
    data = _undecodable_jpegs(d / "data")
    rc, err = cli("train", "--output", str(d / "o"), "--data", f"folder:{data}", *FOLDER_TINY, "--set",
                  "data.pipeline=device")
    return "Traceback" not in err and "IndexError" not in err, f"exit {rc}: {err.splitlines()[-1][:150] if err else ''}"


@case("I48 8 device pipeline: a batch of 4 JPEGs of 8000x8000 (pixels one decode call is asked for)")
def _(d: Path):
    # decode_jpeg's outputs, counted where the pipeline calls it: on a GPU that is device memory, which a host
    # measure does not see (on this CPU the host's peak is the timm path's); the timm path holds one image
    import torchvision.io

    import resmlp.data.device.decode as device_decode
    from resmlp.cli import main as resmlp_main
    from resmlp.data.images import DEFAULT_MAX_PIXELS

    Image.new("RGB", (8000, 8000), (90, 120, 30)).save(d / "big.jpg", quality=50)
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (d / "data" / split / cls).mkdir(parents=True)
            for i in range(2):
                os.link(d / "big.jpg", d / "data" / split / cls / f"{i}.jpg")
    asked: list[int] = []
    real = torchvision.io.decode_jpeg

    def counted(data, *args, **kwargs):
        out = real(data, *args, **kwargs)
        asked.append(sum(t.numel() // t.shape[0] for t in (out if isinstance(out, list) else [out])))
        return out
    device_decode.decode_jpeg = torchvision.io.decode_jpeg = counted
    try:  # the run's own lines kept out of this script's table
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            rc = resmlp_main(["train", "--output", str(d / "o"), "--data", f"folder:{d / 'data'}", *FOLDER_TINY,
                              "--set", "data.pipeline=device"])
    finally:
        device_decode.decode_jpeg = torchvision.io.decode_jpeg = real
    most = max(asked, default=0)  # the bound is per batch (device_decode.DEVICE_BATCH_PIXELS, whatever its size)
    return rc == 0 and most <= device_decode.DEVICE_BATCH_PIXELS, \
        f"exit {rc}; at most {most:,} pixels in one of {len(asked)} decode calls (the batch bound: " \
        f"{device_decode.DEVICE_BATCH_PIXELS:,}; one image's: {DEFAULT_MAX_PIXELS:,})"


@case("I48 9 a class map of 300,000 lines (folder source)")
def _(d: Path):
    image_folder(d / "data")
    (d / "classes.txt").write_text("a\nb\n" + "".join(f"n{i:08d}\n" for i in range(299_998)))
    return refused_small(*in_child(f"from resmlp.data.sources import open_source; open_source("
                                   f"'folder:{d / 'data'}', class_map='{d / 'classes.txt'}').records('train')"))


@case("I48 9 a WebDataset index.json naming 300,000 classes")
def _(d: Path):
    out = finished_shards(d)
    index = json.loads((out / "index.json").read_text())
    index["classes"] = [f"n{i:08d}" for i in range(300_000)]
    (out / "index.json").write_text(json.dumps(index))
    return refused_small(*in_child(f"from resmlp.data.sources import open_source; open_source('wds:{out}')"))


@case("I48 9 an hf: dataset whose label column (no ClassLabel) holds 2**31")
def _(d: Path):
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    datasets.Dataset.from_dict({"image": [str(an_image(d / "x.png"))] * 2, "label": [0, 2**31]},
                               features=features).save_to_disk(d / "hf")
    return refused_small(*in_child(f"from resmlp.data.sources import open_source; open_source('hf:{d / 'hf'}')"),
                         "label")


def _flat_val(d: Path, truth: str) -> str:
    """A folder with train/<class>/ and a flat val/ labelled by val.txt; the code that lists val in a child."""
    image_folder(d / "data", classes=("a", "b"))
    (d / "data" / "val").mkdir()
    for name in ("x.png", "y.png"):
        an_image(d / "data" / "val" / name)
    (d / "data" / "val.txt").write_bytes(truth.encode())
    return f"from resmlp.data.sources import open_source; open_source('folder:{d / 'data'}').records('val')"


for _label, _truth in (("one image listed twice with different labels", "x.png a\ny.png b\nx.png b\n"),
                       ("a label '²'", "x.png a\ny.png ²\n")):
    @case(f"I48 10 ImageNet val.txt with {_label}")
    def _(d: Path, truth=_truth):
        return refused_small(*in_child(_flat_val(d, truth)), "val.txt")


@case("I48 10 ImageNet val.txt starting with a BOM: read, not blamed on the image name")
def _(d: Path):
    outcome, peak = in_child(_flat_val(d, "\ufeffx.png a\ny.png b\n"))
    return outcome == "accepted", f"{outcome} (peak {peak} MiB)"


@case("I48 10 LOC_val_solution.csv of 20 M blank lines")
def _(d: Path):
    code = _flat_val(d, "")
    (d / "data" / "val.txt").unlink()
    (d / "data" / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nx,a 1 1 2 2\ny,b 1 1 2 2\n"
                                                      + "\n" * 20_000_000)
    outcome, peak = in_child(code)
    return peak < PEAK_MIB and not outcome.startswith(("uncaught", "killed")), f"{outcome} (peak {peak} MiB)"


@case("I48 11 a symlinked OUTPUT/data_index (`resmlp train` on a folder)")
def _(d: Path):
    data = image_folder(d / "data", splits=("train", "val"))
    (d / "run").mkdir()
    (d / "elsewhere").mkdir()
    (d / "run" / "data_index").symlink_to(d / "elsewhere")
    rc, err = cli("train", "--output", str(d / "run"), "--data", f"folder:{data}", *FOLDER_TINY)
    untouched = not any((d / "elsewhere").iterdir())
    return untouched and "Traceback" not in err, f"exit {rc}, nothing written through the link: {untouched}"


@case("I48 11 a tampered folder index cache naming ../../../etc/passwd")
def _(d: Path):
    from resmlp.data.sources import open_source
    from resmlp.data.sources.imagenet import PackedNames

    data = image_folder(d / "data")
    open_source(f"folder:{data}", index_cache=d / "cache").records("train")
    (cached,) = (d / "cache" / "data_index").glob("train-*.npz")
    with np.load(cached) as saved:
        arrays = dict(saved)
    names = PackedNames.pack(["../../../etc/passwd"] * (len(arrays["offsets"]) - 1))
    arrays.update(buffer=names.buffer, offsets=names.offsets)
    np.savez(cached, **arrays)
    try:
        records = open_source(f"folder:{data}", index_cache=d / "cache").records("train")
    except ResmlpError as e:
        return True, f"{type(e).__name__}: {str(e).splitlines()[0][:150]}"
    names = [records.name(i) for i in range(len(records))]
    trusted = any("passwd" in n for n in names)
    return not trusted, f"cached names {'trusted: ' + names[0] if trusted else 'not trusted (listed again)'}"


def _tar_of(d: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> Path:
    path = d / "data.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, data: bytes | None = None, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data or b"")
    if kind == tarfile.DIRTYPE:
        info.mode = 0o755
    return info, data


@case("I48 12 a tar whose image is a GNU sparse member (folder:FILE.tar)")
def _(d: Path):
    from resmlp.data.sources import open_source

    png = an_image(d / "x.png").read_bytes()
    path = _tar_of(d, [_member(f"train/{c}/{i}.png", png) for c in "ab" for i in range(2)], tarfile.GNU_FORMAT)
    raw = bytearray(path.read_bytes())  # the first member's type flag made 'S' (GNU sparse), its checksum redone
    raw[156:157] = tarfile.GNUTYPE_SPARSE
    raw[148:156] = b" " * 8
    raw[148:155] = f"{sum(raw[:512]):06o}\0".encode()
    path.write_bytes(bytes(raw))
    try:
        records = open_source(f"folder:{path}").records("train")
        payloads = [bytes(records[i][0]) for i in range(len(records))]
    except ResmlpError as e:
        message = str(e).splitlines()[0]
        return "sparse" in message and "truncated" not in message, f"{type(e).__name__}: {message[:150]}"
    intact = sum(p == png for p in payloads)
    return intact == 4, f"{len(payloads)} records read, {intact} of them the image stored"


@case("I48 12 a tar member name of 60,000 path components")
def _(d: Path):
    png = an_image(d / "x.png").read_bytes()
    path = _tar_of(d, [_member("train/a/0.png", png), _member("train/b/0.png", png),
                       _member("train/a/" + "x/" * 60_000 + "0.png", png)])
    return refused_small(*in_child(f"from resmlp.data.sources import open_source; "
                                   f"open_source('folder:{path}').records('train')"))


@case("I48 12 a symlinked class folder inside a tar")
def _(d: Path):
    from resmlp.data.sources import open_source

    png = an_image(d / "x.png").read_bytes()
    path = _tar_of(d, [_member("train/a/0.png", png), _member("train/a/1.png", png),
                       _member("train/b", kind=tarfile.SYMTYPE, link="a")])
    return refused(lambda: open_source(f"folder:{path}").records("train"))


for _env, _name in (({"SLURM_NTASKS": "0", "SLURM_PROCID": "0"}, "SLURM_NTASKS"),
                    ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "http"}, "MASTER_PORT"),
                    ({"LOCAL_RANK": "x"}, "LOCAL_RANK")):
    @case(f"I48 13 `resmlp train` under {' '.join(f'{k}={v}' for k, v in _env.items())}")
    def _(d: Path, env=_env, name=_name):
        return clean_cli_failure(*cli("train", "--output", str(d / "o"), *TRAIN_TINY, env=env, timeout=120), name)


@case("I48 14 `resmlp train --dry-run --data folder:DIR` reports DIR's classes")
def _(d: Path):
    data = image_folder(d / "data", classes=("a", "b", "c", "d", "e"), per_class=1)
    proc = subprocess.run([sys.executable, "-m", "resmlp", "train", "--output", str(d / "o"), "--data",
                           f"folder:{data}", "--dry-run"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"})
    line = next((line for line in proc.stdout.splitlines() if "classes (" in line), proc.stderr[-150:])
    return proc.returncode == 0 and " 5 classes (" in line, line.strip()[:150]


@case("I48 15 `translate average`: checkpoint_6.pt and checkpoint_06.pt are not two checkpoints of step 6")
def _(d: Path):
    import shutil

    from resmlp.seq2seq.averaging import average_last, keep_checkpoint

    model = build_translation_model(translation_model_config("tiny", 19))
    keep_checkpoint(d, model, 6, 5)
    shutil.copy(d / "checkpoint_6.pt", d / "checkpoint_06.pt")
    return refused(lambda: average_last(d, 2))


for _label, _entry in (("no epoch", {"score": 1.0, "file": "checkpoint-1.safetensors"}),
                       ("a string score", {"epoch": 1, "score": "90", "file": "checkpoint-1.safetensors"}),
                       ("a NaN score", {"epoch": 1, "score": float("nan"), "file": "checkpoint-1.safetensors"})):
    @case(f"I48 16 checkpoints.json entry with {_label}, at the next epoch's write")
    def _(d: Path, entry=_entry):
        from resmlp.train.history import keep_best

        (d / "checkpoints.json").write_text(json.dumps({"keep": 2, "checkpoints": [entry]}))
        return refused(lambda: keep_best(d, 2, tiny_model(), {}, 2, 50.0))


@case("I48 17 a WebDataset pattern {0..99999999} (10^8 names)")
def _(d: Path):
    start = time.perf_counter()
    ok, how = refused_small(*in_child(f"from resmlp.data.sources import open_source; "
                                      f"open_source('wds:{d}/train-{{0..99999999}}.tar')", timeout=120))
    return ok, f"{how} ({time.perf_counter() - start:.1f} s)"


def _hf_saved(path: Path) -> Path:
    import datasets

    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b"])})
    image = str(an_image(path.parent / "x.png"))
    datasets.Dataset.from_dict({"image": [image] * 2, "label": [0, 1]}, features=features).save_to_disk(path)
    return path


def _hf_two_schemas(d: Path) -> Path:
    import datasets

    (d / "hf").mkdir()
    for i, (kind, label) in enumerate((("int64", 0), ("string", "x"))):
        features = datasets.Features({"image": datasets.Image(), "label": datasets.Value(kind)})
        datasets.Dataset.from_dict({"image": [str(an_image(d / "x.png"))], "label": [label]},
                                   features=features).to_parquet(d / "hf" / f"train-{i}.parquet")
    return d / "hf"


def _hf_lying_info(d: Path) -> Path:
    path = _hf_saved(d / "hf")
    info = json.loads((path / "dataset_info.json").read_text())
    info["features"]["extra"] = {"_type": "Value", "dtype": "int64"}
    (path / "dataset_info.json").write_text(json.dumps(info))
    return path


def _hf_empty(d: Path) -> Path:
    import datasets

    datasets.DatasetDict({}).save_to_disk(d / "hf")
    return d / "hf"


def _hf_outside(d: Path) -> Path:
    other, path = _hf_saved(d / "other"), _hf_saved(d / "hf")
    state = json.loads((path / "state.json").read_text())
    arrow = state["_data_files"][0]["filename"]
    (path / arrow).unlink()
    state["_data_files"] = [{"filename": f"../{other.name}/{arrow}"}]
    (path / "state.json").write_text(json.dumps(state))
    return path


for _label, _make in (("two schemas in one split", _hf_two_schemas), ("a lying dataset_info.json", _hf_lying_info),
                      ("an empty DatasetDict", _hf_empty), ("state.json naming ../other's Arrow file", _hf_outside)):
    @case(f"I48 18 hf: folder with {_label}")
    def _(d: Path, make=_make):
        from resmlp.data.sources import open_source

        return refused(lambda: open_source(f"hf:{make(d)}"))


@case("I48 18 `resmlp train --data hf:DIR` whose state.json names another dataset's Arrow file")
def _(d: Path):
    path = _hf_outside(d)
    return clean_cli_failure(*cli("train", "--output", str(d / "o"), "--data", f"hf:{path}", *FOLDER_TINY),
                             "state.json")


@case("I48 19 `gpu_report.py --merge` of a folder")
def _(d: Path):
    (d / "folder").mkdir()
    return clean_cli_failure(*_merge(d / "folder", out=d / "out"), "not a regular file")


@case("I48 19 `gpu_report.py --merge --out` naming an existing file")
def _(d: Path):
    (d / "taken").write_text("precious\n")
    ok, how = clean_cli_failure(*_merge(_REPORT, out=d / "taken"), "not a folder")
    return ok and (d / "taken").read_text() == "precious\n", how


@case("I48 19 `gpu_report.py --merge` of a part with exit 0 and none of its numbers")
def _(d: Path):
    report = json.loads(_REPORT.read_text())
    report["parts"]["guard"] = {"exit": 0}
    (d / "r.json").write_text(json.dumps(report))
    return clean_cli_failure(*_merge(d / "r.json", out=d / "out"), "guard")


@case("I48 19 `resmlp models --format csv >&-` (stdout closed)")
def _(d: Path):
    code = f"import os, subprocess, sys; os.close(1); sys.exit(subprocess.call([{sys.executable!r}, '-m', " \
           "'resmlp', 'models', '--format', 'csv']))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": SRC})
    return clean_cli_failure(proc.returncode, proc.stderr.strip(), "standard output")


@case("I48 19 a sacremoses whose tokenizer returns None (tokenized BLEU)")
def _(d: Path):
    (d / "site" / "sacremoses").mkdir(parents=True)
    (d / "site" / "sacremoses" / "__init__.py").write_text(
        "class MosesTokenizer:\n    def __init__(self, lang):\n        pass\n"
        "    def tokenize(self, text, **options):\n        return None\n")
    return refused_small(*in_child("from resmlp.seq2seq.scoring import tokenized_bleu; tokenized_bleu(['a'], ['a'])",
                                   env={"PYTHONPATH": f"{d / 'site'}{os.pathsep}{SRC}"}), "sacremoses")


# ------------------------------------------------------------------------------------------ issue 55
# One case (or a few) per mechanism of issue 55 (hostile inputs, fifth round: outputs that replace their own inputs,
# caches trusted by size and time, numbers from files unbounded). Names start with "I55 N" (`-k I55` runs them).
def _run55(d: Path) -> Path:
    """A finished tiny run (its best.safetensors evaluates on synthetic data)."""
    rc, err = cli("train", "--output", str(d / "run"), *TRAIN_TINY)
    if rc:
        raise RuntimeError(f"the tiny run failed: {err.splitlines()[-1] if err else rc}")
    return d / "run"


def _kept(path: Path, before: bytes, rc: int, err: str, words: str) -> tuple[bool, str]:
    ok, how = clean_cli_failure(rc, err, words)
    same = path.is_file() and path.read_bytes() == before
    return ok and same, how + ("" if same else f"; {path.name} was replaced")


@case("I55 1 `resmlp eval M --results M` (the checkpoint evaluated)")
def _(d: Path):
    model = _run55(d) / "best.safetensors"
    before = model.read_bytes()
    return _kept(model, before, *cli("eval", str(model), "--results", str(model), "--no-progress"), "an input")


@case("I55 1 `resmlp eval RUN --real-labels real.json --results real.json`")
def _(d: Path):
    real = d / "real.json"
    real.write_text(json.dumps([[0]] * 16))
    return _kept(real, real.read_bytes(), *cli("eval", str(_run55(d)), "--real-labels", str(real), "--results",
                                                str(real), "--no-progress"), "an input")


@case("I55 1 `resmlp export M --format pt2 --output M`")
def _(d: Path):
    model = _run55(d) / "best.safetensors"
    return _kept(model, model.read_bytes(), *cli("export", str(model), "--format", "pt2", "--output", str(model)),
                 "an input")


@case("I55 1 `resmlp eval RUN --output OUT --results OUT/summary.json`")
def _(d: Path):
    ok, how = clean_cli_failure(*cli("eval", str(_run55(d)), "--output", str(d / "out"), "--results",
                                     str(d / "out" / "summary.json"), "--no-progress"), "both --results and")
    return ok and not (d / "out" / "summary.json").exists(), how


@case("I55 1 `resmlp predict M IMAGE --output IMAGE` (an input image)")
def _(d: Path):
    image = an_image(d / "x.png")
    return _kept(image, image.read_bytes(), *cli("predict", str(_run55(d)), str(image), "--output", str(image)),
                 "an input")


@case("I55 1 `--results FIFO` that nobody reads")
def _(d: Path):
    os.mkfifo(d / "fifo")
    ok, how = clean_cli_failure(*cli("eval", str(_run55(d)), "--results", str(d / "fifo"), "--no-progress"),
                                "FIFO")
    return ok and (d / "fifo").is_fifo(), how


@case("I55 1 an output at a character device (a /dev/null made in the case's folder; root only)")
def _(d: Path):
    import stat

    try:
        os.mknod(d / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.close(os.open(d / "null", os.O_WRONLY))
    except OSError as e:
        return True, f"not run: no device can be made here ({e.strerror})"
    atomic_write(d / "null", lambda tmp: tmp.write_text("rows\n"))
    return (d / "null").is_char_device(), "written in place; still a character device" \
        if (d / "null").is_char_device() else "replaced by a regular file"


def _tar55(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def _images55(n: int) -> dict[str, bytes]:
    return {f"train/{c}/{i}.png": an_image(Path(tempfile.mkdtemp()) / "x.png").read_bytes()
            for c in ("a", "b") for i in range(n)}


@case("I55 2 a cached tar listing with its offsets reversed, names kept")
def _(d: Path):
    from resmlp.data.sources import open_source

    tar = _tar55(d / "data.tar", _images55(2))
    open_source(f"folder:{tar}", index_cache=d / "run").records("train")
    (saved,) = (d / "run" / "data_index").glob("tar-*.npz")
    with np.load(saved) as arrays:
        arrays = {name: arrays[name] for name in arrays.files}
    arrays["data_offsets"] = arrays["data_offsets"][::-1].copy()
    np.savez(saved, **arrays)
    records = open_source(f"folder:{tar}", index_cache=d / "run").records("train")
    return refused(lambda: [records[i] for i in range(len(records))])


@case("I55 2 a tar rewritten with its size and modification time kept (cp -p, rsync, touch -d)")
def _(d: Path):
    from resmlp.data.sources import open_source

    members = {**_images55(1), "train/b/1.png": an_image(d / "y.png").read_bytes()}
    tar = _tar55(d / "data.tar", dict(reversed(members.items())))
    before = tar.stat()
    open_source(f"folder:{tar}", index_cache=d / "run").records("train")
    _tar55(tar, members)
    os.utime(tar, ns=(before.st_atime_ns, before.st_mtime_ns))
    records = open_source(f"folder:{tar}", index_cache=d / "run").records("train")
    return refused(lambda: [records[i] for i in range(len(records))])


@case("I55 2 a folder listing cache whose labels are all set to 0")
def _(d: Path):
    from resmlp.data.sources import open_source

    data = image_folder(d / "data")
    open_source(f"folder:{data}", index_cache=d / "run").records("train")
    (saved,) = (d / "run" / "data_index").glob("train-*.npz")
    with np.load(saved) as arrays:
        arrays = {name: arrays[name] for name in arrays.files}
    arrays["labels"] = np.zeros(len(arrays["offsets"]) - 1, np.int64)  # as earlier versions stored them
    np.savez(saved, **arrays)
    labels = open_source(f"folder:{data}", index_cache=d / "run").records("train").labels.tolist()
    return labels == [0, 0, 1, 1], f"labels {labels} (from the names)"


def _shard55(path: Path, records: int, label: int = 0) -> Path:
    png = an_image(path.with_suffix(".png")).read_bytes()
    return _tar55(path, {f"{i:06d}.{suffix}": data for i in range(records)
                         for suffix, data in (("png", png), ("cls", str(label).encode()))})


def _info55(folder: Path, splits: dict[str, tuple[list[str], list[int]]]) -> None:
    (folder / "_info.json").write_text(json.dumps({"splits": {
        name: {"filenames": names, "shard_lengths": lengths} for name, (names, lengths) in splits.items()}}))


@case("I55 3 _info.json whose validation split names the train shards")
def _(d: Path):
    from resmlp.data.sources import open_source

    _shard55(d / "a.tar", 2)
    _info55(d, {"train": (["a.tar"], [2]), "validation": (["a.tar"], [2])})
    return refused(lambda: open_source(f"wds:{d}"))


@case("I55 3 a shard folder with a symlinked shard (followed, as _info.json and patterns follow it)")
def _(d: Path):
    from resmlp.data.sources import open_source

    (d / "shards").mkdir()
    _shard55(d / "shards" / "x-train-0.tar", 2)
    (d / "shards" / "x-train-1.tar").symlink_to(_shard55(d / "real.tar", 3))
    count = len(open_source(f"wds:{d / 'shards'}").records("train"))
    return count == 5, f"{count} records of 5"


@case("I55 3 a shard folder with a dangling .tar link")
def _(d: Path):
    from resmlp.data.sources import open_source

    (d / "shards").mkdir()
    _shard55(d / "shards" / "x-train-0.tar", 2)
    (d / "shards" / "x-train-1.tar").symlink_to(d / "gone.tar")
    return refused(lambda: open_source(f"wds:{d / 'shards'}"))


@case("I55 3 a shard rewritten within the same second (mid-epoch fingerprint)")
def _(d: Path):
    from resmlp.data.sources.wds import ShardFiles

    shard = _shard55(d / "a.tar", 1)
    os.utime(shard, ns=(10 ** 18, 10 ** 18 + 100))
    files = ShardFiles([str(shard)], [1], ["0"], None, "case")
    before = files.fingerprint()
    os.utime(shard, ns=(10 ** 18, 10 ** 18 + 900_000_000))
    return files.fingerprint() != before, "the fingerprint changed" if files.fingerprint() != before \
        else "the fingerprint is the same"


@case("I55 4 a census cache whose largest label is 10^12")
def _(d: Path):
    from resmlp.data.sources import wds_census

    shard = _shard55(d / "a.tar", 2, label=2)
    wds_census.census([str(shard)], d / "run")
    (saved,) = (d / "run" / "data_index").glob("wds-census-*.npz")
    np.savez(saved, counts=np.asarray([2], np.int64), largest=np.asarray([10 ** 12], np.int64))
    got = wds_census.census([str(shard)], d / "run")
    return got == ([2], 2), f"census {got} (counted again)"


@case("I55 4 _info.json shard_lengths of 10^30")
def _(d: Path):
    from resmlp.data.sources import open_source

    _shard55(d / "a.tar", 2)
    _info55(d, {"train": (["a.tar"], [10 ** 30])})
    return refused(lambda: open_source(f"wds:{d}"))


@case("I55 4 --real-labels with a class index of 2**63 - 1")
def _(d: Path):
    from resmlp.eval_extras import read_real_labels

    (d / "real.json").write_text(json.dumps([[2 ** 63 - 1]]))
    return refused(lambda: read_real_labels(d / "real.json"))


@case("I55 4 `--resume` after the data's classes changed (a class folder split in two)")
def _(d: Path):
    data = image_folder(d / "data", splits=("train", "val"), per_class=4)
    args = ["train", "--output", str(d / "run"), "--data", f"folder:{data}", *FOLDER_TINY]
    rc, err = cli(*args)
    if rc:
        return False, f"the first run failed: {err.splitlines()[-1] if err else rc}"
    for split in ("train", "val"):  # half of b's images become class c: the same images, steps and batches
        (data / split / "c").mkdir()
        for i in (2, 3):
            (data / split / "b" / f"{i}.png").rename(data / split / "c" / f"{i}.png")
    return clean_cli_failure(*cli(*args, "--resume", "--set", "schedule.epochs=2"), "classes changed")


@case("I55 4 an evaluation of 30,003 classes (a K x K confusion matrix: 6.7 GiB before)")
def _(d: Path):
    code = ("import torch; from resmlp.evaluation import classify; m = torch.nn.Linear(2, 30003); "
            "r = classify(m, [(torch.ones(4, 2), torch.zeros(4, dtype=torch.long), 0)], 30003, "
            "torch.device('cpu'), 'fp32'); assert r['confusion'] is None; raise ValueError('scored')")
    outcome, peak = in_child(code)
    ok = "scored" in outcome and peak < PEAK_MIB
    return ok, f"scored without a K x K matrix (peak {peak} MiB)" if ok else f"{outcome} (peak {peak} MiB)"


@case("I55 5 a real.json with no scored image")
def _(d: Path):
    from resmlp.eval_extras import read_real_labels

    (d / "real.json").write_text("[[], [], []]")
    return refused(lambda: read_real_labels(d / "real.json"))


@case("I55 5 ReaL labels of images named ILSVRC2012_val_%08d out of sorted order")
def _(d: Path):
    from resmlp.eval_extras import real_order

    order = real_order(["a_ILSVRC2012_val_00000002.JPEG", "b_ILSVRC2012_val_00000001.JPEG"]).tolist()
    return order == [1, 0], f"entry order {order} (by the names' numbers)"


@case("I55 5 ReaL labels for a split missing one of ImageNet's numbers")
def _(d: Path):
    from resmlp.eval_extras import real_order

    return refused(lambda: real_order(["ILSVRC2012_val_00000001.JPEG", "ILSVRC2012_val_00000003.JPEG"]))


@case("I55 6 a linked <class>.tar member in ILSVRC2012_img_train.tar")
def _(d: Path):
    from resmlp.data.sources import open_source

    inner = _tar55(d / "a.tar", {"a_0.png": an_image(d / "x.png").read_bytes()}).read_bytes()
    tar = _tar55(d / "ILSVRC2012_img_train.tar", {"a.tar": inner}, {"b.tar": "/etc/passwd"})
    return refused(lambda: open_source(f"folder:{tar}").records("train"))


@case("I55 7 a 1x1 image batched with a 3000x3000 one (device pipeline, CPU form)")
def _(d: Path):
    from resmlp.data.device.augment import DeviceAugment

    images = [torch.zeros(3, 1, 1, dtype=torch.uint8), torch.zeros(3, 3000, 3000, dtype=torch.uint8)]
    shapes = {tuple(DeviceAugment(16, 3, (0.5,) * 3, (0.25,) * 3)(images, [seed, seed + 1]).shape)
              for seed in range(8)}
    return shapes == {(2, 3, 16, 16)}, f"batches of {sorted(shapes)}"


@case("I55 8 a truncated JPEG on the device path")
def _(d: Path):
    import warnings

    from resmlp.data.device.decode import encoded_item

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        item = encoded_item(buffer.getvalue()[:1000], 0, (0, 0, 0, 0), "n01/cut.JPEG", 3, None)
    named = [str(w.message) for w in seen if "n01/cut.JPEG" in str(w.message)]
    return item is None and bool(named), (named or ["skipped without its name"])[0][:150]


@case("I55 8 ILSVRC2012_img_train.tar holding 2 class tars")
def _(d: Path):
    import warnings

    from resmlp.data.sources import open_source

    png = an_image(d / "x.png").read_bytes()
    tar = _tar55(d / "ILSVRC2012_img_train.tar", {f"{c}.tar": _tar55(d / f"{c}.tar", {f"{c}_0.png": png}).read_bytes()
                                                  for c in ("a", "b")})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        open_source(f"folder:{tar}").records("train")
    said = [str(w.message) for w in seen if "1,000" in str(w.message)]
    return bool(said), (said or ["no word"])[0][:150]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument("-k", help="only cases whose name contains this")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name, fn in CASES:
        if args.k and args.k not in name:
            continue
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                ok, how = fn(Path(tmp))
            except Exception as e:  # an unexpected exception is exactly what this script looks for
                ok, how = False, f"uncaught {type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
        rows.append((name, "yes" if ok else "no", how.replace("|", "/")))
        if not args.markdown:  # the seconds: what a full run will take, from the cases' own times
            print(f"{'yes' if ok else 'NO ':4} {name}: {how} [{time.perf_counter() - start:.1f} s]", flush=True)
    if args.markdown:
        print("| case | handled cleanly | how |\n|---|---|---|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
    print(f"\n{sum(r[1] == 'yes' for r in rows)} of {len(rows)} cases handled cleanly", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

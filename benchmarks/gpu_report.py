"""Everything a lent GPU should tell us, in one command: tests, the quickstart, training and inference speed.

    PYTHONPATH=src python benchmarks/gpu_report.py --out OUT [--parts NAME ...] [--data-dir FASHION_MNIST_DIR]
    PYTHONPATH=src python benchmarks/gpu_report.py --out OUT --device cpu --tiny     # the dry run (a test runs it)
    python benchmarks/gpu_report.py --merge OUT1/gpu_report.json OUT2/gpu_report.json --out OUT   # one report

Runs with whatever torch the machine has (the GPU image's 2.11; docs/gpu.md says how timm travels). Each part
runs in a subprocess with its own time limit; a part that fails or times out has its error in the report and
the next part runs. Parts (in this order; `--parts` picks some, e.g. to split the work over two commands of a
device tool limited to 10 minutes each):

- `cuda-tests`: `pytest -m cuda` (the tests marked `cuda`: docs/gpu.md);
- `suite`: the rest of the suite with the GPU visible (`-m "not cuda"`, pytest-xdist when installed);
- `quickstart`: `resmlp train --recipe fashion-mnist-quick --device cuda` (training time, test top-1, what
  `train.compile: auto` chose);
- `guard`: benchmarks/guard_cost.py, the UpdateGuard's time and memory per step;
- `trainer-vs-raw`: the in-memory S12 224 px trainer (synthetic data, batch 256, compiled) against its raw
  compiled step (benchmarks/train_throughput.py, `ours-compiled`);
- `raw-step`: the raw training step, ours vs timm, eager and compiled, batch 128 and 256 (bf16);
- `inference`: resmlp.inference.optimize vs timm, bf16, batch 32 and 256, eager and compiled, with the share of
  the measured bf16 matrix peak (benchmarks/inference.py);
  (bf16 on a GPU; the CPU dry run uses the host's `amp: auto` instead: bf16 only where the CPU has it natively);
- `pipeline`: the authors' recipe (`--recipe deit`) on a generated JPEG folder, data.pipeline device and timm,
  vs timm's parts (benchmarks/train_pipeline.py); against the raw compiled step of `trainer-vs-raw`. Then DINO's
  multi-crop (benchmarks/dino_multi_crop.py): batched on the device vs DINO's PIL transform in 14 loader workers,
  with ops (kernel launches) per batch, host time per batch, images/s and views/s against that raw step;
  within what is left of the part's time;
- `node`: `resmlp benchmark --pipeline --recipe deit` on the pipeline part's JPEG folder (or a small one): each
  data path's images/s, host ms and ops per batch against the raw training step, and the path `data.pipeline:
  auto` would choose on this machine (at most 2 minutes).

Writes OUT/gpu_report.json (every part: command, seconds, exit status, parsed numbers, error) and
OUT/gpu_report.md (device, driver, torch and package versions, one table per part).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import re
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's resmlp, as the parts' subprocesses get (PYTHONPATH)
from resmlp.fileio import atomic_write  # noqa: E402 (needs the line above)

PARTS = ("cuda-tests", "suite", "quickstart", "guard", "trainer-vs-raw", "raw-step", "inference", "pipeline",
         "node")
FASHION = Path("/usr/share/datasets/fashion-mnist")


# ------------------------------------------------------------------------------------------ running parts
def run(cmd: list[str], timeout: float, cwd: Path = ROOT) -> dict[str, object]:
    """One subprocess: its exit status, seconds and the tail of its output; never raises."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
           "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as err:
        code = "timeout"
        output = ((err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else (err.stdout or ""))
        output += f"\n[stopped after {timeout:.0f} s]"
    return {"command": " ".join(cmd), "exit": code, "seconds": round(time.perf_counter() - start, 1),
            "output_tail": output[-3000:]}


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def pytest_counts(output: str) -> dict[str, int]:
    """'12 passed, 3 skipped in 4.5s' -> {'passed': 12, 'skipped': 3}."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", output)}


def load_json(path: Path) -> object:
    return json.loads(path.read_text()) if path.is_file() else None


def precision(args) -> str:
    """The precision the speed parts run in: bf16 on a GPU; on the CPU (the dry run) the host's `amp: auto`, bf16
    only where the CPU computes it natively, else fp32. Emulated bf16 (an AVX2-only host, or kernels restricted
    with ATEN_CPU_CAPABILITY=avx2) is ~60x slower than fp32: forced, it ran the dry run past its time limit."""
    if args.device != "cpu":
        return "bf16"
    import torch

    from resmlp.runtime import precision_name, resolve_amp

    return precision_name(resolve_amp("auto", torch.device("cpu")))


def part_cuda_tests(args, work: Path) -> dict[str, object]:
    files = ["tests/test_cuda.py", "tests/test_cuda_loop.py"] if args.tiny else []
    result = run(python("-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *files), args.timeout)
    return {**result, "counts": pytest_counts(result["output_tail"])}


def part_suite(args, work: Path) -> dict[str, object]:
    if args.tiny:
        return {"exit": 0, "skipped": "--tiny: the whole suite is not run in the dry run"}
    import importlib.util

    workers = ["-n", str(min(15, os.cpu_count() or 1))] if importlib.util.find_spec("xdist") else []
    result = run(python("-m", "pytest", "-q", "-m", "not cuda", "-p", "no:cacheprovider", *workers), args.timeout)
    failed = re.findall(r"^FAILED (\S+)", result["output_tail"], flags=re.M)
    return {**result, "counts": pytest_counts(result["output_tail"]), "failed": failed}


def part_quickstart(args, work: Path) -> dict[str, object]:
    out = work / "quickstart"
    cmd = python("-m", "resmlp", "train", "--recipe", "fashion-mnist-quick", "--device", args.device,
                 "--output", str(out), "--no-progress")
    if args.tiny:
        cmd += ["--epochs", "1", "--set", "data.kind=synthetic", "--set", "data.synthetic_size=[256,64]"]
    else:
        cmd += ["--data-dir", str(args.data_dir)]
    result = run(cmd, args.timeout)
    summary = load_json(out / "summary.json") or {}
    keys = ("test_top1", "val_top1", "selected_epoch", "epochs", "wall_seconds", "compile", "amp", "device")
    return {**result, "summary": {k: summary.get(k) for k in keys if k in summary}}


def part_guard(args, work: Path) -> dict[str, object]:
    path = work / "guard.json"
    cmd = python("benchmarks/guard_cost.py", "--device", args.device, "--json", str(path))
    cmd += ["--config", "quickstart", "--rounds", "1", "--steps", "1"] if args.tiny else ["--batch", "128"]
    result = run(cmd, args.timeout)
    return {**result, "results": (load_json(path) or {}).get("results")}


def trainer_command(args, out: Path) -> list[str]:
    """The S12 224 px trainer on in-memory synthetic data (the batch-augment path), compiled, in the recipe's
    `amp: auto` (bf16 on a GPU)."""
    size, batch, img, dim, depth = ("[256,64]", 64, 32, 32, 2) if args.tiny else ("[20480,1024]", 256, 224, 384, 12)
    sets = ["data.kind=synthetic", f"data.synthetic_size={size}", f"model.img_size={img}", "model.patch_size=16",
            f"model.dim={dim}", f"model.depth={depth}", "model.in_chans=3", f"train.batch_size={batch}",
            f"train.compile={'false' if args.tiny else 'true'}"]
    cmd = python("-m", "resmlp", "train", "--recipe", "fashion-mnist-quick", "--device", args.device,
                 "--output", str(out), "--epochs", "1" if args.tiny else "2", "--no-progress")
    for item in sets:
        cmd += ["--set", item]
    return cmd


def throughput_command(args, batch: int, path: Path, variants: list[str] | None = None) -> list[str]:
    cmd = python("benchmarks/train_throughput.py", "--device", args.device, "--precision", precision(args),
                 "--batch", str(batch), "--json", str(path))
    if args.tiny:
        cmd += ["--config", "quickstart", "--rounds", "1", "--steps", "1", "--warmup", "0"]
    else:
        cmd += ["--compile", "--rounds", "5", "--steps", "5", "--warmup", "3"]
    return cmd + (["--variants", *variants] if variants else [])


def part_trainer_vs_raw(args, work: Path) -> dict[str, object]:
    out, raw = work / "s12-trainer", work / "raw-s12.json"
    trainer = run(trainer_command(args, out), args.timeout)
    rows = list(csv.DictReader((out / "metrics.csv").open())) if (out / "metrics.csv").is_file() else []
    trainer_img_s = float(rows[-1]["train_images_per_s"]) if rows else None
    step = run(throughput_command(args, 64 if args.tiny else 256, raw, None if args.tiny else ["ours-compiled"]),
               args.timeout)
    raw_results = (load_json(raw) or {}).get("results") or [{}]
    variants = raw_results[0].get("variants", {})
    raw_img_s = next((v["median_img_s"] for v in variants.values()), None)
    ok = trainer["exit"] == 0 and step["exit"] == 0
    return {"exit": 0 if ok else 1, "trainer": trainer, "raw_step": step, "trainer_img_s_last_epoch": trainer_img_s,
            "raw_compiled_img_s": raw_img_s,
            "trainer_over_raw": trainer_img_s / raw_img_s if trainer_img_s and raw_img_s else None}


def part_raw_step(args, work: Path) -> dict[str, object]:
    batches = [64] if args.tiny else [128, 256]
    out: dict[str, object] = {"exit": 0}
    for batch in batches:
        path = work / f"raw-step-{batch}.json"
        result = run(throughput_command(args, batch, path), args.timeout)
        parsed = (load_json(path) or {}).get("results") or []
        out[f"batch{batch}"] = {**result, "ratios": {k: v["median"] for r in parsed for k, v in r["ratios"].items()},
                                "img_s": {k: v["median_img_s"] for r in parsed for k, v in r["variants"].items()}}
        out["exit"] = out["exit"] or result["exit"]
    return out


def part_inference(args, work: Path) -> dict[str, object]:
    path = work / "inference.json"
    cmd = python("benchmarks/inference.py", "--device", args.device, "--models", "resmlp_s12",
                 "--precisions", precision(args), "--json", str(path))
    cmd += ["--tiny", "--batch-sizes", "4", "--reps", "1", "--warmup", "2"] if args.tiny else \
        ["--batch-sizes", "32", "256", "--compile", "default"]
    result = run(cmd, args.timeout)
    return {**result, "results": load_json(path)}


def part_pipeline(args, work: Path) -> dict[str, object]:
    folder, path = work / "jpegs", work / "pipeline.json"
    images, epochs, batch, workers = ("64", "1", "16", "1") if args.tiny else ("10000", "2", "256", "14")
    made = run(python("benchmarks/train_pipeline.py", "--make-folder", str(folder), "--images", images), args.timeout)
    cmd = python("benchmarks/train_pipeline.py", "--folder", str(folder), "--device", args.device, "--epochs", epochs,
                 "--batch", batch, "--workers", workers, "--precision", precision(args), "--json", str(path))
    # the recipe's own pipeline (device) and the timm reference; the dry run only the recipe's, to stay short
    cmd += ["--pipelines", "device"] + ([] if args.tiny else ["timm"])
    start = time.perf_counter()
    result = run(cmd + ([] if args.tiny else ["--profile"]), args.timeout)
    dino = part_dino(args, work, args.timeout - (time.perf_counter() - start))
    return {**result, "exit": made["exit"] or result["exit"] or dino["exit"], "make_folder": made,
            "results": load_json(path), "dino": dino}


def part_dino(args, work: Path, timeout: float) -> dict[str, object]:
    """DINO's multi-crop, batched on the device vs DINO's PIL transform in loader workers
    (benchmarks/dino_multi_crop.py): ops per batch, host ms per batch, images/s, views/s against the raw compiled
    step that trainer-vs-raw measured (when it ran first). Kept short: 3 passes over 4 batches of 64 images on
    the device, the same 768 images through 14 PIL workers (not yet timed on a GPU)."""
    path = work / "dino.json"
    cmd = python("benchmarks/dino_multi_crop.py", "--device", args.device, "--json", str(path),
                 "--raw-json", str(work / "raw-s12.json"))
    cmd += ["--tiny"] if args.tiny else ["--batch", "64", "--workers", "14"]
    if timeout < 10:
        return {"exit": "not run", "skipped": "the part's time was spent"}
    return {**run(cmd, timeout), "results": load_json(path)}


def part_node(args, work: Path) -> dict[str, object]:
    """`resmlp benchmark --pipeline`: the report a user runs on their own machine (docs/training.md)."""
    folder, path = work / "jpegs", work / "node.json"
    made = None
    if not (folder / "train").is_dir():
        made = run(python("benchmarks/train_pipeline.py", "--make-folder", str(folder), "--images",
                          "64" if args.tiny else "1024"), args.timeout)
    cmd = python("-m", "resmlp", "benchmark", "--pipeline", "--recipe", "deit", "--data-dir", str(folder),
                 "--device", args.device, "--output", str(path), "--set", "data.kind=folder")
    if args.tiny:  # a small model, no workers, fp32 (bf16 is emulated on an AVX2 CPU)
        cmd += ["--batch-size", "8", "--batches", "2", "--set", "data.num_workers=0", "--set", "train.amp=fp32",
                *[arg for kv in ("model.img_size=32", "model.dim=16", "model.depth=1") for arg in ("--set", kv)]]
    else:
        cmd += ["--batch-size", "128", "--batches", "10", "--set", "data.num_workers=14"]
    result = run(cmd, min(args.timeout, 120))
    return {**result, "exit": (made or {}).get("exit", 0) or result["exit"], "results": load_json(path),
            **({"make_folder": made} if made else {})}


RUNNERS = {"cuda-tests": part_cuda_tests, "suite": part_suite, "quickstart": part_quickstart, "guard": part_guard,
           "trainer-vs-raw": part_trainer_vs_raw, "raw-step": part_raw_step, "inference": part_inference,
           "pipeline": part_pipeline, "node": part_node}


# ------------------------------------------------------------------------------------------ the machine
def machine(device: str) -> dict[str, object]:
    info: dict[str, object] = {"python": platform.python_version(), "cpu_cores": os.cpu_count(),
                               "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    info["resmlp_commit"] = commit.stdout.strip() or "unknown (no git)"
    try:
        import torch

        info.update(torch=torch.__version__, cuda=torch.version.cuda,
                    cpu_capability=torch.backends.cpu.get_cpu_capability())
        if device.startswith("cuda") and torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
            info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
    except Exception as err:  # noqa: BLE001 - a report of a broken install is still a report
        info["torch_error"] = repr(err)
    for name in ("timm", "torchvision", "numpy", "safetensors"):
        try:
            info[name] = __import__(name).__version__
        except Exception as err:  # noqa: BLE001
            info[name] = f"not importable: {err!r}"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as err:
        info["nvidia_smi"] = f"not available: {err}"
    return info


# ------------------------------------------------------------------------------------------ the report
def fmt(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.0f}"
    return "" if value is None else str(value)


def markdown(report: dict[str, object]) -> str:
    lines = ["# resmlp on a GPU: benchmarks/gpu_report.py", ""]
    for run_info in report["machines"]:
        lines += ["| machine fact | value |", "|---|---|"] + [f"| {k} | {fmt(v)} |" for k, v in run_info.items()]
        lines.append("")
    for name, part in report["parts"].items():
        status = "ok" if part.get("exit") == 0 else f"FAILED (exit {part.get('exit')})"
        lines += [f"## {name}: {status}", ""]
        if part.get("skipped"):
            lines += [part["skipped"], ""]
            continue
        lines += [f"`{part['command']}` ({part.get('seconds')} s)" if "command" in part else "", ""]
        lines += part_lines(name, part)
        if part.get("exit") != 0:
            lines += ["```", str(part.get("output_tail") or part.get("error") or "")[-1500:], "```", ""]
    return "\n".join(lines) + "\n"


def part_lines(name: str, part: dict[str, object]) -> list[str]:
    """The numbers of one part as Markdown lines."""
    if name in ("cuda-tests", "suite"):
        out = [f"counts: {part.get('counts')}"]
        return out + [f"- failed: `{f}`" for f in part.get("failed") or []] + [""]
    if name == "quickstart":  # a part that raised has its error only
        summary = part.get("summary") or {}
        return ["| key | value |", "|---|---|"] + [f"| {k} | {fmt(v)} |" for k, v in summary.items()] + [""]
    if name == "guard":
        rows = part.get("results") or []
        head = ["| optimizer | plain ms | guarded ms | guarded/plain | copy MiB | params MiB | "
                "peak MiB plain→guarded |",
                "|---|---|---|---|---|---|---|"]
        return head + [f"| {r['optimizer']} | {fmt(r['plain_ms'])} | {fmt(r['guarded_ms'])} | "
                       f"{fmt(r['guarded_over_plain'])} | {fmt(r['guard_copy_mib'])} | {fmt(r['parameter_mib'])} | "
                       f"{fmt(r['peak_mib_plain'])}→{fmt(r['peak_mib_guarded'])} |" for r in rows] + [""]
    if name == "trainer-vs-raw" and "trainer" in part:
        return [f"`{part['trainer']['command']}`", "",
                f"trainer {fmt(part.get('trainer_img_s_last_epoch'))} img/s (last epoch); raw compiled step "
                f"{fmt(part.get('raw_compiled_img_s'))} img/s; trainer/raw **{fmt(part.get('trainer_over_raw'))}**",
                ""]
    if name == "raw-step":
        out = []
        for key, sub in part.items():
            if key.startswith("batch"):
                out += [f"**{key}** `{sub['command']}`", "", "| variant | img/s |", "|---|---|"]
                out += [f"| {k} | {fmt(v)} |" for k, v in sub["img_s"].items()]
                out += ["", "| ratio | median |", "|---|---|"]
                out += [f"| {k} | {fmt(v)} |" for k, v in sub["ratios"].items()]
                out.append("")
        return out
    if name == "pipeline" and isinstance(part.get("dino"), dict):
        dino = part["dino"].get("results") or part["dino"]
        return ["```json", json.dumps(part.get("results"), indent=1)[:6000], "```", "", "DINO's multi-crop:",
                "```json", json.dumps(dino, indent=1)[:3000], "```", ""]
    if name in ("inference", "pipeline", "node"):
        return ["```json", json.dumps(part.get("results"), indent=1)[:6000], "```", ""]
    return []


def write_report(report: dict[str, object], out: Path) -> None:
    """Both files through the project's atomic writer: a fresh temporary of a random name, renamed over the
    target, so a symlink or hard link planted at a name in OUT is replaced, never written through."""
    texts = {"gpu_report.json": json.dumps(report, indent=2), "gpu_report.md": markdown(report)}
    for name, text in texts.items():
        atomic_write(out / name, lambda tmp, text=text: tmp.write_text(text))


# ------------------------------------------------------------------------------------------ reading reports
# what --merge reads is untrusted (a report of another tool, one cut short or edited): it is read from a regular
# file only (a FIFO would wait for a writer for ever, /dev/zero never ends), at most MAX_REPORT_BYTES, as strict
# JSON, and every record must have the type and range that `markdown` reads; else one line naming the record.
MAX_REPORT_BYTES = 16 << 20  # a report holds 3,000 characters of output per subprocess: tens of kB
MAX_DEPTH = 16  # the inference and pipeline results, the deepest records, are nested 5 levels
MAX_VALUE = 1e12  # seconds, counts, img/s, ms, MiB, ratios: every real one is far below
EXITS = ("timeout", "error", "not run")  # besides a process's exit status (negative: the signal that ended it)
Check = Callable[[object, str], None]


class BadReport(ValueError):
    """A --merge input that is not a gpu_report.json; the message names the record."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(none: bool = False) -> Check:
    def check(value: object, where: str) -> None:
        if none and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_VALUE:
            raise BadReport(f"{where} is {_show(value)}, not a number from 0 to {MAX_VALUE:g}")
    return check


def _text(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise BadReport(f"{where} is {_show(value)}, not a string")


def _scalar(value: object, where: str) -> None:
    if not isinstance(value, (str, int, float, bool, type(None))):
        raise BadReport(f"{where} is a {type(value).__name__}, not a string or number")


def _exit(value: object, where: str) -> None:
    if not (value in EXITS if isinstance(value, str) else type(value) is int and -255 <= value <= 255):
        raise BadReport(f"{where} is {_show(value)}, not an exit status (-255 to 255, {', '.join(EXITS)})")


def _any(value: object, where: str) -> None:
    """Any JSON (the inference and pipeline results, shown as they are): checked by `_check_tree` alone."""


def _list(item: Check) -> Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, list):
            raise BadReport(f"{where} is {_show(value)}, not a list")
        for i, entry in enumerate(value):
            item(entry, f"{where}[{i}]")
    return check


def _mapping(item: Check) -> Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise BadReport(f"{where} is {_show(value)}, not an object")
        for key, entry in value.items():
            item(entry, f"{where}.{key}")
    return check


def _record(fields: dict[str, Check], required: tuple[str, ...] = (), others: Check | None = None) -> Check:
    """An object of these fields (the `required` ones present); other keys are refused, or checked by `others`."""
    def check(value: object, where: str) -> None:
        if not isinstance(value, dict):
            raise BadReport(f"{where} is {_show(value)}, not an object")
        missing = [key for key in required if key not in value]
        if missing:
            raise BadReport(f"{where} has no {', '.join(missing)}")
        for key, entry in value.items():
            field = fields.get(key, others)
            if field is None:
                raise BadReport(f"{where}.{key}: not a record of gpu_report.py")
            field(entry, f"{where}.{key}")
    return check


RUN = {"command": _text, "exit": _exit, "seconds": _number(), "output_tail": _text}
GUARD_ROW = _record({"optimizer": _text, "precision": _text, **dict.fromkeys(
    ("plain_ms", "guarded_ms", "guarded_over_plain", "ratio_min", "ratio_max", "parameter_mib", "guard_copy_mib",
     "peak_mib_plain", "peak_mib_guarded"), _number(none=True))},
    required=("optimizer", "plain_ms", "guarded_ms", "guarded_over_plain", "guard_copy_mib", "parameter_mib",
              "peak_mib_plain", "peak_mib_guarded"))
PART_FIELDS = {**RUN, "error": _text, "skipped": _text, "counts": _mapping(_number()), "failed": _list(_text),
               "summary": _mapping(_any), "results": _any, "trainer": _record(RUN, ("command",)),
               "raw_step": _record(RUN, ("command",)), "make_folder": _record(RUN, ("command",)),
               "dino": _record({**RUN, "results": _any, "skipped": _text}, ("exit",)),
               **dict.fromkeys(("trainer_img_s_last_epoch", "raw_compiled_img_s", "trainer_over_raw"),
                               _number(none=True))}
BATCH = _record({**RUN, "ratios": _mapping(_number()), "img_s": _mapping(_number())}, ("command", "ratios", "img_s"))


# what each part writes when it ran (exit 0, not skipped): a part without its numbers must not merge as "ok"
OK_PART_KEYS = {"cuda-tests": ("command", "counts"), "suite": ("command", "counts"),
                "quickstart": ("command", "summary"), "guard": ("command", "results"),
                "trainer-vs-raw": ("trainer", "raw_step", "trainer_img_s_last_epoch", "raw_compiled_img_s",
                                   "trainer_over_raw"),
                "raw-step": (), "inference": ("command", "results"), "pipeline": ("command", "make_folder", "results"),
                "node": ("command", "results")}


def _check_part(name: str, part: object, where: str) -> None:
    fields = {**PART_FIELDS, "results": _list(GUARD_ROW)} if name == "guard" else PART_FIELDS
    batches = [key for key in part if re.fullmatch(r"batch\d{1,5}", str(key))] if isinstance(part, dict) else []
    fields = {**fields, **dict.fromkeys(batches, BATCH)}  # raw-step's records per batch size: batch128...
    _record(fields, ("exit",))(part, where)
    if part["exit"] == 0 and "skipped" not in part:
        missing = [key for key in OK_PART_KEYS[name] if key not in part] + \
            (["a batchN record"] if name == "raw-step" and not batches else [])
        if missing:
            raise BadReport(f"{where} has exit 0 but no {', '.join(missing)}: a part that ran writes them")


def _check_tree(value: object) -> None:
    """Nested at most MAX_DEPTH levels, every float finite (JSON's 1e999 reads as infinity); without recursion."""
    todo = [(value, 1, "report")]
    while todo:
        item, depth, where = todo.pop()
        if depth > MAX_DEPTH:
            raise BadReport(f"{where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, float) and not math.isfinite(item):
            raise BadReport(f"{where} is {item}, not a finite number")
        children = item.items() if isinstance(item, dict) else enumerate(item) if isinstance(item, list) else ()
        todo += [(child, depth + 1, f"{where}.{key}") for key, child in children]


def _refuse_constant(name: str) -> object:
    raise BadReport(f"holds {name}, not a finite number")


def read_report(path: Path) -> dict[str, object]:
    """The gpu_report.json at `path`, every record checked; BadReport for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO doesn't wait for a writer
    except OSError as err:
        raise BadReport(f"can't be read ({err.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # before fdopen, which refuses a folder with a traceback
        os.close(fd)
        raise BadReport("not a regular file (a FIFO, device or folder)")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_REPORT_BYTES + 1)
    if len(data) > MAX_REPORT_BYTES:
        raise BadReport(f"holds more than {MAX_REPORT_BYTES >> 20} MiB; a report holds tens of kB")
    try:
        report = json.loads(data, parse_constant=_refuse_constant)
    except RecursionError:
        raise BadReport(f"is nested more than {MAX_DEPTH} levels deep") from None
    except BadReport:
        raise
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of thousands of digits
        raise BadReport(f"not JSON ({str(err)[:100]})") from None
    _check_tree(report)
    _record({"machines": _list(_mapping(_scalar)), "parts": _any}, ("machines", "parts"))(report, "report")
    if not isinstance(report["parts"], dict):
        raise BadReport(f"report.parts is {_show(report['parts'])}, not an object")
    for name, part in report["parts"].items():
        if name not in PARTS:
            raise BadReport(f"report.parts.{_show(name)}: not a part of gpu_report.py ({', '.join(PARTS)})")
        _check_part(name, part, f"report.parts.{name}")
    return report


def merge(paths: list[Path]) -> dict[str, object]:
    """One report of several; a part in two of them is refused (the second would silently replace the first)."""
    merged: dict[str, dict] = {"machines": [], "parts": {}}
    seen: dict[str, Path] = {}
    for path in paths:
        try:
            report = read_report(path)
        except BadReport as err:
            raise BadReport(f"--merge {path}: not a gpu_report.json: {err}") from None
        for name in report["parts"]:
            if name in seen:
                raise BadReport(f"--merge {path}: part {name} is also in {seen[name]}; merge reports of different "
                                "parts (--parts)")
            seen[name] = path
        merged["machines"] += report["machines"]
        merged["parts"].update(report["parts"])
    return merged


def _output_folder(out: Path) -> None:
    """--out made a folder, or refused in one line when it names something else (a file, a dangling link)."""
    if (out.exists() or out.is_symlink()) and not out.is_dir():
        raise BadReport(f"--out {out}: exists and is not a folder; name a folder (it is created if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadReport(f"--out {out}: can't be created ({err.strerror})") from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_report.json / .md and the runs")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny: the dry run)")
    parser.add_argument("--tiny", action="store_true", help="tiny forms of every part (a CPU dry run)")
    parser.add_argument("--data-dir", type=Path, default=FASHION, help=f"Fashion-MNIST IDX files ({FASHION})")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed for each subprocess")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds for the whole command: a part gets at most what is left of it")
    parser.add_argument("--work", type=Path, default=None, help="folder for the parts' runs (default OUT/runs)")
    parser.add_argument("--merge", type=Path, nargs="+", help="gpu_report.json files to merge into one report")
    args = parser.parse_args()
    if args.merge:
        try:  # a report of another tool, cut short or edited, is one line naming the record, not a traceback
            merged = merge(args.merge)
            _output_folder(args.out)
            write_report(merged, args.out)
        except (BadReport, OSError) as err:
            print(f"gpu_report.py: error: {err}", file=sys.stderr)
            sys.exit(2)
        print(f"wrote {args.out / 'gpu_report.md'}")
        return
    work = args.work or args.out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    deadline = time.perf_counter() + args.budget if args.budget else None
    per_part = args.timeout
    report: dict[str, object] = {"machines": [machine(args.device)], "parts": {}}
    print(json.dumps(report["machines"][0]), flush=True)
    for name in args.parts:
        start = time.perf_counter()
        if deadline is not None:
            args.timeout = min(per_part, deadline - start)
            if args.timeout < 10:
                report["parts"][name] = {"exit": "not run", "skipped": "--budget spent before this part"}
                continue
        try:
            report["parts"][name] = RUNNERS[name](args, work)
        except Exception as err:  # noqa: BLE001 - one part's failure must not lose the others
            report["parts"][name] = {"exit": "error", "error": repr(err)}
        part = report["parts"][name]
        print(f"{name}: exit {part.get('exit')} in {time.perf_counter() - start:.0f} s", flush=True)
        write_report(report, args.out)  # after every part: a later timeout keeps what was measured
    print(f"wrote {args.out / 'gpu_report.md'}")


if __name__ == "__main__":
    main()

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
- `pipeline`: the authors' recipe (`--recipe deit`) on a generated JPEG folder, data.pipeline device and timm,
  vs timm's parts (benchmarks/train_pipeline.py); against the raw compiled step of `trainer-vs-raw`.

Writes OUT/gpu_report.json (every part: command, seconds, exit status, parsed numbers, error) and
OUT/gpu_report.md (device, driver, torch and package versions, one table per part).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("cuda-tests", "suite", "quickstart", "guard", "trainer-vs-raw", "raw-step", "inference", "pipeline")
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
    """The S12 224 px trainer on in-memory synthetic data (the batch-augment path), compiled, bf16."""
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
    cmd = python("benchmarks/train_throughput.py", "--device", args.device, "--precision", "bf16",
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
                 "--precisions", "bf16", "--json", str(path))
    cmd += ["--tiny", "--batch-sizes", "4", "--reps", "1", "--warmup", "2"] if args.tiny else \
        ["--batch-sizes", "32", "256", "--compile", "default"]
    result = run(cmd, args.timeout)
    return {**result, "results": load_json(path)}


def part_pipeline(args, work: Path) -> dict[str, object]:
    folder, path = work / "jpegs", work / "pipeline.json"
    images, epochs, batch, workers = ("64", "1", "16", "1") if args.tiny else ("10000", "2", "256", "14")
    made = run(python("benchmarks/train_pipeline.py", "--make-folder", str(folder), "--images", images), args.timeout)
    cmd = python("benchmarks/train_pipeline.py", "--folder", str(folder), "--device", args.device, "--epochs", epochs,
                 "--batch", batch, "--workers", workers, "--json", str(path))
    # the recipe's own pipeline (device) and the timm reference; the dry run only the recipe's, to stay short
    cmd += ["--pipelines", "device"] + ([] if args.tiny else ["timm"])
    result = run(cmd + ([] if args.tiny else ["--profile"]), args.timeout)
    return {**result, "exit": made["exit"] or result["exit"], "make_folder": made, "results": load_json(path)}


RUNNERS = {"cuda-tests": part_cuda_tests, "suite": part_suite, "quickstart": part_quickstart, "guard": part_guard,
           "trainer-vs-raw": part_trainer_vs_raw, "raw-step": part_raw_step, "inference": part_inference,
           "pipeline": part_pipeline}


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
    if name == "quickstart":
        return ["| key | value |", "|---|---|"] + [f"| {k} | {fmt(v)} |" for k, v in part["summary"].items()] + [""]
    if name == "guard":
        rows = part.get("results") or []
        head = ["| optimizer | plain ms | guarded ms | guarded/plain | copy MiB | params MiB | "
                "peak MiB plain→guarded |",
                "|---|---|---|---|---|---|---|"]
        return head + [f"| {r['optimizer']} | {fmt(r['plain_ms'])} | {fmt(r['guarded_ms'])} | "
                       f"{fmt(r['guarded_over_plain'])} | {fmt(r['guard_copy_mib'])} | {fmt(r['parameter_mib'])} | "
                       f"{fmt(r['peak_mib_plain'])}→{fmt(r['peak_mib_guarded'])} |" for r in rows] + [""]
    if name == "trainer-vs-raw":
        return [f"`{part['trainer']['command']}`", "",
                f"trainer {fmt(part['trainer_img_s_last_epoch'])} img/s (last epoch); raw compiled step "
                f"{fmt(part['raw_compiled_img_s'])} img/s; trainer/raw **{fmt(part['trainer_over_raw'])}**", ""]
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
    if name in ("inference", "pipeline"):
        return ["```json", json.dumps(part.get("results"), indent=1)[:6000], "```", ""]
    return []


def write_report(report: dict[str, object], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    texts = {"gpu_report.json": json.dumps(report, indent=2), "gpu_report.md": markdown(report)}
    for name, text in texts.items():
        path = out / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(path)


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
        reports = []
        for path in args.merge:  # a report of another tool, or one cut short, is one line, not a traceback
            try:
                report = json.loads(path.read_text())
                assert isinstance(report.get("machines"), list) and isinstance(report.get("parts"), dict)
            except (OSError, ValueError, AttributeError, AssertionError) as err:
                parser.error(f"--merge {path}: not a gpu_report.json ({err or 'no machines/parts'})")
            reports.append(report)
        merged = {"machines": [m for r in reports for m in r["machines"]],
                  "parts": {k: v for r in reports for k, v in r["parts"].items()}}
        write_report(merged, args.out)
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

"""Speed of `resmlp eval-knn`'s k-NN: torch (resmlp.train.probe.knn_accuracy) vs the scikit-learn code it replaced.

    .venv/bin/python benchmarks/knn_speed.py CHECKPOINT [--data fashion-mnist] [--rounds 5] [--threads 1]
        [--command-rounds 2]

Extracts the frozen features of the train and test splits once, then times DINO's weighted k-NN (k=20,
T=0.07) both ways on the same features in interleaved rounds (the order alternates every round, so load from
other processes hits both alike) and reports the medians and their ratio; the two must give the same top-1.
The reference is the earlier implementation, rewritten here: scikit-learn's brute-force KNeighborsClassifier
on cosine distance with the vote weight exp((1 - d) / T) = exp(sim / T) as a Python function.

With --command-rounds N it also times the whole command `resmlp eval-knn CHECKPOINT --threads T` (start-up,
data, feature extraction and k-NN) N times each way, interleaved: `--amp none` (fp32 features) and `--amp auto`
(bf16 where the CPU has native bf16), and with --baseline-src DIR the same command run from an earlier
checkout's src/ (e.g. `git worktree add /tmp/before a91b82f`, the code before the k-NN, batching and
feature-path changes), each with its top-1. It then prints the fp32 floor, a lower bound for a whole
fp32 command on this host (importing torch, the feature model's matrix products for every image timed alone at
their own shapes, and the k-NN's similarity product alone), and so the largest speed-up over the earlier code
that fp32 features allow here.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch
from sklearn.neighbors import KNeighborsClassifier
from threadpoolctl import threadpool_limits
from torch.utils.data import DataLoader
from torch.utils.flop_counter import FlopCounterMode

from resmlp.data import build_dataset, heldout_split
from resmlp.evaluation import resolve_checkpoint
from resmlp.fileio import write_json
from resmlp.hostinfo import host_info
from resmlp.inference import LoadedModel, load_for_inference, optimize_features
from resmlp.train.probe import extract_features, knn_accuracy


def sklearn_knn_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                         k: int = 20, temperature: float = 0.07) -> float:
    """The scikit-learn k-NN that `eval-knn` used before: the reference for speed and for the result."""
    knn = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute",
                               weights=lambda d: np.exp((1 - d) / temperature))
    knn.fit(train_x, train_y)
    return float((knn.predict(test_x) == test_y).mean() * 100)


def features(loaded: LoadedModel, data: str) -> list[np.ndarray]:
    pre, out = loaded.preprocess, []
    fast = optimize_features(loaded.model, "fp32")
    for split in ("train", heldout_split(data)):
        dataset = build_dataset(data, split, None, pre.in_chans, pre.eval_transform(), img_size=pre.img_size)
        out += [t.numpy() for t in extract_features(fast, DataLoader(dataset, batch_size=256, num_workers=0))]
    return out


def timed(fn, *args) -> tuple[float, float]:
    start = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - start, result


def compare_functions(feats: list[np.ndarray], rounds: int, k: int, temperature: float) -> dict:
    variants = {"torch": lambda: knn_accuracy(*feats, k=k, temperature=temperature),
                "scikit-learn": lambda: sklearn_knn_accuracy(*feats, k=k, temperature=temperature)}
    seconds = {name: [] for name in variants}
    top1 = {}
    for r in range(rounds):
        for name in (list(variants) if r % 2 == 0 else list(variants)[::-1]):
            elapsed, top1[name] = timed(variants[name])
            seconds[name].append(elapsed)
    return {"seconds": seconds, "top1": top1}


def compare_commands(checkpoint: Path, data: str, rounds: int, threads: int, baseline_src: str | None) -> dict:
    """Whole `resmlp eval-knn` runs: fp32 and auto features, and the earlier code when a checkout is given."""
    args = ["eval-knn", str(checkpoint), "--data", data, "--threads", str(threads)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    commands = {"fp32": ([sys.executable, "-m", "resmlp", *args, "--amp", "none"], env),
                "auto": ([sys.executable, "-m", "resmlp", *args, "--amp", "auto"], env)}
    if baseline_src:  # earlier code may have no --threads: OMP_NUM_THREADS sets its threads
        commands["earlier code"] = ([sys.executable, "-m", "resmlp", *args[:4]],
                                    {**env, "PYTHONPATH": str(Path(baseline_src, "src").resolve())})
    seconds = {name: [] for name in commands}
    top1, precision = {}, {}
    for r in range(rounds):
        for name in (list(commands) if r % 2 == 0 else list(commands)[::-1]):
            command, command_env = commands[name]
            start = time.perf_counter()
            done = subprocess.run(command, env=command_env, capture_output=True, text=True, check=True)
            seconds[name].append(time.perf_counter() - start)
            summary = json.loads(done.stdout.strip().splitlines()[-1])
            top1[name], precision[name] = summary["knn_top1"], summary.get("precision", "fp32")
    med = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"resmlp eval-knn {checkpoint} --threads {threads}, {rounds} interleaved rounds (whole command)")
    for name, s in seconds.items():
        versus = (f", {med['earlier code'] / med[name]:.2f}x faster than the earlier code"
                  if baseline_src and name != "earlier code" else "")
        print(f"  {name:12s} ({precision[name]}) median {med[name]:6.2f} s (rounds: "
              f"{', '.join(f'{x:.2f}' for x in s)}), top-1 {top1[name]:.2f} %{versus}")
    return {"seconds": seconds, "median_seconds": med, "top1": top1, "precision": precision}


PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def product_seconds(name: str, shapes: list[list[int]], repeats: int = 5) -> float:
    """The best time of one matrix product of the recorded shapes (inputs drawn afresh, layout ignored)."""
    a, b = (torch.randn(*shape) for shape in (shapes[:2] if name in ("aten::mm", "aten::bmm") else shapes[1:3]))
    product = torch.mm if a.dim() == 2 else torch.bmm
    product(a, b)
    return min(timed(product, a, b)[0] for _ in range(repeats))


def fp32_floor(loaded: LoadedModel, train_images: int, test_images: int, feature_dim: int, threads: int) -> dict:
    """A lower bound for a whole fp32 `eval-knn` here: importing torch, the feature model's matrix
    products alone (each timed at its own shapes, as recorded in one forward pass; no stem, data or
    elementwise work), and the k-NN's similarity product alone (test x train; no top-k or votes)."""
    pre, model = loaded.preprocess, loaded.model.eval()
    batch = torch.zeros(256, pre.in_chans, pre.img_size, pre.img_size)
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model.forward_features(batch)
    with torch.profiler.profile(record_shapes=True) as prof, torch.inference_mode():
        model.forward_features(batch)
    per_batch = sum(product_seconds(e.name, e.input_shapes) for e in prof.events() if e.name in PRODUCTS)
    images = train_images + test_images
    products = per_batch / len(batch) * images
    similarities = product_seconds("aten::mm", [[1000, feature_dim], [feature_dim, train_images]]) * test_images / 1000
    # start-up: any process that runs the model imports torch (the command imports more, lazily)
    imports = [sys.executable, "-c", "import torch"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    start_up = min(timed(partial(subprocess.run, imports, env=env, check=True))[0] for _ in range(3))
    flops = counter.get_total_flops() / len(batch) * images
    floor = start_up + products + similarities
    print(f"fp32 floor: import torch {start_up:.2f} s + the feature model's products alone {products:.2f} s "
          f"({flops / 1e12:.3f} TFLOP in all, {flops / products / 1e9:.0f} GFLOP/s) + the k-NN's similarity "
          f"product alone {similarities:.2f} s = {floor:.2f} s")
    return {"images": images, "start_up_s": start_up, "feature_tflop": flops / 1e12, "products_s": products,
            "similarities_s": similarities, "floor_s": floor}


def report(title: str, result: dict) -> dict:
    med = {name: statistics.median(s) for name, s in result["seconds"].items()}
    ratio = med["scikit-learn"] / med["torch"]
    print(f"{title}")
    for name, s in result["seconds"].items():
        print(f"  {name:13s} median {med[name]:7.2f} s (rounds: {', '.join(f'{x:.2f}' for x in s)}), "
              f"top-1 {result['top1'][name]:.2f} %")
    print(f"  speed-up torch over scikit-learn: {ratio:.2f}x")
    if result["top1"]["torch"] != result["top1"]["scikit-learn"]:
        raise SystemExit(f"different top-1: {result['top1']}")
    return {"median_seconds": med, "speedup": ratio, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a checkpoint file or a run folder")
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--k", type=int, default=20)
    parser.add_argument("--temperature", type=float, default=0.07)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--command-rounds", type=int, default=0, help="also time the whole command (default: no)")
    parser.add_argument("--baseline-src", metavar="DIR", help="an earlier checkout to time the same command from")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    checkpoint = resolve_checkpoint(args.checkpoint)
    torch.set_num_threads(args.threads)
    print(json.dumps(host_info("fp32")))
    with threadpool_limits(args.threads):  # scikit-learn's BLAS gets the same threads as torch
        loaded = load_for_inference(checkpoint, dataset=args.data)
        feats = features(loaded, args.data)
        print(f"features: train {feats[0].shape}, test {feats[2].shape}, {args.threads} thread(s)")
        results = {"k-NN only": report(f"k-NN only (k={args.k}, T={args.temperature}), {args.rounds} rounds",
                                       compare_functions(feats, args.rounds, args.k, args.temperature))}
    if args.command_rounds:
        results["command"] = compare_commands(checkpoint, args.data, args.command_rounds, args.threads,
                                              args.baseline_src)
        floor = fp32_floor(loaded, len(feats[0]), len(feats[2]), feats[0].shape[1], args.threads)
        if args.baseline_src:
            floor["most_speedup_fp32"] = results["command"]["median_seconds"]["earlier code"] / floor["floor_s"]
            print(f"  so fp32 features can make the command at most {floor['most_speedup_fp32']:.2f}x faster "
                  "than the earlier code on this host")
        results["fp32 floor"] = floor
    if args.json:
        write_json(args.json, {"host": host_info("fp32"), **results})


if __name__ == "__main__":
    main()

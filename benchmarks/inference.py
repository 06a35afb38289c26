"""Inference throughput of resmlp.inference.optimize against timm's ResMLP, in one process.

For each model (resmlp_s12 -> timm resmlp_12_224, resmlp_s24 -> resmlp_24_224) and batch size, the
same random weights run in timm (fp32, the reference), in our fp32 / bf16 / int8 inference models and
in ONNX Runtime (CPU, fp32). Repetitions are interleaved (one call of each variant per round) and the
median is reported, so load from other processes hits every variant alike; ratios to timm are the
numbers to read. The machine's matrix-multiply peaks (fp32 and bf16, one big torch.matmul) are
measured in the same run. With --agreement-checkpoint, the top-1 agreement of every precision with
the fp32 model is measured on the Fashion-MNIST test set.

    python benchmarks/inference.py --reps 7 --json results.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import timm
import torch

import resmlp
from resmlp.complexity import count_gmacs
from resmlp.inference import native_bf16_available, optimize

TIMM_NAMES = {"resmlp_s12": "resmlp_12_224", "resmlp_s24": "resmlp_24_224"}
FASHION = Path("/usr/share/datasets/fashion-mnist")


def gemm_gflops(dtype: torch.dtype, n: int, reps: int = 5) -> float:
    """Median GFLOP/s of an n x n x n product x @ w.T: this machine's practical GEMM peak for `dtype`.

    x @ w.T (a linear layer's layout) rather than x @ w: without native bf16, PyTorch's bf16 product is
    several times slower on the second layout, and the models' large products use the first.
    """
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    torch.matmul(a, b.t())
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        torch.matmul(a, b.t())
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def trained_like(name: str, seed: int = 0) -> resmlp.ResMLP:
    """A preset with random weights whose Affines / LayerScales are not at their init (folding matters)."""
    torch.manual_seed(seed)
    model = resmlp.create_model(name).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(("alpha", "beta", "gamma")):
                p.add_(0.1 * torch.randn_like(p))
    return model


def timm_twin(model: resmlp.ResMLP, timm_name: str, workdir: Path) -> torch.nn.Module:
    """timm's own model holding the same weights (through resmlp.export_checkpoint)."""
    path = resmlp.export_checkpoint(model, workdir / f"{timm_name}.pth", format="timm")
    twin = timm.create_model(timm_name, pretrained=False)
    twin.load_state_dict(torch.load(path, weights_only=True))
    return twin.eval()


def onnx_runner(model: resmlp.ResMLP, workdir: Path):
    import onnxruntime as ort

    from resmlp.export import export_onnx

    path = export_onnx(model, workdir / "model.onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()  # same thread budget as PyTorch
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return lambda x: torch.from_numpy(session.run(None, {"images": x.numpy()})[0])


def build_variants(name: str, precisions: list[str], compile_: bool, workdir: Path) -> dict:
    model = trained_like(name)
    variants = {"timm fp32": timm_twin(model, TIMM_NAMES[name], workdir)}
    for precision in precisions:
        if precision == "onnx":
            variants["onnxruntime fp32"] = onnx_runner(model, workdir)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the no-native-bf16 warning: the table footnote says it
            variants[f"ours {precision}"] = optimize(model, precision)
    if compile_:
        variants["ours fp32 compiled"] = optimize(model, "fp32", compile=True)
    return variants


def run_model(name: str, batch: int, args: argparse.Namespace, peaks: dict, workdir: Path) -> list[dict]:
    precisions = list(args.precisions)
    if batch > 1 and "bf16" in precisions and not native_bf16_available("cpu"):
        # emulated bf16 runs at a few GFLOP/s: a batch of 32 would take minutes per call
        print(f"{name} batch {batch}: bf16 not run (this CPU has no native bf16; see batch 1)")
        precisions.remove("bf16")
    variants = build_variants(name, precisions, args.compile, workdir)
    x = torch.randn(batch, 3, 224, 224)
    gflop = 2 * count_gmacs(resmlp.create_model(name), (3, 224, 224)) * batch
    slow_bf16 = not native_bf16_available("cpu")
    timed = {k: [] for k in variants}
    with torch.inference_mode():
        outputs = {k: fn(x) for k, fn in variants.items()}  # warm-up, and the top-1 check
        for _ in range(args.reps):
            for key, fn in variants.items():
                if slow_bf16 and "bf16" in key and timed[key]:
                    continue  # emulated bf16 is ~100x slower: one timed call is all it gets
                start = time.perf_counter()
                fn(x)
                timed[key].append(time.perf_counter() - start)
    reference = outputs["timm fp32"].argmax(-1)
    base = batch / statistics.median(timed["timm fp32"])
    rows = []
    for key, times in timed.items():
        ips = batch / statistics.median(times)
        peak = peaks["bf16"] if "bf16" in key else peaks["fp32"]
        rows.append(dict(model=name, batch=batch, variant=key, images_per_s=ips, vs_timm_fp32=ips / base,
                         pct_of_peak=100 * ips / batch * gflop / peak,
                         top1_same_as_timm=float((outputs[key].argmax(-1) == reference).float().mean()),
                         runs=len(times)))
    return rows


# ------------------------------------------------------------------------------------------ agreement
def read_idx(path: Path) -> np.ndarray:
    """An IDX file (gzip) as an array: magic (2 zero bytes, dtype code, ndim), big-endian dims, data."""
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def agreement(checkpoint: Path, precisions: list[str]) -> list[dict]:
    """Top-1 agreement of each precision with the fp32 model, and accuracy, on Fashion-MNIST t10k."""
    from PIL import Image

    from resmlp.inference import load_for_inference

    loaded = load_for_inference(checkpoint)
    model, transform = loaded.model, loaded.preprocess.eval_transform()  # the one evaluation transform
    mode = "L" if loaded.preprocess.in_chans == 1 else "RGB"
    pixels = read_idx(FASHION / "t10k-images-idx3-ubyte.gz")
    labels = torch.from_numpy(read_idx(FASHION / "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    x = torch.stack([transform(Image.fromarray(p).convert(mode)) for p in pixels])
    variants = {"fp32 (model)": model}
    for precision in precisions:
        if precision != "onnx":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                variants[f"ours {precision}"] = optimize(model, precision)
    preds = {}
    with torch.inference_mode():
        for key, fn in variants.items():
            preds[key] = torch.cat([fn(chunk).argmax(-1) for chunk in x.split(500)])
    ref = preds["fp32 (model)"]
    return [dict(variant=k, top1_agreement_with_fp32=float((p == ref).float().mean()),
                 accuracy=float((p == labels).float().mean())) for k, p in preds.items()]


# ------------------------------------------------------------------------------------------ output
def markdown(rows: list[dict], peaks: dict) -> str:
    lines = [f"fp32 matmul peak {peaks['fp32']:.1f} GFLOP/s, bf16 matmul peak {peaks['bf16']:.1f} GFLOP/s "
             f"(native bf16: {native_bf16_available('cpu')}), {torch.get_num_threads()} threads",
             "", "| model | batch | variant | images/s | vs timm fp32 | % of GEMM peak | top-1 = timm | runs |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['variant']} | {r['images_per_s']:.2f} | "
                     f"{r['vs_timm_fp32']:.2f}x | {r['pct_of_peak']:.0f}% | {100 * r['top1_same_as_timm']:.0f}% | "
                     f"{r['runs']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(TIMM_NAMES), choices=list(TIMM_NAMES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32, 1])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16", "int8", "onnx"],
                        choices=["fp32", "bf16", "int8", "onnx"])
    parser.add_argument("--reps", type=int, default=7, help="interleaved rounds (batch 1 gets 5x as many)")
    parser.add_argument("--compile", action="store_true", help="also time optimize(..., compile=True)")
    parser.add_argument("--agreement-checkpoint", type=Path, help="Fashion-MNIST checkpoint for the bf16/int8 "
                        "top-1 agreement on the t10k set (only the agreement runs without --models)")
    parser.add_argument("--skip-speed", action="store_true", help="only run the agreement check")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()

    results: dict = {}
    if not args.skip_speed:
        fp32_peak = gemm_gflops(torch.float32, 2048)
        # emulated bf16 runs at a few GFLOP/s: a smaller product keeps its measurement short
        bf16_peak = gemm_gflops(torch.bfloat16, 2048 if native_bf16_available("cpu") else 512)
        peaks = {"fp32": fp32_peak, "bf16": bf16_peak}
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.models:
                for batch in args.batch_sizes:
                    reps_args = argparse.Namespace(**{**vars(args), "reps": args.reps * (5 if batch == 1 else 1)})
                    new = run_model(name, batch, reps_args, peaks, Path(tmp))
                    print(markdown(new, peaks), flush=True)
                    rows += new
        print("\n" + markdown(rows, peaks))
        results.update(peaks_gflops=peaks, throughput=rows)
        if args.csv:
            import csv

            with args.csv.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
    if args.agreement_checkpoint:
        agree = agreement(args.agreement_checkpoint, args.precisions)
        print("\n| variant | top-1 agreement with fp32 | accuracy |\n|---|---:|---:|")
        for a in agree:
            print(f"| {a['variant']} | {100 * a['top1_agreement_with_fp32']:.2f}% | {100 * a['accuracy']:.2f}% |")
        results["agreement"] = agree
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

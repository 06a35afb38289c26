"""Inference throughput of resmlp.inference.optimize against timm's ResMLP, in one process, on CPU or GPU.

For each model (resmlp_s12 -> timm resmlp_12_224, resmlp_s24 -> resmlp_24_224) and batch size, the
same random weights run in timm (fp32, the reference; on a GPU also in bf16 autocast), in our fp32 /
bf16 / int8 inference models and in ONNX Runtime (CPU, fp32); with --compile, ours and timm's also
compiled in each torch.compile mode given, side by side. Repetitions are interleaved (one call of each
variant per round) and the median is reported, so load from other processes hits every variant alike;
ratios to timm are the numbers to read. The device's matrix-multiply peaks (fp32 and bf16, one big
torch.matmul) are measured in the same run, and every row says which fraction of its precision's peak
the model's FLOP/s reach (FLOPs from resmlp.complexity.count_gmacs: torch's FlopCounterMode). With
--agreement-checkpoint, the top-1 agreement of every precision with the fp32 model is measured on the
Fashion-MNIST test set.

    python benchmarks/inference.py --reps 7 --json results.json
    python benchmarks/inference.py --device cuda --models resmlp_s12 --batch-sizes 32 256 --reps 50 \
        --compile default max-autotune reduce-overhead
"""

from __future__ import annotations

import argparse
import gzip
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import timm
import torch
import torch._dynamo

import resmlp
from resmlp.analysis.benchmark import BF16Autocast, float32_matmul
from resmlp.complexity import count_gmacs
from resmlp.fileio import atomic_write, write_json
from resmlp.inference import COMPILE_MODES, compile_for_inference, compile_mode, native_bf16_available, optimize

TIMM_NAMES = {"resmlp_s12": "resmlp_12_224", "resmlp_s24": "resmlp_24_224"}
FASHION = Path("/usr/share/datasets/fashion-mnist")
# --tiny: a smoke-test size of the same architecture (ours, and timm's MlpMixer arguments for it)
TINY = dict(img_size=32, patch_size=8, dim=64, depth=2)
TINY_TIMM = dict(img_size=32, patch_size=8, embed_dim=64, num_blocks=2)
GPU_PRECISIONS = ("fp32", "bf16")  # int8 (fbgemm) and ONNX Runtime here are CPU paths
CPU = torch.device("cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def gemm_gflops(dtype: torch.dtype, n: int, device: torch.device = CPU, reps: int = 5) -> float:
    """Median GFLOP/s of an n x n x n product x @ w.T on `device`: its practical GEMM peak for `dtype`.

    x @ w.T (a linear layer's layout) rather than x @ w: without native bf16, PyTorch's bf16 product is
    several times slower on the second layout, and the models' large products use the first. On a GPU,
    fp32 is measured without TF32 (the run keeps fp32 products in full fp32).
    """
    a, b = torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)
    torch.matmul(a, b.t())
    times = []
    for _ in range(reps):
        sync(device)
        start = time.perf_counter()
        torch.matmul(a, b.t())
        sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / statistics.median(times) / 1e9


def trained_like(name: str, seed: int = 0, tiny: bool = False) -> resmlp.ResMLP:
    """A preset with random weights whose Affines / LayerScales are not at their init (folding matters)."""
    torch.manual_seed(seed)
    model = resmlp.create_model(name, **(TINY if tiny else {})).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.endswith(("alpha", "beta", "gamma")):
                p.add_(0.1 * torch.randn_like(p))
    return model


def timm_twin(model: resmlp.ResMLP, timm_name: str, workdir: Path, tiny: bool = False) -> torch.nn.Module:
    """timm's own model holding the same weights (through resmlp.export_checkpoint)."""
    path = resmlp.export_checkpoint(model, workdir / f"{timm_name}.pth", format="timm")
    if tiny:  # timm's named ResMLPs fix width and depth: their class (MlpMixer of ResBlocks) at the tiny size
        from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

        twin = MlpMixer(**TINY_TIMM, mlp_ratio=4, block_layer=ResBlock, norm_layer=Affine)
    else:
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


def variant_name(who: str, precision: str, mode: str | None) -> str:
    """'ours bf16', 'timm bf16 compiled max-autotune', ...: ours and timm's twin differ in the first word."""
    return f"{who} {precision}" + (f" compiled {mode}" if mode else "")


def build_variants(name: str, precisions: list[str], modes: list[str], device: torch.device, workdir: Path,
                   tiny: bool = False) -> dict:
    model = trained_like(name, tiny=tiny)
    twin = timm_twin(model, TIMM_NAMES[name], workdir, tiny).to(device)
    model = model.to(device)
    variants = {"timm fp32": twin}
    if device.type == "cuda" and "bf16" in precisions:
        variants["timm bf16"] = BF16Autocast(twin)  # how timm runs in bf16: autocast
    for precision in precisions:
        if precision == "onnx":
            variants["onnxruntime fp32"] = onnx_runner(model, workdir)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the no-native-bf16 warning: the table footnote says it
            variants[f"ours {precision}"] = optimize(model, precision)
    for mode in modes:
        for precision in (p for p in precisions if p in GPU_PRECISIONS):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                variants[variant_name("ours", precision, mode)] = optimize(model, precision, compile=mode)
            timm_runner = BF16Autocast(twin) if precision == "bf16" else twin
            variants[variant_name("timm", precision, mode)] = compile_for_inference(timm_runner, mode)
    return variants


def run_model(name: str, batch: int, args: argparse.Namespace, peaks: dict, workdir: Path) -> list[dict]:
    device = torch.device(args.device)
    precisions = list(args.precisions)
    slow_bf16 = not native_bf16_available(device)
    if batch > 1 and "bf16" in precisions and slow_bf16:
        # emulated bf16 runs at a few GFLOP/s: a batch of 32 would take minutes per call
        print(f"{name} batch {batch}: bf16 not run (this CPU has no native bf16; see batch 1)")
        precisions.remove("bf16")
    if args.compile:  # compiled graphs of earlier models and batches would count against dynamo's recompile limit
        torch._dynamo.reset()
    variants = build_variants(name, precisions, args.compile, device, workdir, args.tiny)
    size = TINY["img_size"] if args.tiny else 224
    x = torch.randn(batch, 3, size, size, device=device)
    gflop = 2 * count_gmacs(resmlp.create_model(name, **(TINY if args.tiny else {})), (3, size, size)) * batch
    timed = {k: [] for k in variants}
    with torch.inference_mode():
        outputs = {k: fn(x).float() for k, fn in variants.items()}  # warm-up (compiles), and the top-1 check
        for _ in range(args.warmup - 1):  # CUDA graphs record on the second call
            for key, fn in variants.items():
                if not (slow_bf16 and "bf16" in key):  # emulated bf16: too slow to repeat, and never compiled
                    fn(x)
        for _ in range(args.reps):
            for key, fn in variants.items():
                if slow_bf16 and "bf16" in key and timed[key]:
                    continue  # emulated bf16 is ~100x slower: one timed call is all it gets
                sync(device)
                start = time.perf_counter()
                fn(x)
                sync(device)
                timed[key].append(time.perf_counter() - start)
    reference = outputs["timm fp32"].argmax(-1)
    base = batch / statistics.median(timed["timm fp32"])
    speed = {key: batch / statistics.median(times) for key, times in timed.items()}
    rows = []
    for key, times in timed.items():
        peak = peaks["bf16"] if "bf16" in key else peaks["fp32"]
        twin = key.replace("ours", "timm", 1)
        rows.append(dict(model=name, batch=batch, variant=key, device=str(device), images_per_s=speed[key],
                         vs_timm_fp32=speed[key] / base,
                         vs_timm_same=speed[key] / speed[twin] if key.startswith("ours") and twin in speed else None,
                         pct_of_peak=100 * speed[key] / batch * gflop / peak,
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


def agreement(checkpoint: Path, precisions: list[str], device: torch.device = CPU,
              modes: tuple[str, ...] = (), fashion: Path = FASHION) -> list[dict]:
    """Top-1 agreement of each precision (and compile mode) with the fp32 model, and accuracy, on Fashion-MNIST
    t10k, on `device`."""
    from PIL import Image

    from resmlp.inference import load_for_inference

    loaded = load_for_inference(checkpoint)
    model, transform = loaded.model.to(device), loaded.preprocess.eval_transform()  # the one evaluation transform
    mode = "L" if loaded.preprocess.in_chans == 1 else "RGB"
    pixels = read_idx(fashion / "t10k-images-idx3-ubyte.gz")
    labels = torch.from_numpy(read_idx(fashion / "t10k-labels-idx1-ubyte.gz").astype(np.int64))
    x = torch.stack([transform(Image.fromarray(p).convert(mode)) for p in pixels]).to(device)
    variants = {"fp32 (model)": model}
    for precision in (p for p in precisions if p != "onnx"):
        for compiled in (None, *modes) if precision in GPU_PRECISIONS else (None,):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                variants[variant_name("ours", precision, compiled)] = optimize(model, precision, compile=compiled)
    preds = {}
    with torch.inference_mode():
        for key, fn in variants.items():
            preds[key] = torch.cat([fn(chunk).argmax(-1) for chunk in x.split(500)]).cpu()
    ref = preds["fp32 (model)"]
    return [dict(variant=k, device=str(device), top1_agreement_with_fp32=float((p == ref).float().mean()),
                 accuracy=float((p == labels).float().mean())) for k, p in preds.items()]


# ------------------------------------------------------------------------------------------ output
def markdown(rows: list[dict], peaks: dict, device: torch.device) -> str:
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    lines = [f"{device.type}: {where}; fp32 matmul peak {peaks['fp32']:.1f} GFLOP/s, bf16 matmul peak "
             f"{peaks['bf16']:.1f} GFLOP/s (native bf16: {native_bf16_available(device)})",
             "", "| model | batch | variant | images/s | vs timm fp32 | vs timm same | % of GEMM peak | top-1 = timm "
             "| runs |", "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same = "" if r["vs_timm_same"] is None else f"{r['vs_timm_same']:.2f}x"
        lines.append(f"| {r['model']} | {r['batch']} | {r['variant']} | {r['images_per_s']:.2f} | "
                     f"{r['vs_timm_fp32']:.2f}x | {same} | {r['pct_of_peak']:.0f}% | "
                     f"{100 * r['top1_same_as_timm']:.0f}% | {r['runs']} |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--models", nargs="+", default=list(TIMM_NAMES), choices=list(TIMM_NAMES))
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[32, 1])
    parser.add_argument("--precisions", nargs="+", default=None, choices=["fp32", "bf16", "int8", "onnx"],
                        help="default: fp32 bf16 int8 onnx on the CPU, fp32 bf16 on a GPU")
    parser.add_argument("--reps", type=int, default=7, help="interleaved rounds (batch 1 gets 5x as many)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first (>= 2 for "
                        "reduce-overhead, whose CUDA graph is recorded on the second)")
    parser.add_argument("--compile", nargs="*", default=None, metavar="MODE",
                        help="also time ours and timm's compiled, in each torch.compile mode given "
                        f"({', '.join(COMPILE_MODES)}; --compile alone: default)")
    parser.add_argument("--peak-size", type=int, default=None,
                        help="n of the n^3 matmul measuring the peaks (default 8192 on a GPU, 2048 on a CPU)")
    parser.add_argument("--tiny", action="store_true", help="a tiny model of the same architecture (smoke test)")
    parser.add_argument("--agreement-checkpoint", type=Path, help="Fashion-MNIST checkpoint for the bf16/int8 "
                        "top-1 agreement on the t10k set (only the agreement runs without --models)")
    parser.add_argument("--fashion-dir", type=Path, default=FASHION, help=f"Fashion-MNIST IDX files ({FASHION})")
    parser.add_argument("--skip-speed", action="store_true", help="only run the agreement check")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA GPU is visible; use --device cpu")
    args.precisions = args.precisions or (list(GPU_PRECISIONS) if device.type == "cuda" else
                                          ["fp32", "bf16", "int8", "onnx"])
    if device.type == "cuda" and not set(args.precisions) <= set(GPU_PRECISIONS):
        parser.error("int8 and onnx run on the CPU only; with --device cuda choose --precisions fp32 bf16")
    args.compile = ["default"] if args.compile == [] else (args.compile or [])  # [] is --compile alone
    try:
        for mode in args.compile:
            compile_mode(mode, device)
    except ValueError as e:
        parser.error(str(e))
    return args


def measure_peaks(args: argparse.Namespace, device: torch.device) -> dict:
    """The fp32 and bf16 GEMM peaks of the device; emulated bf16 (a CPU without it) gets a smaller product."""
    n = args.peak_size or (8192 if device.type == "cuda" else 2048)
    bf16_n = n if native_bf16_available(device) else min(n, 512)
    return {"fp32": gemm_gflops(torch.float32, n, device), "bf16": gemm_gflops(torch.bfloat16, bf16_n, device)}


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    results: dict = {}
    # fp32 rows and the fp32 peak in full fp32 (no TF32 on a GPU). One model and batch compiles up to 2 precisions
    # x 3 modes of each forward, and the agreement check as many again: past dynamo's default limit of 8 graphs
    # per function, the rest would silently run eagerly
    with float32_matmul("fp32", device), torch._dynamo.config.patch(recompile_limit=64):
        if not args.skip_speed:
            peaks = measure_peaks(args, device)
            rows = []
            with tempfile.TemporaryDirectory() as tmp:
                for name in args.models:
                    for batch in args.batch_sizes:
                        reps = args.reps * (5 if batch == 1 else 1)
                        new = run_model(name, batch, argparse.Namespace(**{**vars(args), "reps": reps}), peaks,
                                        Path(tmp))
                        print(markdown(new, peaks, device), flush=True)
                        rows += new
            print("\n" + markdown(rows, peaks, device))
            results.update(device=str(device), peaks_gflops=peaks, throughput=rows)
            if args.csv:
                import csv
                import io

                buffer = io.StringIO()
                writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
                text = buffer.getvalue()
                atomic_write(args.csv, lambda tmp: tmp.write_text(text))
        if args.agreement_checkpoint:
            agree = agreement(args.agreement_checkpoint, args.precisions, device, tuple(args.compile),
                              args.fashion_dir)
            print("\n| variant | top-1 agreement with fp32 | accuracy |\n|---|---:|---:|")
            for a in agree:
                print(f"| {a['variant']} | {100 * a['top1_agreement_with_fp32']:.2f}% | {100 * a['accuracy']:.2f}% |")
            results["agreement"] = agree
    if args.json:
        write_json(args.json, results)


if __name__ == "__main__":
    main()

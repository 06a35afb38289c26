"""Smoke runs of the study scripts in benchmarks/ on synthetic data: they train, and write their tables."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostspeed import limit


@pytest.mark.slow
def test_permutation_benchmark_trains_the_convnet_rows(tmp_path):
    # the convnet rows name their timm model in the model grammar (timm:NAME); a bare name was refused
    root = Path(__file__).resolve().parents[1]
    report = tmp_path / "permutation.md"
    cmd = [sys.executable, str(root / "benchmarks" / "permutation.py"), "--synthetic", "--epochs", "1",
           "--models", "convnet", "--out", str(tmp_path / "runs"), "--report", str(report)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    text = report.read_text()
    assert "not run" not in text and text.count("| resnet10t") == 3


def test_ablation_benchmark_writes_its_table(tmp_path):
    root = Path(__file__).resolve().parents[1]
    report = tmp_path / "ablations.md"
    cmd = [sys.executable, str(root / "benchmarks" / "ablations.py"), "--synthetic", "--epochs", "1", "--seeds", "0",
           "--only", "baseline,cross-none", "--out", str(tmp_path / "runs"), "--report", str(report)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    text = report.read_text()
    assert "| baseline |" in text and "| cross-none |" in text and "selected on the validation split" in text


@pytest.mark.slow
def test_transfer_benchmark_selects_on_validation_and_scores_test(tmp_path):
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "benchmarks" / "transfer_digits.py"), "--tiny", "--output", str(tmp_path / "t")]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    for run in ("scratch", "finetune"):
        summary = json.loads((tmp_path / "t" / run / "summary.json").read_text())
        assert summary["validation"] == "the dataset's val split" and summary["test_top1"] is not None
    digits = tmp_path / "t" / "digits"
    sizes = {split: sum(1 for _ in (digits / split).rglob("*.png")) for split in ("train", "val", "test")}
    assert sizes == {"train": 1144, "val": 203, "test": 450}  # 1,797 digits: 25 % test, 15 % of the rest val


@pytest.mark.slow
def test_knn_speed_benchmark_times_both_precisions_and_an_earlier_checkout(tmp_path):
    import torch

    import resmlp

    root = Path(__file__).resolve().parents[1]
    torch.manual_seed(0)
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=0, dim=32, depth=1)
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "interpolation": "bicubic", "mean": [0.5],
                           "std": [0.25], "in_chans": 1}}
    resmlp.save(model, tmp_path / "m.safetensors", meta)
    out = tmp_path / "knn.json"
    # this checkout stands in for the earlier one: the script only needs DIR/src to hold a resmlp package
    cmd = [sys.executable, str(root / "benchmarks" / "knn_speed.py"), str(tmp_path / "m.safetensors"), "--data",
           "synthetic", "--rounds", "1", "--command-rounds", "1", "--baseline-src", str(root), "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    results = json.loads(out.read_text())
    command = results["command"]
    assert set(command["seconds"]) == {"fp32", "auto", "earlier code"}
    assert command["precision"]["fp32"] == "fp32" and command["top1"]["fp32"] == command["top1"]["earlier code"]
    floor = results["fp32 floor"]
    # matrix products of one image: stem 16 tokens x (16 -> 32), cross-patch 16x16 @ 16x32, MLP 32 -> 128 -> 32
    per_image = 2 * (16 * 16 * 32 + 16 * 16 * 32 + 2 * 16 * 32 * 128)
    assert abs(floor["feature_tflop"] * 1e12 - per_image * floor["images"]) < 1
    parts = floor["start_up_s"] + floor["products_s"] + floor["similarities_s"]
    assert min(floor["start_up_s"], floor["products_s"]) > 0 and abs(floor["floor_s"] - parts) < 1e-9
    assert floor["floor_s"] < command["median_seconds"]["fp32"]  # a lower bound for the command it bounds
    assert floor["most_speedup_fp32"] == command["median_seconds"]["earlier code"] / floor["floor_s"]


@pytest.mark.slow
def test_allocator_benchmark_alternates_processes_and_compares_settings(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "allocator.json"
    cmd = [sys.executable, str(root / "benchmarks" / "allocator.py"), "--pairs", "2", "--json", str(out), "--",
           "--rounds", "1", "--steps", "1", "--warmup", "0", "--img-size", "32", "--batch", "2", "--precision", "fp32",
           "--variants", "ours", "timm"]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    data = json.loads(out.read_text())
    assert data["host"]["cpu_capability"] and data["pairs"] == 2
    for variant in ("ours", "timm"):  # one number per process: 2 under each setting, one ratio per pair
        result = data["results"][f"fp32 {variant}"]
        assert len(result["img_s"]["glibc"]) == len(result["img_s"]["resmlp"]) == len(result["resmlp_over_glibc"]) == 2
        assert all(r > 0 for r in result["resmlp_over_glibc"])
    across = data["results"]["fp32 ours (resmlp) / timm (glibc)"]["per_pair"]
    ours, timm = data["results"]["fp32 ours"]["img_s"]["resmlp"], data["results"]["fp32 timm"]["img_s"]["glibc"]
    assert across == [a / b for a, b in zip(ours, timm, strict=True)]


def test_page_faults_benchmark_reports_each_step(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "faults.json"
    cmd = [sys.executable, str(root / "benchmarks" / "page_faults.py"), "--malloc", "glibc", "--steps", "2",
           "--img-size", "32", "--batch", "2", "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    data = json.loads(out.read_text())
    assert data["settings"]["malloc"] == "glibc" and data["host"]["cpu_capability"]
    for variant in ("ours", "timm"):
        steps = data["results"][variant]
        assert len(steps) == 2 and all(s["wall_s"] > 0 and s["minor_faults"] >= 0 and s["peak_rss_gb"] > 0
                                       for s in steps)


def test_inference_benchmark_puts_ours_beside_timm_with_the_share_of_the_gemm_peak(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "inference.json"
    cmd = [sys.executable, str(root / "benchmarks" / "inference.py"), "--tiny", "--models", "resmlp_s12",
           "--batch-sizes", "2", "--reps", "1", "--warmup", "1", "--precisions", "fp32", "int8", "--peak-size", "256",
           "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(300))
    results = json.loads(out.read_text())
    assert results["device"] == "cpu" and min(results["peaks_gflops"].values()) > 0
    rows = {r["variant"]: r for r in results["throughput"]}
    assert list(rows) == ["timm fp32", "ours fp32", "ours int8"]
    ours = rows["ours fp32"]
    assert ours["vs_timm_same"] == ours["vs_timm_fp32"] > 0 and rows["ours int8"]["vs_timm_same"] is None
    assert ours["top1_same_as_timm"] == 1.0  # the same weights in fp32
    # % of peak = model FLOP/s over the fp32 GEMM peak; the tiny model's matrix products per image:
    # stem 16 patches x 192 -> 64, per block cross-patch 16x16 @ 16x64 and MLP 64 -> 256 -> 64, head 64 -> 1000
    flop = 2 * (16 * 192 * 64 + 2 * (16 * 16 * 64 + 2 * 16 * 64 * 256) + 64 * 1000)
    share = 100 * ours["images_per_s"] * flop / (results["peaks_gflops"]["fp32"] * 1e9)
    assert abs(ours["pct_of_peak"] - share) < 1e-6 * share


def test_inference_benchmark_refuses_cuda_graphs_without_a_gpu():
    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, str(root / "benchmarks" / "inference.py"), "--tiny", "--compile", "reduce-overhead"]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=limit(300))
    assert done.returncode == 2 and "reduce-overhead replays CUDA graphs and needs a CUDA GPU" in done.stderr


@pytest.mark.slow
@pytest.mark.hosttype  # it ran emulated bf16 on AVX2 hosts, past its limit (issue 57)
def test_the_gpu_report_dry_runs_every_part_on_the_cpu_and_merges(tmp_path):
    """benchmarks/gpu_report.py --device cpu --tiny: every part runs and is reported; --merge joins two reports."""
    from resmlp.hostinfo import native_bf16

    root = Path(__file__).resolve().parents[1]
    script = str(root / "benchmarks" / "gpu_report.py")
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    first, second = ["cuda-tests", "suite", "quickstart", "guard"], ["trainer-vs-raw", "raw-step", "inference",
                                                                        "pipeline"]
    third = ["node"]
    for out, parts in ((tmp_path / "a", first), (tmp_path / "b", second), (tmp_path / "c", third)):
        subprocess.run([sys.executable, script, "--out", str(out), "--device", "cpu", "--tiny", "--parts", *parts,
                        "--timeout", f"{limit(300):.0f}"], check=True, env=env, capture_output=True, timeout=limit(600))
    subprocess.run([sys.executable, script, "--merge", *[str(tmp_path / r / "gpu_report.json") for r in "abc"],
                    "--out", str(tmp_path / "m")], check=True, env=env, capture_output=True, timeout=limit(60))
    report = json.loads((tmp_path / "m" / "gpu_report.json").read_text())
    assert list(report["parts"]) == first + second + third
    failed = {name: part.get("output_tail", part.get("error")) for name, part in report["parts"].items()
              if part["exit"] != 0}
    assert failed == {}
    assert report["parts"]["quickstart"]["summary"]["test_top1"] is not None
    # the host's amp: auto, never bf16 where the CPU emulates it (~60x slower: past the limit on AVX2 hosts)
    auto = "bf16" if native_bf16() else "fp32"
    assert f"--precision {auto}" in report["parts"]["pipeline"]["command"]
    assert f"--precision {auto}" in report["parts"]["raw-step"]["batch64"]["command"]
    assert report["parts"]["pipeline"]["dino"]["results"]["device_path"]["ops_per_batch"] > 0  # DINO's multi-crop
    node = report["parts"]["node"]["results"]  # resmlp benchmark --pipeline: both paths, and auto's pick
    assert set(node["paths"]) == {"device", "timm"} and node["auto_would_choose"]["name"] in node["paths"]
    assert report["parts"]["guard"]["results"][0]["guard_copy_mib"] > report["parts"]["guard"]["results"][0][
        "parameter_mib"]  # the moments are in the guard's copy
    markdown = (tmp_path / "m" / "gpu_report.md").read_text()
    assert all(f"## {name}: ok" in markdown for name in first + second + third) and markdown.count("| torch |") == 3


def test_the_gpu_report_refuses_a_damaged_report_to_merge_in_one_line(tmp_path):
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "cut.json").write_text('{"machines": [')
    (tmp_path / "other.json").write_text('{"a": 1}')
    for bad in ("cut.json", "other.json"):
        done = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_report.py"), "--merge",
                               str(tmp_path / bad), "--out", str(tmp_path / "m")], capture_output=True, text=True,
                              timeout=limit(60))
        assert done.returncode == 2 and "not a gpu_report.json" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_the_models_table_benchmark_times_both_ways(tmp_path):
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "models_table.py"), "--rounds", "1"],
                          check=True, capture_output=True, text=True, timeout=limit(600),
                          env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert "analytic (now): median" in done.stdout and "measured (before): median" in done.stdout
    assert "x faster; host" in done.stdout


@pytest.mark.slow
def test_data_startup_benchmark_compares_the_three_listings(tmp_path):
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "startup.json"
    cmd = [sys.executable, str(root / "benchmarks" / "data_startup.py"), "--classes", "3", "--images", "4",
           "--repeats", "1", "--folder", str(tmp_path / "folder"), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=limit(600))
    report = json.loads(out.read_text())
    results = report["results"]
    assert set(results) == {"ours", "timm", "torchvision"} and report["files"] == 12
    assert all(r["files"] == 12 and r["batch"] == 12 for r in results.values())
    # ours: only the split folders' names checked (train, training, val...), no stat per file (12 files here)
    assert results["ours"]["stat_calls"] <= 8 and results["torchvision"]["stat_calls"] >= 3

"""resmlp benchmark: model specs, the measurements, and the command's CSV/plot output."""

from __future__ import annotations

import csv

import pytest
import torch

import resmlp
from resmlp.analysis import benchmark
from resmlp.cli import main
from resmlp.complexity import count_params
from resmlp.data import build_dataset
from resmlp.preprocess import Preprocess

TINY_OURS = "resmlp_s12[dim=32,depth=2,img_size=32,patch_size=8,num_classes=10]"
TINY_TIMM = "timm:test_resnet[num_classes=10,img_size=64]"  # a convnet: img_size only sets the input


def test_models_are_named_in_the_one_grammar_with_bracketed_overrides():
    specs = benchmark.parse_models(f"{TINY_OURS},timm:resnet50, mixer_s16[act=relu,drop_rate=0.1,layerscale=false],"
                                   "resmlp_s12[cross_patch=none,init_values=null],runs/x/best.safetensors")
    assert [s.name for s in specs] == ["resmlp_s12", "timm:resnet50", "mixer_s16", "resmlp_s12",
                                       "runs/x/best.safetensors"]
    assert [s.model.kind for s in specs] == ["preset", "timm", "preset", "preset", "file"]
    assert specs[0].overrides == dict(dim=32, depth=2, img_size=32, patch_size=8, num_classes=10)
    assert specs[0].label == TINY_OURS
    assert specs[1].overrides == {} and specs[1].label == "timm:resnet50"
    assert specs[2].overrides == dict(act="relu", drop_rate=0.1, layerscale=False)  # YAML values, as --set
    assert specs[3].overrides == dict(cross_patch="none", init_values=None)
    assert benchmark.split_top_level("a[x=[1,2],y=3], b,,c", "models") == ["a[x=[1,2],y=3]", "b", "c"]
    with pytest.raises(ValueError, match="write timm:resnet50"):
        benchmark.parse_models("resmlp_s12,resnet50")
    with pytest.raises(ValueError, match="key=value"):
        benchmark.parse_models("resmlp_s12[dim]")
    with pytest.raises(ValueError, match="never closed"):
        benchmark.parse_models("resmlp_s12[dim=3,timm:resnet50")
    with pytest.raises(ValueError, match="in brackets at the end"):
        benchmark.parse_models("resmlp_s12[dim=3]x")
    with pytest.raises(ValueError, match="no models"):
        benchmark.parse_models(" , ")


def test_specs_build_presets_timm_models_and_checkpoint_files(tmp_path):
    model, shape = benchmark.build_model(benchmark.parse_spec(TINY_OURS))
    assert shape == (3, 32, 32) and model.config.dim == 32 and not model.training
    model, shape = benchmark.build_model(benchmark.parse_spec("timm:test_resnet"), img_size=48)  # any size
    assert shape == (3, 48, 48) and not isinstance(model, resmlp.ResMLP)
    path = resmlp.save(
        resmlp.create_model("resmlp_s12", dim=16, depth=1, img_size=16, patch_size=4),
        tmp_path / "m.safetensors",
    )
    model, shape = benchmark.build_model(benchmark.parse_spec(str(path)))
    assert shape == (3, 16, 16) and model.config.dim == 16
    with pytest.raises(ValueError, match="did you mean resmlp_s12"):
        benchmark.parse_spec("resmlp_s121")


def test_cpu_peak_memory_grows_with_the_activations():
    # fc1 activations are batch x 64 patches x 256 x 4 bytes: 4 MiB each at batch 64, 0.25 MiB at batch 4
    spec = benchmark.parse_spec("resmlp_s12[dim=64,depth=1,img_size=64,patch_size=8]")
    small = benchmark.cpu_peak_memory_mb(spec, 4, None)
    large = benchmark.cpu_peak_memory_mb(spec, 64, None)
    assert 0 <= small < large and large - small > 4


def test_throughput_is_the_median_over_rounds_of_images_per_second():
    import torch

    calls = []

    class Sleepy(torch.nn.Module):
        def forward(self, x):
            calls.append(len(x))
            return x

    speeds = benchmark.measure_throughput(
        {"a": (Sleepy(), torch.zeros(8, 1))}, repeats=3, warmup=1, min_time=0.0
    )
    assert len(calls) == 1 + 3 and all(n == 8 for n in calls)  # one warm-up pass, then one pass per round
    assert speeds["a"] > 0


def test_benchmark_command_writes_the_table_as_csv_with_the_host(tmp_path, capsys):
    out = tmp_path / "table.csv"
    plot = tmp_path / "tradeoff.png"
    code = main(
        [
            "benchmark",
            "--models",
            f"{TINY_OURS},{TINY_TIMM}",
            "--batch-size",
            "4",
            "--repeats",
            "2",
            "--warmup",
            "1",
            "--min-time",
            "0.02",
            "--device",
            "cpu",
            "--threads",
            "1",
            "--output",
            str(out),
            "--accuracy",
            "resmlp_s12=61.5",
            "--plot",
            str(plot),
        ]
    )
    assert code == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "im/s @4" in printed and "test_resnet" in printed
    assert "host: " in printed and "CPU capability" in printed  # the host line under the table
    assert "round 2/2" in captured.err and "/step" in captured.err or "step/s" in captured.err  # bar, rate
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == benchmark.CSV_COLUMNS
    assert [r["model"] for r in rows] == [TINY_OURS, TINY_TIMM]
    assert [r["img_size"] for r in rows] == ["32", "64"]
    for r in rows:
        assert float(r["throughput_img_s"]) > 0 and float(r["throughput_b1_img_s"]) > 0
        assert float(r["gmacs"]) > 0 and float(r["peak_memory_mb"]) >= 0 and r["batch_size"] == "4"
        assert r["threads"] == "1" and r["precision"] == "fp32" and r["torch"] == torch.__version__
        assert r["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and r["cpu"]
    expected_params = count_params(
        resmlp.create_model("resmlp_s12", dim=32, depth=2, img_size=32, patch_size=8, num_classes=10)
    )
    assert float(rows[0]["params_m"]) == round(expected_params / 1e6, 2)
    assert rows[0]["top1"] == "61.5" and rows[1]["top1"] == ""
    assert plot.stat().st_size > 0


def test_benchmark_command_rejects_bad_requests(capsys):
    assert main(["benchmark", "--models", "no_such_model_xyz", "--repeats", "1"]) == 2
    assert "unknown model 'no_such_model_xyz'" in capsys.readouterr().err
    assert main(["benchmark", "--models", "resnet50", "--repeats", "1"]) == 2
    assert "write timm:resnet50" in capsys.readouterr().err
    # --plot without accuracies draws throughput alone (issue 57 item 4): tests/test_new_user_list.py
    assert main(["benchmark", "--models", TINY_OURS, "--accuracy", "resnet50=80"]) == 2
    assert "not in --models" in capsys.readouterr().err


def test_val_data_measures_the_top1_of_checkpoint_files(tmp_path, capsys):
    model = resmlp.create_model("resmlp_s12", dim=16, depth=1, img_size=16, patch_size=4, in_chans=1, num_classes=4)
    pre = Preprocess(16, 1, (0.5,), (0.25,), crop_pct=1.0)
    path = tmp_path / "tiny.safetensors"
    resmlp.save(model, path, {"preprocess": pre.to_dict(), "class_names": [f"class_{c}" for c in range(4)]})
    # the expected accuracy, computed here without the evaluation code
    val = build_dataset("synthetic", "test", None, 1, pre.eval_transform(), img_size=16)
    images = torch.stack([val[i][0] for i in range(len(val))])
    with torch.no_grad():
        expected = 100.0 * (model.eval()(images).argmax(1) == torch.tensor(val.targets)).float().mean().item()
    out = tmp_path / "table.csv"
    code = main(["benchmark", "--models", f"{path},{TINY_TIMM}", "--val-data", "synthetic", "--accuracy",
                 "timm:test_resnet=12.5", "--batch-size", "2", "--repeats", "1", "--warmup", "1", "--min-time", "0.01",
                 "--threads", "1", "--output", str(out)])
    assert code == 0, capsys.readouterr().err
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert float(rows[0]["top1"]) == pytest.approx(expected, abs=1e-6) and rows[1]["top1"] == "12.5"
    assert list(tmp_path.glob("*.png")) == []  # the benchmark leaves no confusion matrix behind
    assert main(["benchmark", "--models", TINY_OURS, "--val-data", "synthetic"]) == 2
    assert "measures the top-1 of checkpoint files" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ how models run
def _first_linear_dtypes(module: torch.nn.Module, seen: list) -> None:
    """Record the dtype of the first linear product's output each time `module` runs."""
    first = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))
    first.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16"])
def test_the_run_mode_reaches_the_timed_models(monkeypatch, precision):
    compiled, seen, matmul = [], {}, []

    def fake_compile(module, **options):  # records what torch.compile would be asked, runs eagerly
        compiled.append(options)
        return module

    monkeypatch.setattr(resmlp.inference, "compile_module", fake_compile)
    monkeypatch.setattr(benchmark, "cpu_peak_memory_mb", lambda *a: 1.0)  # its own process: tested above
    original = benchmark.timed_model

    def spy(model, mode, device):  # hooks on the model the benchmark times, and the matmul mode it runs in
        runner = original(model, mode, device)
        label = type(model).__name__
        seen[label] = []
        if isinstance(runner, resmlp.inference.TokenMajorResMLP):
            runner.blocks[0].register_forward_hook(lambda _m, _i, out: seen[label].append(out.dtype))
        else:
            _first_linear_dtypes(runner, seen[label])
        runner.register_forward_pre_hook(lambda *_: matmul.append(torch.get_float32_matmul_precision()))
        return runner

    monkeypatch.setattr(benchmark, "timed_model", spy)
    mode = benchmark.RunMode("optimized", precision, "max-autotune")
    rows = benchmark.run_benchmark(benchmark.parse_models(f"{TINY_OURS},{TINY_TIMM}"), batch_size=2, repeats=1,
                                   warmup=1, min_time=0.0, mode=mode, large_batch_size=3)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    assert seen == {"ResMLP": [dtype] * 6, "ResNet": [dtype] * 6}  # warm-up + 1 round at batches 2, 3 and 1
    assert matmul and set(matmul) == {"highest"}  # tf32 is a CUDA mode: a CPU runs fp32
    assert torch.get_float32_matmul_precision() == "highest"
    assert compiled == [dict(mode="max-autotune", dynamic=False)] * 2  # ours (optimize) and timm's
    assert [r["path"] for r in rows] == ["optimized", "plain"]  # timm models always run as built
    for r in rows:
        assert r["precision"] == ("bf16" if precision == "bf16" else "fp32") and r["compile"] == "max-autotune"
        assert (r["batch_size"], r["large_batch_size"], r["device"]) == (2, 3, "cpu")
        assert r["throughput_large_img_s"] > 0 and r["cpu_capability"] and r["torch"] == torch.__version__


def test_plain_path_runs_our_model_as_built_and_bf16_in_autocast():
    model, _ = benchmark.build_model(benchmark.parse_spec(TINY_OURS))
    runner = benchmark.timed_model(model, benchmark.RunMode("plain", "bf16"), torch.device("cpu"))
    assert isinstance(runner, benchmark.BF16Autocast) and runner.model is model
    seen = []
    _first_linear_dtypes(runner, seen)
    with torch.inference_mode():
        out = runner(torch.randn(2, 3, 32, 32))
    assert seen == [torch.bfloat16] and out.dtype == torch.float32
    assert benchmark.timed_model(model, benchmark.RunMode("plain"), torch.device("cpu")) is model


def test_tf32_switches_cuda_matrix_modes_only_and_restores_them():
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    with benchmark.float32_matmul("tf32", torch.device("cuda")):  # flags only: no GPU needed
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    with benchmark.float32_matmul("fp32", torch.device("cuda")):  # cuDNN's default TF32 convolutions off
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    with benchmark.float32_matmul("tf32", torch.device("cpu")):
        assert torch.get_float32_matmul_precision() == "highest"
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before
    assert benchmark.RunMode(precision="tf32").precision_on(torch.device("cpu")) == "fp32"
    assert benchmark.RunMode(precision="tf32").precision_on(torch.device("cuda")) == "tf32"


def _row(model, throughput, large, memory, img_size=224):
    return dict(model=model, img_size=img_size, throughput_img_s=throughput, throughput_large_img_s=large,
                peak_memory_mb=memory, batch_size=32, large_batch_size=None if large is None else 256,
                path="optimized", device="cuda", precision="bf16", compile=None)


def test_paper_ratios_come_from_the_s12_and_deit_s_rows():
    rows = [_row("resmlp_s12[dim=32]", 9000.0, 9000.0, 1.0), _row("timm:resmlp_12_224", 5000.0, 5000.0, 50.0),
            _row("resmlp_s12", 3000.0, 4000.0, 80.0), _row("timm:deit_small_patch16_224", 2000.0, 1000.0, 100.0),
            _row("timm:resnet50", 1.0, 1.0, 1.0)]
    ratios = benchmark.paper_ratios(rows)
    assert [(r["quantity"], r["batch_size"], r["ratio"]) for r in ratios] == [
        ("throughput", 32, 1.5), ("throughput", 256, 4.0), ("peak_memory_mb", 32, 0.8)]
    # the paper's Table 1: 1415.1 / 940.4 im/s and 179.5 / 217.2 MB, V100 at batch 32
    assert [r["paper_ratio"] for r in ratios] == [1.5, 1.5, 0.83]
    assert all(r["paper_batch_size"] == 32 and r["device"] == "cuda" and r["precision"] == "bf16" for r in ratios)
    line = benchmark.ratio_line(ratios)
    assert "throughput 1.50x at batch 32 (paper 1.50x at batch 32)" in line and "peak memory 0.80x" in line
    no_large = [_row("resmlp_s12", 3.0, None, 8.0), _row("timm:deit_small_patch16_224", 2.0, None, 10.0)]
    assert [r["quantity"] for r in benchmark.paper_ratios(no_large)] == ["throughput", "peak_memory_mb"]
    assert benchmark.paper_ratios(rows[:3]) == []  # no DeiT-S
    assert benchmark.paper_ratios([_row("resmlp_s12", 3.0, None, 8.0, img_size=192), rows[3]]) == []


def test_benchmark_command_writes_json_with_the_run_mode(tmp_path, capsys):
    out = tmp_path / "table.json"
    code = main(["benchmark", "--models", f"{TINY_OURS},{TINY_TIMM}", "--precision", "tf32", "--path", "plain",
                 "--batch-size", "2", "--large-batch", "4", "--repeats", "1", "--warmup", "1", "--min-time", "0.01",
                 "--device", "cpu", "--threads", "1", "--no-progress", "--output", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "im/s @4" in printed and "eager" in printed and "ours plain" in printed
    assert "tf32 is a CUDA matrix mode: on the CPU these rows ran (and record) fp32" in printed
    import json

    result = json.loads(out.read_text())
    assert result["s12_over_deit_s"] == []  # neither paper model listed
    for row in result["rows"]:
        assert (row["device"], row["precision"], row["compile"], row["path"]) == ("cpu", "fp32", None, "plain")
        assert (row["batch_size"], row["large_batch_size"], row["threads"]) == (2, 4, 1)
        assert row["throughput_large_img_s"] > 0 and row["cpu"] and "native_bf16" in row and "timm" in row


@pytest.mark.parametrize("flags, message", [
    (["--precision", "fp16"], "unknown precision 'fp16'; choose one of fp32, tf32, bf16"),
    (["--path", "fast"], "unknown path 'fast'; choose one of optimized, plain"),
    (["--compile", "turbo"], "unknown compile mode 'turbo'; choose one of default, max-autotune, reduce-overhead"),
    (["--compile", "reduce-overhead", "--device", "cpu"], "reduce-overhead replays CUDA graphs and needs a CUDA GPU"),
    (["--large-batch", "-1"], "--large-batch must be a batch size, or 0 for none"),
])
def test_bad_run_options_are_one_line_errors(capsys, flags, message):
    assert main(["benchmark", "--models", TINY_OURS, "--repeats", "1", "--no-progress", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("precision, compile", [("tf32", None), ("bf16", "reduce-overhead")])
def test_gpu_rows_run_in_their_precision_and_compile_mode(monkeypatch, precision, compile):
    seen = []
    original = benchmark.timed_model

    def spy(model, mode, device):
        runner = original(model, mode, device)
        runner.register_forward_pre_hook(
            lambda *_: seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)))
        return runner

    monkeypatch.setattr(benchmark, "timed_model", spy)
    mode = benchmark.RunMode("optimized", precision, compile)
    rows = benchmark.run_benchmark(benchmark.parse_models(f"{TINY_OURS},{TINY_TIMM}"), batch_size=4, repeats=2,
                                   warmup=2, min_time=0.0, device="cuda", mode=mode, large_batch_size=16)
    tf32 = precision == "tf32"
    assert seen and set(seen) == {("high", True) if tf32 else ("highest", False)}
    for r in rows:
        assert (r["device"], r["precision"], r["compile"], r["gpu"]) == ("cuda", precision, compile,
                                                                          torch.cuda.get_device_name())
        assert r["throughput_img_s"] > 0 and r["throughput_large_img_s"] > 0 and r["peak_memory_mb"] >= 0


def test_the_default_models_are_named_in_the_grammar_the_command_takes():
    from resmlp.commands.benchmark import DEFAULT_MODELS

    specs = benchmark.parse_models(DEFAULT_MODELS)  # before: 'resmlp_12_224' was refused at once
    assert len(specs) == len(DEFAULT_MODELS.split(",")) and "timm:resmlp_12_224" in [s.name for s in specs]


def test_torchvision_models_and_convnet_checkpoints_take_the_benchmarks_size(tmp_path):
    import timm

    model, shape = benchmark.build_model(benchmark.parse_spec("torchvision:resnet18"), img_size=32)
    assert shape == (3, 32, 32)  # before: ResNet.__init__() got an unexpected keyword argument 'img_size'
    path = resmlp.save(timm.create_model("resnet10t", in_chans=1, num_classes=4), tmp_path / "cnn.safetensors",
                       metadata={"preprocess": {"img_size": 28, "in_chans": 1}})
    model, shape = benchmark.build_model(benchmark.parse_spec(str(path)), img_size=32)
    assert shape == (1, 32, 32)  # the channels it was trained on
    model, shape = benchmark.build_model(benchmark.parse_spec(str(path)))
    assert shape == (1, 28, 28)
    with torch.no_grad():
        assert model(torch.zeros(1, *shape)).shape == (1, 4)


def test_the_table_shows_a_models_bracketed_overrides(capsys):
    import argparse

    from resmlp.commands.benchmark import print_table

    row = dict(model=TINY_OURS, img_size=32, params_m=0.1, gmacs=0.01, throughput_img_s=1.0,
               throughput_b1_img_s=1.0, path="plain", peak_memory_mb=1.0, weights_mb=1.0, top1=None, threads=1,
               precision="fp32")
    print_table(argparse.Namespace(batch_size=4, large_batch=0, compile=None, path="plain", repeats=1), [row], "cpu")
    assert "[dim=32,depth=2" in capsys.readouterr().out  # before: read as rich markup and dropped


@pytest.mark.parametrize("throughputs", [(3.0, 40.0, 900.0), (150.0, 210.0, 380.0), (2000.0, 2400.0, 2600.0)])
def test_the_tradeoff_plots_x_labels_do_not_overlap(throughputs):
    from matplotlib import pyplot as plt

    rows = [dict(model=f"m{i}", throughput_img_s=t, top1=70.0 + i, batch_size=32, device="cpu")
            for i, t in enumerate(throughputs)]
    fig = benchmark.tradeoff_figure(rows)
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.get_xticklabels(minor=False) + ax.get_xticklabels(minor=True)
              if t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert labels, "the axis needs at least one number"
    assert all(a.x1 <= b.x0 for a, b in zip(boxes[:-1], boxes[1:], strict=True)), [t.get_text() for t in labels]
    plt.close(fig)

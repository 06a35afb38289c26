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
    assert main(["benchmark", "--models", TINY_OURS, "--plot", "x.png"]) == 2
    assert "--accuracy" in capsys.readouterr().err
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

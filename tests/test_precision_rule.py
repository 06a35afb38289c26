"""`amp: auto` on a CUDA GPU (issue 53): bf16 where the card computes it natively (compute capability 8.0 and
up, torch.cuda.is_bf16_supported(including_emulation=False)), else fp16 with a GradScaler; one function
(runtime.resolve_amp) owns the rule and every command with a precision -- train, eval, eval-knn, eval-linear,
translate -- uses it. The GPU is faked: its compute capability (V100 7.0, T4 7.5, A100 8.0, H100 9.0) and, for
the commands, tests/fakecuda.py's fake CUDA tensors. The CPU's rule is tests/test_runtime_host.py's."""

from __future__ import annotations

import pytest
import torch

from resmlp import runtime

CARDS = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "H100": (9, 0)}
EXPECTED = {"V100": "fp16", "T4": "fp16", "A100": "bf16", "H100": "bf16"}
CUDA = torch.device("cuda")


def fake_card(monkeypatch, card: str) -> None:
    """torch.cuda answers as `card` would: its capability, and is_bf16_supported as torch computes it (emulated bf16
    counted by default, so it says True on every card of capability 7.x as well)."""
    major, minor = CARDS[card]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation or major >= 8)


@pytest.mark.parametrize("card", list(CARDS))
def test_auto_is_bf16_where_native_else_fp16_with_a_gradient_scaler(monkeypatch, card):
    fake_card(monkeypatch, card)
    assert torch.cuda.is_bf16_supported()  # what the old rule asked: True even where bf16 is emulated
    amp = runtime.resolve_amp("auto", CUDA)
    assert amp == EXPECTED[card]
    assert runtime.cuda_native_bf16(torch.device("cuda", 0)) is (amp == "bf16")
    scaler = runtime.grad_scaler(amp, CUDA)
    assert isinstance(scaler, torch.amp.GradScaler) if amp == "fp16" else scaler is None


def test_a_card_whose_driver_refuses_native_bf16_gets_fp16(monkeypatch):
    fake_card(monkeypatch, "A100")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert runtime.resolve_amp("auto", CUDA) == "fp16"


@pytest.mark.parametrize("card", ["V100", "A100"])
def test_an_explicit_precision_is_kept_on_every_card(monkeypatch, card):
    fake_card(monkeypatch, card)
    assert [runtime.resolve_amp(a, CUDA) for a in ("bf16", "fp16", "fp32", "none")] == ["bf16", "fp16", "none",
                                                                                       "none"]


@pytest.mark.parametrize("card", ["V100", "A100"])
def test_the_native_bf16_query_of_the_benchmarks_agrees(monkeypatch, card):
    from resmlp.inference import native_bf16_available

    fake_card(monkeypatch, card)
    assert native_bf16_available("cuda") is (EXPECTED[card] == "bf16")


def test_the_fp16_features_are_the_models_own_under_fp16_autocast():
    import resmlp
    from resmlp.inference import PreLogits, optimize_features

    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, in_chans=1, num_classes=4, dim=16, depth=2)
    features = optimize_features(model, "fp16")
    assert isinstance(features, PreLogits) and features.dtype == torch.float16
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        optimize_features(model, "int8")


# ------------------------------------------------------------------------------------------ each command
def _spy_rule(monkeypatch) -> list[torch.device]:
    """Records every question the commands ask the one rule, which keeps answering from the faked card."""
    asked, rule = [], runtime.cuda_native_bf16

    def spy(device: torch.device) -> bool:
        asked.append(device)
        return rule(device)

    monkeypatch.setattr(runtime, "cuda_native_bf16", spy)
    return asked


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    import resmlp

    path = tmp_path_factory.mktemp("precision") / "tiny.safetensors"
    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, in_chans=1, num_classes=4, dim=16, depth=2)
    resmlp.save(model, path)
    return path


@pytest.mark.parametrize("card", ["V100", "A100"])
def test_train_uses_the_rule_and_trains_fp16_with_a_scaler(tmp_path, capsys, monkeypatch, card):
    import json

    from test_fake_cuda import COMMON, run_cli

    fake_card(monkeypatch, card)
    asked = _spy_rule(monkeypatch)
    run_cli(["train", "--recipe", "fashion-mnist-quick", "--output", str(tmp_path / "run")],
            {**COMMON, "train.amp": "auto", "schedule.epochs": 1}, capsys)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert asked and summary["amp"] == EXPECTED[card]


@pytest.mark.parametrize("card", ["T4", "H100"])
def test_eval_uses_the_rule(tmp_path, monkeypatch, tiny_checkpoint, card):
    from fakecuda import fake_cuda

    from resmlp.evaluation import evaluate

    fake_card(monkeypatch, card)
    asked = _spy_rule(monkeypatch)
    with fake_cuda():
        summary = evaluate(tiny_checkpoint, data="synthetic", device="cuda", batch_size=16, num_workers=0,
                           output=tmp_path / "eval", amp="auto")
    assert asked and summary["precision"] == EXPECTED[card] == summary["host"]["precision"]


@pytest.mark.parametrize("method", ["knn", "linear"])
@pytest.mark.parametrize("card", ["V100", "A100"])
def test_eval_knn_and_eval_linear_use_the_rule(monkeypatch, tiny_checkpoint, method, card):
    from fakecuda import fake_cuda

    from resmlp.train import probe
    from resmlp.train.probe import frozen_feature_eval

    fake_card(monkeypatch, card)
    # fake features hold no data (their labels read back as zeros: one class); the fit is not what is tested
    monkeypatch.setattr(probe, "linear_probe_accuracy", lambda *arrays: 0.0)
    asked = _spy_rule(monkeypatch)
    with fake_cuda():
        summary = frozen_feature_eval(tiny_checkpoint, method, "synthetic", batch_size=16, num_workers=0,
                                      device="cuda", k=3, amp="auto")
    assert asked and summary["precision"] == EXPECTED[card]


@pytest.mark.parametrize("card", ["T4", "A100"])
def test_translate_uses_the_rule(monkeypatch, card):
    from resmlp.seq2seq.train import resolve_precision

    fake_card(monkeypatch, card)
    asked = _spy_rule(monkeypatch)
    assert resolve_precision("auto", CUDA) == EXPECTED[card] and asked
    assert resolve_precision("fp32", CUDA) == "none"

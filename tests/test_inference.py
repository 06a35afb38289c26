"""optimize(): fp32 equals the model, bf16 / int8 stay close, preprocessing follows the checkpoint."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import TINY, build_fast
from PIL import Image

from resmlp.inference import CastingWrapper, PreLogits, TokenMajorResMLP, optimize, optimize_features, predict
from resmlp.models.resmlp import ResMLPConfig
from resmlp.preprocess import Preprocess

TOKEN_MAJOR = [dict(), dict(pos_embed=True), dict(layerscale=False), dict(act="relu")]
GENERIC = [dict(cross_patch="mlp", norm="layernorm", layerscale=False), dict(pooling="class_mlp"),
           dict(cross_patch="dwconv3x3")]


@pytest.mark.parametrize("overrides", TOKEN_MAJOR + GENERIC)
def test_fp32_equals_the_model(overrides):
    model = build_fast(ResMLPConfig(**TINY).replace(**overrides), seed=1)
    fast = optimize(model, "fp32")
    assert isinstance(fast, TokenMajorResMLP if overrides in TOKEN_MAJOR else CastingWrapper)
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        assert want.std() > 0.1  # trained-like weights: a folding mistake would show
        torch.testing.assert_close(fast(x), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("overrides", TOKEN_MAJOR + GENERIC + [dict(num_classes=0)])
def test_features_equal_the_models_pre_logits_and_leave_it_unchanged(overrides):
    model = build_fast(ResMLPConfig(**TINY).replace(**overrides), seed=4)
    head = model.head
    fast = optimize_features(model, "fp32")
    assert model.head is head  # the identity head went into the copy only
    if overrides in TOKEN_MAJOR:
        assert isinstance(fast, TokenMajorResMLP)  # the final Affine folded into the identity: fast path kept
    x = torch.randn(6, 3, 32, 32)
    with torch.no_grad():
        want = model.forward_head(model.forward_features(x), pre_logits=True)
        assert want.shape == (6, 32) and want.std() > 0.1
        torch.testing.assert_close(fast(x), want, atol=1e-4, rtol=0)


@pytest.mark.hosttype
def test_bf16_features_stay_close_in_cosine_and_other_models_use_their_own_pre_logits():
    model = build_fast(ResMLPConfig(**TINY).replace(depth=4), seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-native-bf16 warning on CPUs without AVX-512 BF16
        fast = optimize_features(model, "bf16")
    x = torch.randn(64, 3, 32, 32)
    with torch.no_grad():
        want, got = model.forward_head(model.forward_features(x), pre_logits=True), fast(x)
    assert got.dtype == torch.float32
    # k-NN compares directions: bf16 (8-bit mantissa) keeps each feature vector's direction to ~1e-2
    assert torch.nn.functional.cosine_similarity(got, want).min() > 0.99
    convnet = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    convnet.forward_features = convnet.forward
    convnet.forward_head = lambda t, pre_logits=False: t.mean((2, 3))
    wrapped = optimize_features(convnet, "fp32")
    assert isinstance(wrapped, PreLogits)
    torch.testing.assert_close(wrapped(x), convnet(x).mean((2, 3)))
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        optimize_features(model, "int8")


def test_token_major_model_keeps_the_input_checks():
    fast = optimize(build_fast(ResMLPConfig(**TINY)), "fp32")
    with pytest.raises(ValueError, match="expects 32x32"):
        fast(torch.randn(1, 3, 40, 40))
    with pytest.raises(ValueError, match="floating-point"):
        fast(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


@pytest.mark.hosttype
def test_bf16_keeps_top1_and_returns_fp32():
    model = build_fast(ResMLPConfig(**TINY).replace(num_classes=10, depth=4), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-native-bf16 warning on CPUs without AVX-512 BF16
        fast = optimize(model, "bf16")
    assert fast.blocks[0].fc1_weight.dtype == torch.bfloat16
    x = torch.randn(256, 3, 32, 32)
    with torch.no_grad():
        ref, out = model(x), fast(x)
    assert out.dtype == torch.float32
    agree = (ref.argmax(-1) == out.argmax(-1)).float().mean().item()
    assert agree >= 0.95, agree
    assert (out - ref).abs().max() < 0.1 * ref.abs().max()


def test_int8_quantises_the_linears_and_stays_close():
    model = build_fast(ResMLPConfig(**TINY).replace(num_classes=10, depth=4), seed=3)
    fast = optimize(model, "int8")
    assert isinstance(fast.model.blocks[0].fc1, torch.ao.nn.quantized.dynamic.Linear)
    assert isinstance(fast.model.head, torch.ao.nn.quantized.dynamic.Linear)
    x = torch.randn(256, 3, 32, 32)
    with torch.no_grad():
        ref, out = model(x), fast(x)
    agree = (ref.argmax(-1) == out.argmax(-1)).float().mean().item()
    assert agree >= 0.9, agree


def test_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp32, bf16, int8"):
        optimize(build_fast(ResMLPConfig(**TINY)), "fp16")


def test_predict_returns_sorted_topk_probabilities():
    fast = optimize(build_fast(ResMLPConfig(**TINY)), "fp32")
    probs, idx = predict(fast, torch.randn(4, 3, 32, 32), top_k=3)
    assert probs.shape == idx.shape == (4, 3)
    assert (probs[:, :-1] >= probs[:, 1:]).all() and (probs.sum(-1) <= 1 + 1e-6).all()
    full = fast(torch.zeros(1, 3, 32, 32)).softmax(-1)
    p0, i0 = predict(fast, torch.zeros(1, 3, 32, 32), top_k=100)  # k larger than classes: all of them
    assert i0.shape == (1, 7) and i0[0, 0] == full.argmax()


def test_preprocess_from_metadata_resizes_crops_and_normalises(tmp_path):
    model = build_fast(ResMLPConfig(**TINY).replace(in_chans=1))
    meta = {"preprocess": {"img_size": 32, "crop_pct": 0.5, "interpolation": "bilinear",
                           "mean": [0.5], "std": [0.25], "in_chans": 1}}
    pre = Preprocess.from_metadata(meta, model)
    img = Image.new("RGB", (128, 64), (255, 255, 255))  # white border around a black centre
    img.paste((0, 0, 0), (48, 16, 80, 48))
    img.save(tmp_path / "a.png")
    x = pre.load(tmp_path / "a.png")
    # shorter side 64 -> 64 (= 32 / 0.5), centre crop 32: exactly the black square, (0 - 0.5) / 0.25
    assert x.shape == (1, 32, 32)
    torch.testing.assert_close(x, torch.full((1, 32, 32), -2.0))


def test_preprocess_defaults_and_bad_metadata(tmp_path):
    model = build_fast(ResMLPConfig(**TINY))
    pre = Preprocess.from_metadata({}, model)
    assert pre.source == "assumed" and pre.crop_pct == 0.875 and pre.mean == (0.485, 0.456, 0.406)
    with pytest.raises(ValueError, match="model takes 3x32px"):
        Preprocess.from_metadata({"preprocess": {"img_size": 28, "mean": [0.5], "std": [0.5], "in_chans": 1}},
                                 model)
    (tmp_path / "bad.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match="cannot read image .*bad.png"):
        pre.load(tmp_path / "bad.png")


@pytest.mark.parametrize("compile, options", [(True, dict(mode=None, dynamic=False)),
                                              ("max-autotune", dict(mode="max-autotune", dynamic=False))])
def test_compile_modes_reach_torch_compile_with_static_shapes(monkeypatch, compile, options):
    import resmlp.inference

    asked = []
    monkeypatch.setattr(resmlp.inference, "compile_module", lambda module, **kw: asked.append((module, kw)) or module)
    fast = optimize(build_fast(ResMLPConfig(**TINY)), "fp32", compile=compile)
    assert asked == [(fast, options)] and isinstance(fast, TokenMajorResMLP)  # the token-major model compiled
    convnet = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    assert isinstance(optimize(convnet, "fp32", compile=compile), CastingWrapper) and asked[1][1] == options


def test_cuda_graphs_and_unknown_compile_modes_are_refused_with_the_fix():
    model = build_fast(ResMLPConfig(**TINY))
    with pytest.raises(ValueError, match="reduce-overhead replays CUDA graphs and needs a CUDA GPU; this model is on"):
        optimize(model, "fp32", compile="reduce-overhead")
    with pytest.raises(ValueError, match="unknown compile mode 'fast'; choose one of default, max-autotune"):
        optimize(model, "fp32", compile="fast")


def test_max_autotune_compiled_model_keeps_the_fp32_top1():
    model = build_fast(ResMLPConfig(**TINY).replace(num_classes=10), seed=6)
    fast = optimize(model, "fp32", compile="max-autotune")
    x = torch.randn(16, 3, 32, 32)
    with torch.inference_mode():
        want, got = model(x), fast(x)
    assert (got.argmax(-1) == want.argmax(-1)).all()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("compile", ["max-autotune", "reduce-overhead"])
def test_compiled_bf16_on_the_gpu_agrees_with_fp32_and_keeps_its_outputs(compile):
    model = build_fast(ResMLPConfig(**TINY).replace(num_classes=10, depth=4), seed=7).cuda()
    fast = optimize(model, "bf16", compile=compile)
    x, other = torch.randn(256, 3, 32, 32, device="cuda"), torch.randn(256, 3, 32, 32, device="cuda")
    with torch.inference_mode():
        want = model(x)
        got = [fast(x) for _ in range(3)]  # CUDA graphs record on the first calls, then replay
        kept = got[-1].clone()
        fast(other)  # a replay on other images must not overwrite a result already returned
    assert got[-1].dtype == torch.float32 and torch.equal(got[-1], kept)
    assert (got[-1].argmax(-1) == want.argmax(-1)).float().mean().item() >= 0.95

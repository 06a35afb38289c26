"""timm's FX checks (its tests/test_models.py: test_model_forward_fx, test_model_backward_fx,
test_model_forward_fx_torchscript) on our presets, at tiny widths and depths that keep each preset's structure.

They trace as timm traces: torchvision's feature extractor with timm's leaf modules and functions, the graph's
last node returned, in eval and in train mode (where ResMLP blocks otherwise take the fused training step).
"""

from __future__ import annotations

import pytest
import timm
import torch
from conftest import make_trained_like_
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import NodePathTracer, create_feature_extractor, get_graph_node_names

import resmlp  # noqa: F401  (registers the presets with timm)

PRESETS = ["resmlp_s12", "resmlp_s12_cmlp", "resmlp_b24", "mixer_s16"]
TINY = dict(img_size=32, patch_size=8, dim=16, depth=2, num_classes=6)


def _tiny(name: str) -> torch.nn.Module:
    extra = dict(cross_patch_hidden=12) if name.startswith("mixer") else {}
    torch.manual_seed(0)
    return make_trained_like_(timm.create_model(name, **TINY, **extra))


def _tracer_kwargs() -> dict:
    return dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(),
                param_shapes_constant=True)


def _fx_model(model: torch.nn.Module, train: bool = False) -> torch.fx.GraphModule:
    """timm's _create_fx_model: the output node of the train and the eval graph, by torchvision's node names."""
    kwargs = _tracer_kwargs()
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=kwargs)
    train_return = [train_nodes[-1]]
    if train:
        graph = NodePathTracer(**kwargs).trace(model)
        nodes = list(reversed(graph.nodes))
        names = [n.name for n in nodes]
        train_return = [train_nodes[-names.index(n.name)] for n in nodes[0]._input_nodes]
    return create_feature_extractor(model, train_return_nodes=train_return, eval_return_nodes=[eval_nodes[-1]],
                                    tracer_kwargs=kwargs)


def _output(fx_model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return torch.cat(tuple(fx_model(x).values()))


@pytest.mark.parametrize("name", PRESETS)
def test_forward_fx_equals_the_model(name):
    model = _tiny(name).eval()
    x = torch.randn(1, 3, 32, 32)
    with torch.inference_mode():
        expected = model(x)
        got = _output(_fx_model(model), x)
    assert torch.equal(got, expected) and not got.isnan().any()


@pytest.mark.parametrize("name", PRESETS)
def test_backward_fx_in_train_mode_reaches_every_parameter(name):
    model = _tiny(name).train()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model(x)  # the fused training step where the block has the paper's design
    fx_model = _fx_model(model, train=True)
    out = _output(fx_model, x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    out.mean().backward()
    missing = [n for n, p in fx_model.named_parameters() if p.grad is None]
    assert not missing and out.shape == (2, 6)
    assert sum(p.numel() for p in model.parameters()) == sum(p.grad.numel() for p in fx_model.parameters())


@pytest.mark.parametrize("name", PRESETS)
def test_forward_fx_torchscript(name):
    with timm.set_scriptable(True):
        model = _tiny(name).eval()
    x = torch.randn(1, 3, 32, 32)
    scripted = torch.jit.script(_fx_model(model))
    with torch.inference_mode():
        torch.testing.assert_close(_output(scripted, x), model(x), rtol=1e-4, atol=1e-5)

"""Export a model for other runtimes: ONNX (dynamic batch size) and TorchScript.

Both export the fp32 inference model of `resmlp.inference.optimize` (Affines folded, token-major
layout), so other runtimes get the same single-product cross-patch layer as PyTorch does.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from resmlp.fileio import atomic_write
from resmlp.inference import optimize
from resmlp.models.resmlp import ResMLP

FORMATS = ("onnx", "torchscript")
ONNX_OPSET = 18


def _example_input(model: ResMLP, batch: int = 2) -> torch.Tensor:
    cfg = model.config
    return torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size)


def export_onnx(model: ResMLP, path: str | Path) -> Path:
    """Write an ONNX graph with input 'images' (batch, C, H, W) -> 'logits' (batch, classes), batch dynamic."""
    fast = optimize(model.cpu(), "fp32")
    example = _example_input(model)

    def write(tmp: Path) -> None:
        batch = torch.export.Dim("batch", min=1)
        with warnings.catch_warnings():
            # the exporter reports its own progress and fallbacks as warnings: noise for a CLI user
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                fast, (example,), dynamo=True, input_names=["images"], output_names=["logits"],
                dynamic_shapes={"x": {0: batch}}, opset_version=ONNX_OPSET, verbose=False,
            )
        program.save(str(tmp))

    return atomic_write(path, write)


def export_torchscript(model: ResMLP, path: str | Path) -> Path:
    """Write a traced TorchScript module (load with torch.jit.load) that accepts any batch size."""
    fast = optimize(model.cpu(), "fp32")

    def write(tmp: Path) -> None:
        # TorchScript is deprecated upstream in favour of torch.export but still what many serving
        # stacks load; its deprecation and tracer warnings (about the Python-side input checks) are noise
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.jit.save(torch.jit.trace(fast, _example_input(model), check_trace=False), str(tmp))

    return atomic_write(path, write)


def export(model: ResMLP, path: str | Path, format: str = "onnx") -> Path:
    """Export `model` in `format` ('onnx' or 'torchscript') to `path`."""
    if format == "onnx":
        return export_onnx(model, path)
    if format == "torchscript":
        return export_torchscript(model, path)
    raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")


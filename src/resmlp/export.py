"""Export a model for other runtimes: ONNX (dynamic batch size), torch.export's .pt2 and TorchScript.

All three export the fp32 inference model of `resmlp.inference.optimize` (Affines folded, token-major
layout) of a ResMLP or Mixer, so other runtimes get the same single-product cross-patch layer as PyTorch does;
any other model `resmlp train` trains (timm:NAME, torchvision:NAME) is exported as it is, in eval mode, for
the input size its checkpoint records.
"""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path

import torch

from resmlp.fileio import atomic_write
from resmlp.inference import optimize
from resmlp.models.resmlp import ResMLP
from resmlp.preprocess import Preprocess

FORMATS = ("onnx", "pt2", "torchscript")
PT2_METADATA = "resmlp_preprocess.json"  # the .pt2 archive's extra file holding preprocessing_metadata
ONNX_OPSET = 18
# a file's extension -> its format, for export(format=None)
EXTENSIONS = {".onnx": "onnx", ".pt2": "pt2", ".pt": "torchscript", ".pth": "torchscript", ".ts": "torchscript",
              ".torchscript": "torchscript"}


def format_of(path: str | Path) -> str:
    """The export format a file name asks for: .onnx -> onnx, .pt2 -> pt2, .pt/.pth/.ts/.torchscript ->
    torchscript."""
    suffix = Path(path).suffix.lower()
    if suffix not in EXTENSIONS:
        raise ValueError(f"cannot tell the export format from {Path(path).name!r}: name the file *.onnx, *.pt2 or "
                         f"*.pt, or pass --format {'|'.join(FORMATS)}")
    return EXTENSIONS[suffix]


def preprocessing_metadata(preprocess: Preprocess, class_names: list[str] | None) -> dict[str, str]:
    """What a runtime needs beside the graph to feed it and read it (ONNX metadata_props: strings; lists
    as JSON): class names, input size, mean/std, centre-crop fraction and resize interpolation."""
    meta = {"img_size": str(preprocess.img_size), "in_chans": str(preprocess.in_chans),
            "mean": json.dumps(list(preprocess.mean)), "std": json.dumps(list(preprocess.std)),
            "crop_pct": str(preprocess.crop_pct), "interpolation": preprocess.interpolation}
    if class_names is not None:
        meta["class_names"] = json.dumps(list(class_names))
    return meta


def _example_input(model: torch.nn.Module, input_size: tuple[int, int] | None, batch: int = 2) -> torch.Tensor:
    """A batch of the input the model takes: `input_size` (channels, side), else a ResMLP's config's."""
    if input_size is None:
        if not isinstance(model, ResMLP):
            raise ValueError(f"exporting a {type(model).__name__} needs its input size (channels, side): its "
                             "checkpoint's preprocess metadata, or input_size=(C, S)")
        input_size = (model.config.in_chans, model.config.img_size)
    chans, side = input_size
    return torch.randn(batch, chans, side, side)


def _inference_model(model: torch.nn.Module) -> torch.nn.Module:
    """A ResMLP/Mixer folded for inference (resmlp.inference.optimize); any other model as it is, in eval mode."""
    return optimize(model.cpu(), "fp32") if isinstance(model, ResMLP) else model.cpu().eval()


def export_onnx(model: torch.nn.Module, path: str | Path, metadata: dict[str, str] | None = None,
                input_size: tuple[int, int] | None = None) -> Path:
    """Write an ONNX graph with input 'images' (batch, C, H, W) -> 'logits' (batch, classes), batch dynamic;
    `metadata` goes into the model's metadata_props (onnxruntime: session.get_modelmeta().custom_metadata_map).
    input_size: (channels, side) for a model that is not a ResMLP/Mixer."""
    example = _example_input(model, input_size)
    fast = _inference_model(model)

    def write(tmp: Path) -> None:
        batch = torch.export.Dim("batch", min=1)
        with warnings.catch_warnings():
            # the exporter reports its own progress and fallbacks as warnings: noise for a CLI user
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                fast, (example,), dynamo=True, input_names=["images"], output_names=["logits"],
                dynamic_shapes=({0: batch},), opset_version=ONNX_OPSET, verbose=False,
            )
        program.save(str(tmp))
        if metadata:
            import onnx

            proto = onnx.load(str(tmp))
            onnx.helper.set_model_props(proto, metadata)
            onnx.save(proto, str(tmp))

    return atomic_write(path, write)


def export_pt2(model: torch.nn.Module, path: str | Path, metadata: dict[str, str] | None = None,
               input_size: tuple[int, int] | None = None) -> Path:
    """Write a torch.export program (load with torch.export.load(path).module()) that accepts any batch size:
    the format PyTorch points to now that TorchScript is deprecated. `metadata` goes into the archive as the
    extra file PT2_METADATA (JSON; torch.export.load(path, extra_files={PT2_METADATA: ""}) reads it back)."""
    example = _example_input(model, input_size)
    fast = _inference_model(model)

    def write(tmp: Path) -> None:
        with torch.no_grad():
            program = torch.export.export(fast, (example,), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
        buffer = io.BytesIO()  # written by Python, as TorchScript's below: a full disk raises OSError
        torch.export.save(program, buffer, extra_files={PT2_METADATA: json.dumps(metadata or {})})
        tmp.write_bytes(buffer.getbuffer())

    return atomic_write(path, write)


def export_torchscript(model: torch.nn.Module, path: str | Path, input_size: tuple[int, int] | None = None) -> Path:
    """Write a traced TorchScript module (load with torch.jit.load) that accepts any batch size."""
    example = _example_input(model, input_size)
    fast = _inference_model(model)

    def write(tmp: Path) -> None:
        # TorchScript is deprecated upstream in favour of torch.export but still what many serving
        # stacks load; its deprecation and tracer warnings (about the Python-side input checks) are noise
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(fast, example, check_trace=False)
            # into memory first, then written by Python: torch.jit.save to a path aborts the process (a C++
            # exception in a destructor) when the disk fills; Python's write raises OSError(ENOSPC), which
            # atomic_write names
            buffer = io.BytesIO()
            torch.jit.save(traced, buffer)
        tmp.write_bytes(buffer.getbuffer())

    return atomic_write(path, write)


def export(model: torch.nn.Module, path: str | Path, format: str | None = None,
           metadata: dict[str, str] | None = None, input_size: tuple[int, int] | None = None) -> Path:
    """Export `model` in `format` ('onnx', 'pt2' or 'torchscript'; None: from the extension of `path`) to `path`;
    `metadata` (e.g. preprocessing_metadata(...)) is written into an ONNX or .pt2 file. input_size: (channels, side)
    of a model that is not a ResMLP/Mixer (whose config holds it)."""
    format = format or format_of(path)
    if format == "onnx":
        return export_onnx(model, path, metadata, input_size)
    if format == "pt2":
        return export_pt2(model, path, metadata, input_size)
    if format == "torchscript":
        return export_torchscript(model, path, input_size)
    raise ValueError(f"unknown export format {format!r}; choose one of {', '.join(FORMATS)}")


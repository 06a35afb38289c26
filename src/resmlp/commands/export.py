"""`resmlp export CHECKPOINT --format onnx|torchscript --output FILE`: a model file for other runtimes."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX or TorchScript (dynamic batch size)")
    p.add_argument("checkpoint", help="a ResMLP or MLP-Mixer checkpoint: ours (.safetensors, or a run folder for its "
                   "best.safetensors), or a timm / DeiT weight file")
    p.add_argument("--format", choices=("onnx", "torchscript"), default="onnx")
    p.add_argument("--output", type=Path, required=True, help="file to write, e.g. model.onnx or model.pt")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from resmlp.checkpoint import load
    from resmlp.evaluation import resolve_checkpoint
    from resmlp.export import export
    from resmlp.models.resmlp import ResMLP

    checkpoint = resolve_checkpoint(args.checkpoint)
    model = load(checkpoint).eval()  # the weights only: no preprocessing needed
    if not isinstance(model, ResMLP):
        raise ValueError(f"{checkpoint} holds a {type(model).__name__} (a timm model): resmlp export writes ResMLP and "
                         "MLP-Mixer checkpoints only (timm models export with torch.onnx.export or timm's own tools)")
    path = export(model, args.output, args.format)
    cfg = model.config
    print(f"wrote {path} ({args.format}): input (batch, {cfg.in_chans}, {cfg.img_size}, {cfg.img_size}) "
          f"float32 -> logits (batch, {cfg.num_classes}); Affines folded, batch size dynamic")
    return 0

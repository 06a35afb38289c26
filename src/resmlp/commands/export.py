"""`resmlp export CHECKPOINT --output FILE.onnx|FILE.pt`: a model file for other runtimes."""

from __future__ import annotations

import argparse

from resmlp.commands.common import output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX or TorchScript (dynamic batch size)")
    p.add_argument("checkpoint", help="a ResMLP or MLP-Mixer checkpoint: ours (.safetensors, or a run folder for its "
                   "best.safetensors), or a timm / DeiT weight file")
    p.add_argument("--format", choices=("onnx", "torchscript"), default=None,
                   help="default: from the output's extension (.onnx; .pt, .pth or .ts for TorchScript)")
    p.add_argument("--output", type=output_file, required=True,
                   help="file to write, e.g. model.onnx (with class names, mean/std and crop in its metadata) or "
                        "model.pt")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from resmlp.checkpoint import load_with_header
    from resmlp.evaluation import resolve_checkpoint
    from resmlp.export import export, format_of, preprocessing_metadata
    from resmlp.models.resmlp import ResMLP
    from resmlp.preprocess import preprocess_of_file

    form = args.format or format_of(args.output)  # before reading the checkpoint: a bad name fails at once
    checkpoint = resolve_checkpoint(args.checkpoint)
    model, header = load_with_header(checkpoint)
    metadata = header.get("extra") or {}
    model.eval()
    if not isinstance(model, ResMLP):
        from resmlp.models.torchvision_models import library_of

        raise ValueError(f"{checkpoint} holds a {type(model).__name__} (a {library_of(model)} model): resmlp export "
                         "writes ResMLP and MLP-Mixer checkpoints only (other models export with torch.onnx.export "
                         "or their library's own tools)")
    preprocess = preprocess_of_file(header, model, dataset=metadata.get("dataset"))  # the rule eval and predict use
    if preprocess.note:
        print(preprocess.note)
    names = metadata.get("class_names")
    names = [str(n) for n in names] if isinstance(names, list) and len(names) == model.config.num_classes else None
    path = export(model, args.output, form, preprocessing_metadata(preprocess, names))
    cfg = model.config
    print(f"wrote {path} ({form}): input (batch, {cfg.in_chans}, {cfg.img_size}, {cfg.img_size}) "
          f"float32 -> logits (batch, {cfg.num_classes}); Affines folded, batch size dynamic")
    return 0

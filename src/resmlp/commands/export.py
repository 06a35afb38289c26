"""`resmlp export CHECKPOINT --output FILE.onnx|FILE.pt2|FILE.pt`: a model file for other runtimes."""

from __future__ import annotations

import argparse

from resmlp.commands.common import output_file


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="export a checkpoint to ONNX, torch.export (.pt2) or TorchScript (dynamic "
                                             "batch size)")
    p.add_argument("checkpoint", help="a checkpoint of any model resmlp train trains (.safetensors, or a run folder "
                   "for its best.safetensors: ResMLP, Mixer, timm:NAME, torchvision:NAME), or a timm / DeiT weight "
                   "file of a ResMLP or Mixer")
    p.add_argument("--format", choices=("onnx", "pt2", "torchscript"), default=None,
                   help="default: from the output's extension (.onnx; .pt2 for torch.export; .pt, .pth or .ts for "
                        "TorchScript)")
    p.add_argument("--output", type=output_file, required=True,
                   help="file to write, e.g. model.onnx or model.pt2 (with class names, mean/std and crop in its "
                        "metadata) or model.pt")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from resmlp.checkpoint import load_with_header
    from resmlp.evaluation import resolve_checkpoint
    from resmlp.export import export, format_of, preprocessing_metadata
    from resmlp.models.resmlp import ResMLP
    from resmlp.models.torchvision_models import library_of
    from resmlp.preprocess import preprocess_of_file

    form = args.format or format_of(args.output)  # before reading the checkpoint: a bad name fails at once
    checkpoint = resolve_checkpoint(args.checkpoint)
    model, header = load_with_header(checkpoint)
    metadata = header.get("extra") or {}
    model.eval()
    preprocess = preprocess_of_file(header, model, dataset=metadata.get("dataset"))  # the rule eval and predict use
    if preprocess.note:
        print(preprocess.note)
    classes = model.config.num_classes if isinstance(model, ResMLP) else getattr(model, "num_classes", None)
    names = metadata.get("class_names")
    names = [str(n) for n in names] if isinstance(names, list) and len(names) == classes else None
    size = (preprocess.in_chans, preprocess.img_size)
    path = export(model, args.output, form, preprocessing_metadata(preprocess, names), input_size=size)
    folded = "Affines folded" if isinstance(model, ResMLP) else f"the {library_of(model)} model as trained"
    print(f"wrote {path} ({form}): input (batch, {size[0]}, {size[1]}, {size[1]}) float32 -> logits (batch, "
          f"{classes}); {folded}, batch size dynamic")
    return 0

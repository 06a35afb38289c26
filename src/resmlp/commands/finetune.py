"""`resmlp finetune`: fine-tune / transfer any ResMLP or Mixer checkpoint with a recipe."""

from __future__ import annotations

import argparse

from resmlp.commands.common import (
    add_training_arguments,
    exit_status,
    print_dry_run,
    recipe_for,
    stopped_early,
    training_overrides,
)


def _freeze(value: str) -> int | str:
    if value == "all-but-head":
        return value
    if value.isdigit():
        return int(value)
    raise argparse.ArgumentTypeError(f"expected a number of blocks or all-but-head, got {value!r}")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("finetune", help="fine-tune a checkpoint (ours, timm, DeiT, DINO) on a recipe's data",
                       description="Start from CHECKPOINT with a new head for the dataset's classes; optional "
                                   "resolution change, freezing and layer-wise lr decay.")
    p.add_argument("checkpoint", help="a ResMLP/Mixer checkpoint (ours, a DINO backbone, timm's or DeiT's), a run "
                                      "folder (its best.safetensors) or published weights by timm's name "
                                      "(resmlp_s12.fb_in1k)")
    p.add_argument("--pretrained", action="store_true",
                   help="CHECKPOINT names a preset: start from its published weights (resmlp_s12: fb_in1k)")
    # the model is CHECKPOINT's: no --model or --input-size (--img-size changes the resolution)
    add_training_arguments(p, "fashion-mnist-quick", without=("--model", "--input-size", "--img-size",
                                                                "--layer-decay"))
    p.add_argument("--img-size", type=int, help="new input resolution (cross-patch weights resized)")
    p.add_argument("--freeze", type=_freeze, metavar="N_BLOCKS|all-but-head",
                   help="freeze the stem and the first N blocks, or everything but the head")
    p.add_argument("--layer-decay", type=float, help="layer-wise lr decay, e.g. 0.75")
    p.set_defaults(run=run_finetune)


def run_finetune(args: argparse.Namespace) -> int:
    from resmlp.commands.train import print_summary
    from resmlp.train import finetune
    from resmlp.train.run import finetune_config

    if args.pretrained:  # the tag, also in the printed command that resumes the run
        from resmlp.models.weight_tags import pretrained_name

        args.checkpoint = pretrained_name(args.checkpoint)
    if args.dry_run:
        return print_dry_run(args, lambda more: finetune_config(
            args.checkpoint, recipe_for(args), {**training_overrides(args), **more}, args.img_size, args.freeze,
            args.layer_decay, check_memory=False))
    summary = finetune(args.checkpoint, recipe_for(args), args.output, training_overrides(args), args.img_size,
                       args.freeze, args.layer_decay, args.resume, args.max_steps)
    if not stopped_early(summary, args):
        print_summary(summary, args.output)
    return exit_status(summary)

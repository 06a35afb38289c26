"""`resmlp finetune`: fine-tune / transfer any ResMLP or Mixer checkpoint with a recipe."""

from __future__ import annotations

import argparse

from resmlp.train.config import RECIPES, parse_overrides


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
    p.add_argument("checkpoint", help="a ResMLP/Mixer checkpoint: ours, a DINO backbone, timm's or DeiT's")
    p.add_argument("--recipe", default="fashion-mnist-quick",
                   help=f"recipe name ({', '.join(RECIPES)}) or YAML file: data, optimiser, schedule")
    p.add_argument("--output", required=True, help="run folder")
    p.add_argument("--img-size", type=int, help="new input resolution (cross-patch weights resized)")
    p.add_argument("--freeze", type=_freeze, metavar="N_BLOCKS|all-but-head",
                   help="freeze the stem and the first N blocks, or everything but the head")
    p.add_argument("--layer-decay", type=float, help="layer-wise lr decay, e.g. 0.75")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--epochs", type=int, help="= --set schedule.epochs=N")
    p.add_argument("--data-dir", help="= --set data.dir=DIR")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="STATE")
    p.set_defaults(run=run_finetune)


def run_finetune(args: argparse.Namespace) -> int:
    from resmlp.train.finetune import finetune

    flags = {"schedule.epochs": args.epochs, "data.dir": args.data_dir}
    overrides = {**{k: v for k, v in flags.items() if v is not None}, **parse_overrides(args.overrides)}
    summary = finetune(args.checkpoint, args.recipe, args.output, overrides, args.img_size, args.freeze,
                       args.layer_decay, args.resume)
    print(f"test top-1 {summary['test_top1']:.2f}% after {summary['epochs']} epochs in {summary['wall_seconds']:.0f}s"
          f"\n  best checkpoint: {summary['checkpoint']}\n  summary:         {args.output}/summary.json")
    return 0

"""`resmlp pretrain dino`: self-supervised DINO pre-training on the training engine."""

from __future__ import annotations

import argparse

from resmlp.train.config import parse_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="self-supervised pre-training (DINO)")
    methods = p.add_subparsers(dest="method", required=True, metavar="METHOD")
    d = methods.add_parser("dino", help="DINO: student/EMA-teacher self-distillation with multi-crop",
                           description="DINO pre-training; writes OUTPUT/summary.json with knn_top1 and the "
                                       "teacher backbone as OUTPUT/best.safetensors.")
    d.add_argument("--recipe", default="dino-fashion-mnist", help="recipe name or YAML file (with a dino section)")
    d.add_argument("--output", required=True, help="run folder")
    d.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a recipe key (repeatable), e.g. --set dino.num_local=2")
    d.add_argument("--resume", nargs="?", const=True, default=False, metavar="STATE")
    d.add_argument("--epochs", type=int, help="= --set schedule.epochs=N")
    d.add_argument("--data-dir", help="= --set data.dir=DIR")
    d.set_defaults(run=run_dino)


def run_dino(args: argparse.Namespace) -> int:
    from resmlp.train.dino_trainer import pretrain_dino

    flags = {"schedule.epochs": args.epochs, "data.dir": args.data_dir}
    overrides = {**{k: v for k, v in flags.items() if v is not None}, **parse_overrides(args.overrides)}
    summary = pretrain_dino(args.recipe, args.output, overrides, args.resume)
    print(f"k-NN top-1 {summary['knn_top1']:.2f}% after {summary['epochs']} epochs in {summary['wall_seconds']:.0f}s\n"
          f"  teacher backbone: {summary['checkpoint']}\n"
          f"  summary:          {args.output}/summary.json\n"
          f"  linear probe:     resmlp eval-linear {summary['checkpoint']} --data {summary['dataset']}\n"
          f"  fine-tune:        resmlp finetune {summary['checkpoint']} --recipe fashion-mnist-quick --output DIR")
    return 0

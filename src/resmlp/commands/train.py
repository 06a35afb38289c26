"""`resmlp train` and `resmlp eval`: the training engine and checkpoint evaluation from the shell."""

from __future__ import annotations

import argparse
import json

from resmlp.data import KINDS
from resmlp.train.config import RECIPES, parse_overrides


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a recipe (Fashion-MNIST quickstart by default)",
                       description="Train from a recipe; any key can be overridden with --set section.key=value.")
    p.add_argument("--recipe", default="fashion-mnist-quick",
                   help=f"recipe name ({', '.join(RECIPES)}) or a YAML file (default: fashion-mnist-quick)")
    p.add_argument("--output", required=True, help="run folder: checkpoints, metrics, plots, summary.json")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a recipe key, value parsed as YAML (repeatable), e.g. --set optim.lr=1e-3")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="STATE",
                   help="continue OUTPUT/last.pth (or the given state file) where it stopped")
    p.add_argument("--epochs", type=int, help="= --set schedule.epochs=N")
    p.add_argument("--batch-size", type=int, help="= --set train.batch_size=N (global batch)")
    p.add_argument("--data-dir", help="= --set data.dir=DIR")
    p.add_argument("--model", help="= --set model.name=PRESET")
    p.add_argument("--device", help="= --set train.device=DEVICE (auto, cpu, cuda, cuda:N)")
    p.add_argument("--distill", metavar="TEACHER",
                   help="distil from TEACHER: a checkpoint file, timm:NAME or torchvision:NAME (= distill.teacher)")
    p.add_argument("--distill-type", choices=("hard", "soft"), help="= --set distill.type (default hard)")
    p.add_argument("--distill-alpha", type=float, help="soft distillation: weight of the KL term (= distill.alpha)")
    p.add_argument("--distill-tau", type=float, help="soft distillation: temperature (= distill.tau)")
    p.add_argument("--teacher-weights", help="weights file of a timm:/torchvision: teacher (= distill.weights)")
    p.add_argument("--distill-cache", action="store_true", default=None,
                   help="run the teacher once per distinct image (fixed augmentation only; = distill.cache)")
    p.set_defaults(run=run_train)

    e = sub.add_parser("eval", help="evaluate a checkpoint on a dataset: accuracy, per-class, confusion matrix")
    e.add_argument("checkpoint", help="a .safetensors file written by resmlp train (or any loadable checkpoint)")
    e.add_argument("--data", default="fashion-mnist", help=f"dataset kind ({', '.join(KINDS)}) or a folder")
    e.add_argument("--data-dir", help="dataset folder (default: the kind's default location)")
    e.add_argument("--split", default="val", choices=("train", "val"),
                   help="val = the test set of Fashion-MNIST and CIFAR (default)")
    e.add_argument("--output", help="folder for summary.json and confusion_matrix.png")
    e.add_argument("--batch-size", type=int, default=256)
    e.add_argument("--device", default="auto")
    e.set_defaults(run=run_eval)


def run_train(args: argparse.Namespace) -> int:
    from resmlp.train import train

    flags = {"schedule.epochs": args.epochs, "train.batch_size": args.batch_size, "data.dir": args.data_dir,
             "model.name": args.model, "train.device": args.device, "distill.teacher": args.distill,
             "distill.type": args.distill_type, "distill.alpha": args.distill_alpha, "distill.tau": args.distill_tau,
             "distill.weights": args.teacher_weights, "distill.cache": args.distill_cache}
    overrides = {**{k: v for k, v in flags.items() if v is not None}, **parse_overrides(args.overrides)}
    summary = train(args.recipe, args.output, overrides=overrides, resume=args.resume)
    print(f"test top-1 {summary['test_top1']:.2f}%, top-5 {summary['test_top5']:.2f}% after {summary['epochs']} "
          f"epochs in {summary['wall_seconds']:.0f}s\n"
          f"  best checkpoint:  {summary['checkpoint']}\n"
          f"  metrics:          {summary['metrics']} (TensorBoard: {args.output}/tensorboard)\n"
          f"  learning curves:  {summary['learning_curves']}\n"
          f"  summary:          {args.output}/summary.json\n"
          f"  evaluate it:      resmlp eval {summary['checkpoint']}")
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from resmlp.train import evaluate

    summary = evaluate(args.checkpoint, data=args.data, data_dir=args.data_dir, split=args.split,
                       output=args.output, batch_size=args.batch_size, device=args.device)
    width = max(len(name) for name in summary["per_class_top1"])
    print(f"{summary['checkpoint']} on {summary['dataset']} ({summary['split']}, {summary['images']} images)")
    for name, acc in summary["per_class_top1"].items():
        print(f"  {name:<{width}}  {acc:6.2f}%")
    print(f"top-1 {summary['test_top1']:.2f}%  top-5 {summary['test_top5']:.2f}%")
    if summary["skipped_images"]:
        print(f"{summary['skipped_images']} unreadable images skipped")
    print(f"confusion matrix: {summary['confusion_matrix']}")
    if args.output:
        print(f"summary: {args.output}/summary.json")
    print(json.dumps({k: summary[k] for k in ("test_top1", "test_top5", "epochs", "wall_seconds", "checkpoint")}))
    return 0

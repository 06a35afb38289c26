"""`resmlp pretrain dino`: self-supervised DINO pre-training (the DINO task of the trainer)."""

from __future__ import annotations

import argparse
import shlex

from resmlp.commands.common import (
    add_training_arguments,
    exit_status,
    print_dry_run,
    recipe_for,
    run_data_flags,
    stopped_early,
    training_overrides,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="self-supervised pre-training (DINO)")
    methods = p.add_subparsers(dest="method", required=True, metavar="METHOD")
    d = methods.add_parser("dino", help="DINO: student/EMA-teacher self-distillation with multi-crop",
                           description="DINO pre-training; writes OUTPUT/summary.json with knn_top1 and the "
                                       "teacher backbone as OUTPUT/best.safetensors.")
    # DINO's teacher is its own EMA of the student: the trainer's weight EMA (--model-ema) is refused
    add_training_arguments(d, "dino-fashion-mnist", recipe_prefix="dino", without=("--model-ema", "--no-model-ema",
                                                                                     "--model-ema-decay"))
    d.set_defaults(run=run_dino)


def run_dino(args: argparse.Namespace) -> int:
    from resmlp.runtime import is_main_process
    from resmlp.train import pretrain_dino

    if args.dry_run:
        from resmlp.train.config import load_config

        return print_dry_run(args, lambda more: load_config(
            recipe_for(args), {**training_overrides(args), "task": "dino", **more}, False))
    summary = pretrain_dino(recipe_for(args), args.output, training_overrides(args), args.resume, args.max_steps)
    if not stopped_early(summary, args) and is_main_process():
        test = ("no test split" if summary["test_knn_top1"] is None else f"test {summary['test_knn_top1']:.2f}%")
        checkpoint, out = shlex.quote(summary["checkpoint"]), str(args.output).rstrip("/")
        finetune = " ".join(filter(None, [f"resmlp finetune {checkpoint} --recipe fashion-mnist-quick",
                                          run_data_flags(out, training=True),
                                          f"--output {shlex.quote(out + '-finetuned')}"]))
        print(f"k-NN top-1 {summary['knn_top1']:.2f}% on validation ({test}) after {summary['epochs']} epochs in "
              f"{summary['wall_seconds']:.0f}s\n"
              f"  teacher backbone: {summary['checkpoint']}\n"
              f"  summary:          {out}/summary.json\n"
              f"  linear probe:     resmlp eval-linear {checkpoint} {run_data_flags(out)}\n"
              f"  fine-tune:        {finetune}")
    return exit_status(summary)

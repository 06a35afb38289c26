"""`resmlp train` and `resmlp eval`: training from a recipe and checkpoint evaluation from the shell."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from resmlp.commands.common import (
    add_crop_argument,
    add_output_argument,
    add_progress_argument,
    add_threads_argument,
    add_training_arguments,
    amp_value,
    batch_size,
    deit_command_line,
    exit_status,
    print_dry_run,
    recipe_for,
    stopped_early,
    training_overrides,
)

DATA_KINDS = ("fashion-mnist", "folder", "wds", "hf", "cifar10", "cifar100", "synthetic", "imagenetv2", "imagenet21k",
              "flowers102", "stanford-cars", "inat2018", "inat2019")  # resmlp.data.KINDS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="train a model from a recipe (Fashion-MNIST quickstart by default)",
                       description="Train from a recipe; the options below and --set section.key=value override it.")
    p.add_argument("data_positional", nargs="?", metavar="DATA_DIR",
                   help="dataset folder, as timm's train.py takes it (= data.dir; without --recipe: recipe deit)")
    add_training_arguments(p, "fashion-mnist-quick")
    kd = p.add_argument_group("distillation (the paper's section 4.2; = the distill section)")
    kd.add_argument("--distill", "--teacher-model", dest="distill", metavar="TEACHER",
                    help="distil from TEACHER: a checkpoint file, timm:NAME or torchvision:NAME (= distill.teacher)")
    kd.add_argument("--teacher-weights", "--teacher-path", dest="teacher_weights",
                    help="weights file of a timm:/torchvision: teacher (= distill.weights)")
    kd.add_argument("--allow-random-teacher", action="store_true", default=None,
                    help="distil from a timm:/torchvision: teacher without weights (= distill.allow_random_teacher)")
    kd.add_argument("--teacher-classes-match", action="store_true", default=None,
                    help="the teacher's logit i is the data's class i: admits a teacher whose file records no class "
                         "names (= distill.classes_match)")
    kd.add_argument("--distill-type", "--distillation-type", dest="distill_type",
                    choices=("hard", "soft"), help="= distill.type (default hard)")
    kd.add_argument("--distill-alpha", "--distillation-alpha", dest="distill_alpha", type=float,
                    help="soft distillation: weight of the KL term (= distill.alpha)")
    kd.add_argument("--distill-tau", "--distillation-tau", dest="distill_tau", type=float,
                    help="soft distillation: temperature (= distill.tau)")
    kd.add_argument("--distill-cache", action="store_true", default=None,
                    help="run the teacher once per distinct image (fixed augmentation only; on a GPU each step "
                         "waits for the host to hash the batch; = distill.cache)")
    p.add_argument("--pretrained", action="store_true",
                   help="start from the model's published weights (resmlp_s12 -> resmlp_s12.fb_in1k, timm's tag; a "
                        "new head for the data's classes): the finetune task")
    p.add_argument("--initial-checkpoint", metavar="CKPT",
                   help="start from this checkpoint (= model.name; the finetune task, see `resmlp finetune`)")
    p.set_defaults(run=run_train)

    e = sub.add_parser("eval", help="evaluate a checkpoint on a dataset: accuracy, per-class, confusion matrix")
    e.add_argument("checkpoint", help="a checkpoint file or a run folder (its best.safetensors)")
    e.add_argument("--data", help="data source (folder:DIR, wds:PATTERN, hf:DIR, fashion-mnist, cifar10:DIR...), "
                                  f"dataset kind ({', '.join(DATA_KINDS)}) or a folder; default: the "
                                  "dataset the checkpoint was trained on")
    e.add_argument("--data-dir", help="dataset folder (default: the kind's default location)")
    e.add_argument("--split", choices=("train", "val", "test"),
                   help="default: the split training reported on: test where the dataset has one (Fashion-MNIST, "
                        "CIFAR, a folder with DIR/test), else val")
    e.add_argument("--amp", type=amp_value, default="auto", metavar="{auto,bf16,fp16,fp32}",
                   help="precision: auto = bf16 where native, else fp16 on a GPU, fp32 on a CPU (default auto)")
    add_output_argument(e, help="folder for summary.json and confusion_matrix.png")
    add_progress_argument(e)
    e.add_argument("--batch-size", "-b", type=batch_size, default=256, metavar="N",
                   help="images per batch (default 256)")
    e.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
    add_crop_argument(e)
    add_threads_argument(e)
    extras = e.add_argument_group("timm validate.py's extras")
    extras.add_argument("--real-labels", metavar="REAL_JSON",
                        help="ImageNet-ReaL accuracy from real.json (per image of the split in sorted file-name "
                             "order, its valid labels; images without any are left out)")
    extras.add_argument("--valid-labels", metavar="FILE",
                        help="score only these model classes (one class index per line, one per data class in "
                             "its order: ImageNet-A/R's 200), as timm's --valid-labels")
    extras.add_argument("--results", metavar="CSV",
                        help="write each image's file, label and top-k classes with probabilities to CSV")
    extras.add_argument("--topk", type=int, default=5, metavar="K",
                        help="classes per image in --results (default 5)")
    extras.add_argument("--use-ema", action="store_true",
                        help="the checkpoint's weight EMA: timm's state_dict_ema, DeiT's model_ema, a run's last.pth "
                             "ema; a run folder / .safetensors of a run that kept one (--model-ema) is its EMA")
    extras.add_argument("--img-size", type=int, metavar="N",
                        help="evaluate at N px: the model moved to that size (ResMLP's grid weights resized)")
    extras.add_argument("--interpolation", metavar="MODE",
                        help="the evaluation resize's filter (bicubic, bilinear, nearest...) instead of the file's")
    extras.add_argument("--torchcompile", nargs="?", const="inductor", metavar="BACKEND",
                        help="torch.compile the model (backend: inductor unless named)")
    e.set_defaults(run=run_eval)


def run_train(args: argparse.Namespace) -> int:
    from resmlp.train import train

    extra = {"distill.teacher": args.distill, "distill.type": args.distill_type, "distill.alpha": args.distill_alpha,
             "distill.tau": args.distill_tau, "distill.weights": args.teacher_weights,
             "distill.cache": args.distill_cache, "distill.allow_random_teacher": args.allow_random_teacher,
             "distill.classes_match": args.teacher_classes_match,
             "model.name": args.initial_checkpoint}
    overrides = training_overrides(args, {k: v for k, v in extra.items() if v is not None})
    if args.pretrained:
        from resmlp.models.weight_tags import pretrained_name
        from resmlp.train.config import load_config

        name = overrides.get("model.name") or load_config(recipe_for(args), overrides, False).model["name"]
        overrides["model.name"] = pretrained_name(str(name))
    recipe = recipe_for(args)
    if deit_command_line(args) and not args.resume:
        print(f"note: no --recipe, and the data named as DeiT's main.py or timm's train.py name it: recipe {recipe} "
              "(the authors' ImageNet recipe; pass --recipe to choose another)", file=sys.stderr, flush=True)
    if args.dry_run:
        from resmlp.train.config import load_config

        return print_dry_run(args, lambda more: load_config(recipe, {**overrides, **more}, False))
    if recipe == args.default_recipe and args.recipe is None:
        from resmlp.train.config import default_recipe_notice

        if notice := default_recipe_notice(recipe, overrides):
            print(notice, file=sys.stderr, flush=True)
    summary = train(recipe, args.output, overrides=overrides, resume=args.resume, max_steps=args.max_steps)
    if not stopped_early(summary, args):
        print_summary(summary, args.output)
    return exit_status(summary)


def print_summary(summary: dict, output: str) -> None:
    """The closing lines of a supervised run (rank 0 only: the others return the same summary silently)."""
    from resmlp.runtime import is_main_process

    if not is_main_process():
        return
    def inside(path: str) -> str:  # every file as the user named the run folder, not some absolute, some not
        return str(Path(output) / Path(path).name)

    print(f"{test_scores_line(summary)} after {summary['epochs']} "
          f"epochs in {summary['wall_seconds']:.0f}s ({summary['amp']} on {summary['host']['cpu_capability']})\n"
          f"  best checkpoint:  {inside(summary['checkpoint'])}\n"
          f"  metrics:          {inside(summary['metrics'])} (TensorBoard: {inside('tensorboard')})\n"
          f"  learning curves:  {inside(summary['learning_curves'])}\n"
          f"  summary:          {inside('summary.json')}\n"
          f"  evaluate it:      resmlp eval {shlex.quote(str(output))}")


def test_scores_line(summary: dict) -> str:
    """The test split's scores, or the validation score where the dataset has no test split (an ImageNet-style
    folder with train/ and val/ only: its summary.json holds None for the test keys)."""
    from resmlp.reporting import topk_text

    if summary["test_top1"] is None:
        return f"no test split; validation {topk_text(summary['val_top1'], summary['val_top5'])}"
    return f"test {topk_text(summary['test_top1'], summary['test_top5'])}"


def _print_scores(summary: dict) -> None:
    """The scores of an evaluation, printed before its files are written (a failed write keeps them shown)."""
    from resmlp.reporting import topk_text

    width = max(len(name) for name in summary["per_class_top1"])
    if summary["preprocess_note"]:
        print(summary["preprocess_note"])
    print(f"{summary['checkpoint']} on {summary['dataset']} ({summary['split']}, {summary['images']} images)")
    for name, acc in summary["per_class_top1"].items():
        print(f"  {name:<{width}}  {acc:6.2f}%")
    print(f"{topk_text(summary['top1'], summary['top5'], '  ')} ({summary['precision']})", flush=True)
    if "real_top1" in summary:
        print(f"ImageNet-ReaL {topk_text(summary['real_top1'], summary['real_top5'])}", flush=True)
    if summary["skipped_images"]:
        print(f"{summary['skipped_images']} unreadable images skipped")


def run_eval(args: argparse.Namespace) -> int:
    from resmlp.evaluation import evaluate
    from resmlp.fileio import output_lock
    from resmlp.runtime import process_settings

    with process_settings(args.threads), output_lock(args.output):  # a folder a training holds is refused
        summary = evaluate(args.checkpoint, data=args.data, data_dir=args.data_dir, split=args.split,
                           output=args.output, batch_size=args.batch_size, device=args.device, amp=args.amp,
                           progress=args.progress, announce=_print_scores, crop_pct=args.crop_pct,
                           real_labels=args.real_labels, valid_labels=args.valid_labels, results=args.results,
                           topk=args.topk, use_ema=args.use_ema, img_size=args.img_size,
                           interpolation=args.interpolation, torchcompile=args.torchcompile)
    if args.output:
        if summary.get("confusion_matrix"):
            print(f"confusion matrix: {summary['confusion_matrix']}")
        print(f"summary: {args.output}/summary.json")
    if args.results:
        print(f"per-image results: {summary['results']}")
    split = summary["split"]
    keys = (f"{split}_top1", f"{split}_top5", "epochs", "wall_seconds", "checkpoint", "precision")
    print(json.dumps({k: summary[k] for k in keys}))
    return 0

"""Arguments shared by commands: the training flags of train / finetune / pretrain, threads, progress.

Every training flag is a shorthand for one `--set section.key=value`, named as timm's train.py names it, so a
timm or DeiT user's habits work: `--lr`, `--opt`, `--drop-path`, `--model-ema`, `--amp`, `--workers`...
This module imports nothing heavy: `resmlp --help` must not load torch.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

MAX_THREADS = 4096  # the same bound as train.threads (resmlp.train.validation.RANGES)


def thread_count(text: str) -> int:
    """--threads: a whole number from 1 to MAX_THREADS (argparse turns the ValueError into a usage error)."""
    value = int(text)
    if not 1 <= value <= MAX_THREADS:
        raise ValueError(text)
    return value


thread_count.__name__ = f"thread count (1 to {MAX_THREADS})"  # argparse names the type in its message


MAX_BATCH = 1 << 20  # the same bound as train.batch_size (resmlp.train.validation.RANGES)


def batch_size(text: str) -> int:
    """--batch-size of the evaluation commands: a whole number from 1 to MAX_BATCH."""
    value = int(text)
    if not 1 <= value <= MAX_BATCH:
        raise ValueError(text)
    return value


batch_size.__name__ = f"batch size (1 to {MAX_BATCH})"


def output_path(text: str) -> str:
    """--output: a path, not the empty string (which would write into the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("--output is empty; name a folder (\".\" for the current one)")
    return text


def output_file(text: str) -> Path:
    """--output naming a file (predict, export): a path, not the empty string."""
    return Path(output_path(text))


def crop_pct(text: str) -> float:
    """--crop-pct of eval and predict: the centre crop's share, from resmlp.preprocess.MIN_CROP_PCT to 1."""
    value = float(text)
    if not 0.1 <= value <= 1.0:  # resmlp.preprocess.MIN_CROP_PCT (not imported: --help runs without torch)
        raise ValueError(text)
    return value


crop_pct.__name__ = "crop fraction (0.1 to 1)"


def add_crop_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--crop-pct", type=crop_pct, metavar="F",
                        help="evaluation centre crop: resize to img_size / F, crop img_size (default: the file's "
                             "own, a run's, or the one assumed for its kind and printed; ResMLP's authors use 0.9)")


PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def amp_value(name: str) -> str:
    """A precision flag's value (auto, bf16, fp16, fp32) as the runtime and recipes name it: fp32 is train.amp's
    `none`, which the flags still accept."""
    if name not in (*PRECISIONS, "none"):
        raise argparse.ArgumentTypeError(f"invalid precision {name!r}: choose one of {', '.join(PRECISIONS)}")
    return "none" if name == "fp32" else name


def amp_dtype(name: str) -> str:
    """timm's --amp-dtype (float16, bfloat16) as train.amp names it."""
    names = {"float16": "fp16", "bfloat16": "bf16", "fp16": "fp16", "bf16": "bf16"}
    if name not in names:
        raise argparse.ArgumentTypeError(f"invalid --amp-dtype {name!r}: choose bfloat16 or float16")
    return names[name]


def optional_text(text: str) -> str | None:
    """A flag whose value may be switched off: none / "" (DeiT's --aa none, timm's --aa '') -> None."""
    return None if text.strip().lower() in ("", "none", "null") else text


# flag -> (config key, argparse keywords); the value given on the command line becomes that key's override.
# One table: the flags named as timm's train.py / DeiT's main.py name them are listed in --help under "timm /
# DeiT spellings" (TIMM_SPELLINGS, their extra spellings in FLAG_ALIASES), the project's own under "training
# options"; all become --set keys in training_overrides and are checked as --set values are (validation.RANGES).
TRAINING_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--model": ("model.name", dict(metavar="MODEL", help="preset, timm:NAME, torchvision:NAME or a checkpoint "
                                                         "file (DeiT's resmlp_12 and timm's resmlp_12_224 name "
                                                         "resmlp_s12)")),
    "--batch-size": ("train.batch_size", dict(type=int, metavar="N", help="GLOBAL batch (all processes; timm's -b and "
                                                                          "DeiT's --batch-size are per process)")),
    "--epochs": ("schedule.epochs", dict(type=int, metavar="N", help="epochs (with --resume: extend a run)")),
    "--warmup-epochs": ("schedule.warmup_epochs", dict(type=float, metavar="N",
                                                       help="epochs of linear learning-rate warm-up")),
    "--warmup-lr": ("schedule.warmup_lr", dict(type=float, metavar="LR", help="learning rate the warm-up starts at")),
    "--min-lr": ("schedule.min_lr", dict(type=float, metavar="LR", help="learning rate the cosine ends at")),
    "--sched": ("schedule.name", dict(metavar="{cosine,step}", help="learning-rate schedule")),
    "--decay-epochs": ("schedule.decay_epochs", dict(type=float, metavar="N", help="step schedule: decay interval")),
    "--decay-rate": ("schedule.decay_rate", dict(type=float, metavar="RATE", help="step schedule: decay factor")),
    "--lr": ("optim.lr", dict(type=float, help="learning rate (for optim.reference_batch when the recipe sets it)")),
    "--opt": ("optim.name", dict(choices=("lamb", "adamw", "sgd"), help="optimizer")),
    "--opt-eps": ("optim.eps", dict(type=float, metavar="EPS", help="optimizer epsilon")),
    "--momentum": ("optim.momentum", dict(type=float, metavar="M", help="SGD momentum")),
    "--weight-decay": ("optim.weight_decay", dict(type=float, metavar="WD", help="weight decay")),
    "--layer-decay": ("optim.layer_decay", dict(type=float, metavar="RATE", help="layer-wise lr decay")),
    "--drop": ("model.drop_rate", dict(type=float, metavar="RATE", help="dropout rate")),
    "--drop-path": ("model.drop_path_rate", dict(type=float, metavar="RATE", help="stochastic depth rate")),
    "--img-size": ("model.img_size", dict(type=int, metavar="N", help="input image size")),
    "--mixup": ("data.mixup", dict(type=float, metavar="ALPHA", help="Mixup alpha (0: off)")),
    "--cutmix": ("data.cutmix", dict(type=float, metavar="ALPHA", help="CutMix alpha (0: off)")),
    "--mixup-prob": ("data.mixup_prob", dict(type=float, metavar="P", help="probability of Mixup/CutMix per batch")),
    "--smoothing": ("loss.label_smoothing", dict(type=float, metavar="EPS", help="label smoothing")),
    "--aa": ("data.auto_augment", dict(type=optional_text, metavar="POLICY",
                                       help="RandAugment policy, e.g. rand-m9-mstd0.5-inc1 (none: off)")),
    "--color-jitter": ("data.color_jitter", dict(type=float, metavar="F", help="colour jitter strength")),
    "--train-interpolation": ("data.interpolation", dict(metavar="MODE", help="resize interpolation")),
    "--reprob": ("data.reprob", dict(type=float, metavar="P", help="random erasing probability")),
    "--remode": ("data.remode", dict(metavar="{pixel,rand,const}", help="random erasing fill")),
    "--recount": ("data.recount", dict(type=int, metavar="N", help="random erasing: at most N boxes per image")),
    "--aug-repeats": ("data.repeated_aug", dict(type=int, metavar="N", help="repeated augmentation: copies per image "
                                                                             "(0: off)")),
    "--repeated-aug": ("data.repeated_aug", dict(action="store_const", const=3, default=None,
                                                 help="DeiT's repeated augmentation (3 copies, its RASampler)")),
    "--no-repeated-aug": ("data.repeated_aug", dict(action="store_const", const=0, default=None,
                                                    help="no repeated augmentation")),
    "--clip-grad": ("train.clip_grad", dict(type=float, metavar="NORM", help="clip the gradient norm")),
    "--grad-accum-steps": ("train.grad_accum", dict(type=int, metavar="N", help="gradient accumulation steps")),
    "--model-ema": ("train.ema", dict(action="store_true", default=None, help="evaluate and save a weight EMA")),
    "--no-model-ema": ("train.ema", dict(action="store_false", default=None, help="no weight EMA")),
    "--model-ema-decay": ("train.ema_decay", dict(type=float, metavar="DECAY", help="the EMA's decay")),
    "--amp": ("train.amp", dict(type=amp_value, nargs="?", const="auto", metavar="{auto,bf16,fp16,fp32}",
                                help="precision: auto = bf16 where the hardware has it, else fp32 (timm's bare "
                                     "--amp: auto)")),
    "--amp-dtype": ("train.amp", dict(type=amp_dtype, metavar="{bfloat16,float16}", help="timm's mixed precision "
                                                                                           "type")),
    "--seed": ("train.seed", dict(type=int, metavar="N", help="random seed")),
    "--device": ("train.device", dict(help="auto, cpu, cuda or cuda:N")),
    "--workers": ("data.num_workers", dict(type=int, metavar="N", help="data loader worker processes")),
    "--threads": ("train.threads", dict(type=thread_count, metavar="N",
                                        help="compute threads per process (default: the usable cores / processes)")),
    "--data": ("data.source", dict(metavar="SOURCE", help="data source: folder:DIR, wds:PATTERN, hf:DIR, "
                                                          "fashion-mnist, cifar10:DIR, cifar100:DIR, synthetic, "
                                                          "imagenetv2:DIR, imagenet21k:PATH, flowers102:DIR, "
                                                          "stanford-cars:DIR, inat2018:DIR, inat2019:DIR")),
    "--data-dir": ("data.dir", dict(metavar="DIR", help="dataset folder")),
    "--data-path": ("data.dir", dict(metavar="DIR", help="dataset folder, as DeiT names it (without --recipe: "
                                                         "recipe deit)")),
    "--no-progress": ("train.progress", dict(action="store_false", default=None,
                                             help="no progress bars (per-epoch lines only)")),
    "--checkpoint-hist": ("train.checkpoint_hist", dict(type=int, metavar="N",
                                                        help="keep the N best epochs' checkpoints as timm does")),
    "--log-wandb": ("train.log_wandb", dict(action="store_true", default=None,
                                            help="log metrics to Weights & Biases (pip install wandb)")),
    "--log-mlflow": ("train.log_mlflow", dict(action="store_true", default=None,
                                              help="log metrics to MLflow (pip install mlflow)")),
    "--experiment": ("train.experiment", dict(metavar="NAME",
                                              help="the W&B project / MLflow experiment (default: resmlp)")),
}
# the flags spelled as timm's train.py and DeiT's main.py spell them (their --help group), and their other spellings
TIMM_SPELLINGS = ("--model", "--batch-size", "--epochs", "--warmup-epochs", "--warmup-lr", "--min-lr", "--sched",
                  "--decay-epochs", "--decay-rate", "--lr", "--opt", "--opt-eps", "--momentum", "--weight-decay",
                  "--layer-decay", "--drop", "--drop-path", "--img-size", "--mixup", "--cutmix", "--mixup-prob",
                  "--smoothing", "--aa", "--color-jitter", "--train-interpolation", "--reprob", "--remode",
                  "--recount", "--aug-repeats", "--repeated-aug", "--no-repeated-aug", "--clip-grad",
                  "--grad-accum-steps", "--model-ema", "--no-model-ema", "--model-ema-decay", "--amp",
                  "--amp-dtype", "--seed", "--workers", "--data-dir", "--data-path", "--checkpoint-hist", "--log-wandb",
                  "--experiment")
FLAG_ALIASES = {"--batch-size": ("-b",), "--workers": ("-j", "--num_workers"), "--data-path": ("--data_path",)}
# DeiT's and timm's spellings of the data folder (--data-path; train.py's positional DATA_DIR): a command line
# with one of these and no --recipe is a DeiT or timm command line, which trains with the authors' DeiT recipe
# (DeiT main.py's defaults where they stated nothing), not the Fashion-MNIST quickstart
DEIT_DEFAULT_RECIPE = "deit"


def add_training_arguments(parser: argparse.ArgumentParser, default_recipe: str, recipe_prefix: str = "",
                           without: tuple[str, ...] = ()) -> None:
    """The flags every training command takes (less those in `without`, which the command does not accept),
    then --set (which wins over them). recipe_prefix: the help lists only the recipes named so (e.g. dino)."""
    recipes = [name for name in recipe_names() if name.startswith(recipe_prefix)]
    parser.add_argument("--recipe", default=None,
                        help=f"recipe name ({', '.join(recipes)}) or a YAML file (default: {default_recipe}; "
                             "with --resume: the run's own config.json)")
    parser.set_defaults(default_recipe=default_recipe)
    add_output_argument(parser, required=True, help="run folder: checkpoints, metrics, plots, summary.json",
                        aliases=("--output_dir", "--output-dir"))  # DeiT's main.py spelling
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="STATE",
                        help="continue OUTPUT/last.pth (or the given state file) where it stopped, with the recipe "
                             "and overrides of OUTPUT/config.json; flags given again must agree (or be a change a "
                             "resume allows, e.g. --epochs to extend it)")
    timm = parser.add_argument_group("timm / DeiT spellings (timm's train.py, DeiT's main.py; each sets one recipe "
                                     "key, docs/training.md has the table; --set overrides them)")
    group = parser.add_argument_group("training options (each sets one recipe key; --set overrides them)")
    if "--input-size" not in without:
        timm.add_argument("--input-size", type=int, nargs="+", metavar="N",
                          help="model input: C H W as timm (= model.in_chans, model.img_size; H must equal W), or "
                               "one size as DeiT (= model.img_size)")
    for flag, (key, kwargs) in TRAINING_FLAGS.items():
        if flag in without:
            continue
        target = timm if flag in TIMM_SPELLINGS else group
        target.add_argument(flag, *FLAG_ALIASES.get(flag, ()), dest=_dest(flag),
                            **{**_metavar(flag, kwargs), "help": f"{kwargs['help']} (= {key})"})
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any recipe key, value parsed as YAML (repeatable), e.g. --set optim.lr=1e-3")
    parser.add_argument("--max-steps", type=step_count, metavar="N",
                        help="stop after N optimizer steps of the run (a smoke run), writing a resumable state; not "
                             "part of the recipe: --resume alone then continues to the schedule's end")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate the config, build the model on the meta device, print the resolved config, "
                             "the memory estimate and the effective batch; read no images, write nothing")


def step_count(text: str) -> int:
    """--max-steps: a whole number of optimizer steps, at least 1."""
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


step_count.__name__ = "number of steps (1 or more)"


def program_words() -> list[str]:
    """The program as the user started it, for a printed command to be runnable as typed: `.venv/bin/resmlp`
    (the README's way) where that path was run and `resmlp` on PATH is another or none, `PYTHON -m resmlp` for
    `python -m resmlp`, else `resmlp`."""
    import os
    import shutil
    import sys

    started = sys.argv[0] if sys.argv else ""
    if Path(started).name == "__main__.py" and Path(started).parent.name == "resmlp":
        return [getattr(sys, "orig_argv", [sys.executable])[0], "-m", "resmlp"]
    if Path(started).name != "resmlp" or os.sep not in started:
        return ["resmlp"]
    on_path = shutil.which("resmlp")
    same = on_path is not None and Path(on_path).resolve() == Path(started).resolve()
    return ["resmlp"] if same else [started]


def continue_command(args: argparse.Namespace) -> str:
    """The command that resumes the run of training command `args`."""
    words = [*program_words(), args.command, *([args.method] if args.command == "pretrain" else []),
             *([args.checkpoint] if args.command == "finetune" else []), "--output", str(args.output), "--resume"]
    return shlex.join(words)


def stopped_early(summary: dict[str, Any], args: argparse.Namespace) -> bool:
    """After a run that --max-steps or a signal stopped (the trainer said where): the command that continues it."""
    from resmlp.runtime import env_int, is_main_process

    if "stopped_at_step" not in summary:
        return False
    if is_main_process():
        print(f"  continue it with: {continue_command(args)}")
        processes = env_int("WORLD_SIZE", 1, 1)  # torchrun's, or srun's (resmlp.runtime.adopt_slurm_ranks)
        if processes > 1:
            print(f"  launched as this run was: {processes} processes under torchrun or srun (at the same count "
                  "the resume is bit-identical)")
    return True


def exit_status(summary: dict[str, Any]) -> int:
    """0, or 128 + the signal's number where a signal stopped the run (the shell's convention: 130 for Ctrl-C,
    143 for SIGTERM), so a job script can tell a preempted run from a finished one."""
    import signal

    return 128 + int(getattr(signal, summary["signal"])) if summary.get("signal") else 0


def print_dry_run(args: argparse.Namespace, load) -> int:
    """--dry-run: the report of resmlp.train.dry_run; `load(extra)` validates the command's config with extra
    overrides."""
    from resmlp.train.dry_run import dry_run, recipe_data_dir

    given = training_overrides(args).get("data.dir")  # --data-dir or --set data.dir=...
    print(dry_run(load, recipe_data_dir(recipe_for(args), given), bool(args.resume)))
    return 0


def recipe_for(args: argparse.Namespace) -> str | dict[str, Any]:
    """The recipe a training command runs: --recipe; else, resuming, the run's own config.json (its recipe and
    every override, so `--output RUN --resume` alone continues it); else the command's default."""
    config = Path(args.output) / "config.json"
    if args.recipe is None and args.resume and config.is_file():
        from resmlp.fileio import read_json_object

        return read_json_object(config, "run config")  # then validated as any recipe (load_config)
    if deit_command_line(args):
        return DEIT_DEFAULT_RECIPE
    return args.recipe or args.default_recipe


def recipe_names() -> list[str]:
    """The shipped recipes (every YAML file in resmlp/recipes), read without importing the training code."""
    from importlib import resources

    return sorted(p.name.removesuffix(".yaml") for p in (resources.files("resmlp") / "recipes").iterdir()
                  if p.name.endswith(".yaml"))


def add_output_argument(parser: argparse.ArgumentParser, required: bool = False, help: str = "output folder",
                        aliases: tuple[str, ...] = ()) -> None:
    """--output (and its alias --out, and `aliases`) for every command that writes files."""
    parser.add_argument("--output", "--out", *aliases, dest="output", type=output_path, required=required, help=help)


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar on stderr")


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="compute threads (default: the cores this process may use)")


def training_overrides(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """{config key: value} from the training flags given, then `extra`, then --set (last wins)."""
    from resmlp.train.config import parse_overrides

    given: dict[str, Any] = {}
    for flag, (key, _) in TRAINING_FLAGS.items():  # several spellings of one key: the one given
        if (value := getattr(args, _dest(flag), None)) is not None:
            given[key] = value
    if getattr(args, "data_positional", None) is not None:  # timm's train.py DATA_DIR
        given["data.dir"] = args.data_positional
    if getattr(args, "input_size", None) is not None:
        given.update(input_size_keys(args.input_size))
    merged = {**given, **(extra or {}), **parse_overrides(args.overrides)}
    if "data.dir" in given and "data.kind" not in merged and (kind := folder_kind(given["data.dir"])):
        merged["data.kind"] = kind  # --data-dir on an image folder: the recipe's dataset kind does not apply
    return merged


def input_size_keys(sizes: list[int]) -> dict[str, int]:
    """--input-size as timm (C H W) or DeiT (one size) give it -> model keys; a clear error for anything else."""
    if len(sizes) == 1:
        return {"model.img_size": sizes[0]}
    if len(sizes) != 3:
        raise ValueError(f"--input-size {' '.join(map(str, sizes))}: give C H W (timm) or one size (DeiT)")
    chans, height, width = sizes
    if height != width:
        raise ValueError(f"--input-size {chans} {height} {width}: ResMLP and Mixer take square images (H = W)")
    return {"model.in_chans": chans, "model.img_size": height}


def deit_command_line(args: argparse.Namespace) -> bool:
    """Whether a training command was typed as DeiT's main.py or timm's train.py name the data (--data-path, a
    positional DATA_DIR) without --recipe: it then runs DEIT_DEFAULT_RECIPE (recipe_for)."""
    return args.recipe is None and args.command == "train" and (getattr(args, _dest("--data-path"), None) is not None
                                    or getattr(args, "data_positional", None) is not None)


def folder_kind(folder: str | Path) -> str | None:
    """The dataset kind a folder's layout shows: 'folder' for train/<class>/ images (ImageFolder, ImageNet);
    None where the layout says nothing (the recipe's kind then reads the folder: IDX files, CIFAR pickles...)."""
    train = Path(folder) / "train"
    return "folder" if train.is_dir() and any(child.is_dir() for child in train.iterdir()) else None


def run_data_flags(output: str | Path, training: bool = False) -> str:
    """The flags that name run `output`'s dataset (from its config.json) in a printed next command: for an
    evaluation (--data KIND|FOLDER [--data-dir DIR]) or, `training`, for a recipe built on fashion-mnist."""
    from resmlp.fileio import read_json_object

    data = read_json_object(Path(output) / "config.json", "run config").get("data")
    data = data if isinstance(data, dict) else {}
    kind, folder = str(data.get("kind", "fashion-mnist")), data.get("dir")
    if isinstance(data.get("source"), str):  # the source grammar names it whole, for training and evaluation
        return shlex.join(["--data", data["source"]])
    if training:
        flags = [] if kind == "fashion-mnist" else ["--set", f"data.kind={kind}"]
        return shlex.join(flags + (["--data-dir", str(folder)] if folder else []))
    if kind == "folder":
        return shlex.join(["--data", str(folder)])
    return shlex.join(["--data", kind] + (["--data-dir", str(folder)] if folder else []))


def pipe_console(**kwargs: Any):
    """A rich Console (`kwargs` its options) whose closed stdout pipe ends the command as every other does
    (cli.main: exit 141): rich's own handling exits 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipeConsole(**kwargs)


def _metavar(flag: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A value's name as the user types the flag (--lr LR), not the internal dest (FLAG_LR)."""
    if "metavar" in kwargs or "choices" in kwargs or kwargs.get("action"):
        return kwargs
    return {**kwargs, "metavar": flag.lstrip("-").replace("-", "_").upper()}


def _dest(flag: str) -> str:
    return "flag_" + flag.lstrip("-").replace("-", "_")

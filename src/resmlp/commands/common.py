"""Arguments shared by commands: the training flags of train / finetune / pretrain, threads, progress.

Every training flag is a shorthand for one `--set section.key=value`, named as timm's train.py names it, so a
timm or DeiT user's habits work: `--lr`, `--opt`, `--drop-path`, `--model-ema`, `--amp`, `--workers`...
This module imports nothing heavy: `resmlp --help` must not load torch.
"""

from __future__ import annotations

import argparse
from typing import Any

# flag -> (config key, argparse keywords); the value given on the command line becomes that key's override
TRAINING_FLAGS: dict[str, tuple[str, dict[str, Any]]] = {
    "--model": ("model.name", dict(metavar="MODEL", help="preset, timm:NAME, torchvision:NAME or a checkpoint file")),
    "--batch-size": ("train.batch_size", dict(type=int, metavar="N", help="global batch (all processes)")),
    "--epochs": ("schedule.epochs", dict(type=int, metavar="N", help="epochs (with --resume: extend a run)")),
    "--lr": ("optim.lr", dict(type=float, help="learning rate (for optim.reference_batch when the recipe sets it)")),
    "--opt": ("optim.name", dict(choices=("lamb", "adamw", "sgd"), help="optimizer")),
    "--weight-decay": ("optim.weight_decay", dict(type=float, metavar="WD", help="weight decay")),
    "--drop-path": ("model.drop_path_rate", dict(type=float, metavar="RATE", help="stochastic depth rate")),
    "--model-ema": ("train.ema", dict(action="store_true", default=None, help="evaluate and save a weight EMA")),
    "--amp": ("train.amp", dict(choices=("auto", "bf16", "fp16", "none"),
                                help="precision: auto = bf16 where the hardware has it, else fp32")),
    "--device": ("train.device", dict(help="auto, cpu, cuda or cuda:N")),
    "--workers": ("data.num_workers", dict(type=int, metavar="N", help="data loader worker processes")),
    "--threads": ("train.threads", dict(type=int, metavar="N",
                                        help="compute threads per process (default: the usable cores / processes)")),
    "--data-dir": ("data.dir", dict(metavar="DIR", help="dataset folder")),
}


def add_training_arguments(parser: argparse.ArgumentParser, default_recipe: str) -> None:
    """The flags every training command takes, then --set (which wins over them)."""
    parser.add_argument("--recipe", default=default_recipe,
                        help=f"recipe name ({', '.join(recipe_names())}) or a YAML file (default: {default_recipe})")
    add_output_argument(parser, required=True, help="run folder: checkpoints, metrics, plots, summary.json")
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="STATE",
                        help="continue OUTPUT/last.pth (or the given state file) where it stopped")
    parser.add_argument("--input-size", type=int, nargs=3, metavar=("C", "H", "W"),
                        help="model input channels and size (= model.in_chans, model.img_size; H must equal W)")
    group = parser.add_argument_group("training options (each sets one recipe key; --set overrides them)")
    for flag, (key, kwargs) in TRAINING_FLAGS.items():
        group.add_argument(flag, dest=_dest(flag), **{**kwargs, "help": f"{kwargs['help']} (= {key})"})
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override any recipe key, value parsed as YAML (repeatable), e.g. --set optim.lr=1e-3")


def recipe_names() -> list[str]:
    """The shipped recipes (every YAML file in resmlp/recipes), read without importing the training code."""
    from importlib import resources

    return sorted(p.name.removesuffix(".yaml") for p in (resources.files("resmlp") / "recipes").iterdir()
                  if p.name.endswith(".yaml"))


def add_output_argument(parser: argparse.ArgumentParser, required: bool = False, help: str = "output folder") -> None:
    """--output (and its alias --out) for every command that writes files."""
    parser.add_argument("--output", "--out", dest="output", required=required, help=help)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threads", type=int, default=None,
                        help="compute threads (default: the cores this process may use)")


def training_overrides(args: argparse.Namespace, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """{config key: value} from the training flags given, then `extra`, then --set (last wins)."""
    from resmlp.train.config import parse_overrides

    flags = {key: getattr(args, _dest(flag)) for flag, (key, _) in TRAINING_FLAGS.items()}
    if args.input_size is not None:
        chans, height, width = args.input_size
        if height != width:
            raise ValueError(f"--input-size {chans} {height} {width}: ResMLP and Mixer take square images (H = W)")
        flags.update({"model.in_chans": chans, "model.img_size": height})
    given = {key: value for key, value in flags.items() if value is not None}
    return {**given, **(extra or {}), **parse_overrides(args.overrides)}


def pipe_console():
    """A rich Console whose closed stdout pipe ends the command as every other does (cli.main: exit 141):
    rich's own handling exits 1."""
    from rich.console import Console

    class PipeConsole(Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError

    return PipeConsole()


def _dest(flag: str) -> str:
    return "flag_" + flag.lstrip("-").replace("-", "_")

"""The `resmlp` command line: one sub-command per module in `resmlp.commands`.

Building the parser imports no torch: `resmlp --help` and every `resmlp CMD --help` answer at once; a
command's own imports happen when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from pathlib import Path

import resmlp
from resmlp.command_files import command_scope
from resmlp.errors import user_message

# each module defines register(subparsers) and gives its parsers a `run(args) -> int` default
COMMAND_MODULES = (
    "resmlp.commands.models",
    "resmlp.commands.train",
    "resmlp.commands.finetune",
    "resmlp.commands.pretrain",
    "resmlp.commands.probe",
    "resmlp.commands.predict",
    "resmlp.commands.export",
    "resmlp.commands.analyze",
    "resmlp.commands.benchmark",
    "resmlp.commands.translate",
    "resmlp.commands.data",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resmlp", description="ResMLP and MLP-Mixer: models, training, analysis, inference."
    )
    parser.add_argument("--version", action="version", version=f"resmlp {resmlp.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command. A user's mistake (bad input, full disk, locked folder...) prints one message and
    exits 2; a bug keeps its traceback. RESMLP_DEBUG=1 shows the traceback of every error."""
    args = build_parser().parse_args(argv)
    if sys.stdout is None:  # `>&-`: Python leaves sys.stdout None, and every print or flush after is a traceback
        print(f"resmlp {args.command}: error: standard output is closed (>&-); redirect it instead (> FILE, "
              "> /dev/null)", file=sys.stderr)
        return 2
    debug = bool(os.environ.get("RESMLP_DEBUG"))
    formatwarning = warnings.formatwarning
    if not debug:  # a warning is a line for the user, not a source location
        warnings.formatwarning = lambda message, *_, **__: f"resmlp {args.command}: note: {message}\n"
    try:
        _check_environment()
        with command_scope(_input_candidates(args), _output_files(args)):
            code = int(args.run(args) or 0)
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
        return code
    except BrokenPipeError:
        # `resmlp ... | head`: stop quietly as Unix tools do (128 + SIGPIPE); stdout now points at devnull
        # so that the interpreter's own flush at exit can't fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"resmlp {args.command}: interrupted{_resume_hint(args)}", file=sys.stderr)
        return 130
    except Exception as e:
        message = None if debug else user_message(e)
        if message is None:
            raise
        print(f"resmlp {args.command}: error: {message}", file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = formatwarning
        if argv is None:  # the process's own command line, which exits next: see quick_exit
            quick_exit()


def quick_exit() -> None:
    """Before the process exits: the objects alive now are left out of the garbage collections Python runs as it
    tears its modules down (`gc.freeze`). After a run those are the hundreds of thousands of objects torch and a
    compiled model leave, collected again and again: seconds between a stop (Ctrl-C, a scheduler's signal) and
    the exit on a busy CPU. atexit handlers still run; only cyclic garbage that exists now is not collected."""
    import gc

    gc.freeze()


OUTPUT_DESTS = ("output", "out", "results", "json", "plot")  # every argument naming what a command writes


def _output_files(args: argparse.Namespace) -> dict[str, str]:
    """{flag: path} of the command's outputs (resmlp.command_files: none may be an input or another output)."""
    given = {dest: getattr(args, dest, None) for dest in OUTPUT_DESTS}
    return {f"--{dest}": str(value) for dest, value in given.items() if isinstance(value, (str, Path))}


def _input_candidates(args: argparse.Namespace) -> list[str]:
    """Every other argument's value that may name a file: as given, each part between commas, after a source's
    `kind:` and after a --set's `key=` (resmlp.command_files keeps those naming an existing regular file as the
    command's inputs)."""
    values: list[str] = []
    for dest, value in vars(args).items():
        if dest in OUTPUT_DESTS or dest == "resume" or callable(value):  # --resume STATE: the run rewrites it
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(item, (str, Path)):
                for text in {str(item), *str(item).replace("[", ",").replace("]", ",").split(",")}:
                    values += [text, text.partition(":")[2], text.partition("=")[2]]  # --models a,b[k=v]: each
    return [v for v in values if v]


LAUNCH_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT", "SLURM_NTASKS",
                    "SLURM_NNODES", "SLURM_PROCID", "SLURM_LOCALID")


def _check_environment() -> None:
    """The settings the environment gives every command, checked once before any runs: read later, inside a
    data loader's worker, a bad value would be a traceback from that worker."""
    if os.environ.get("RESMLP_MAX_IMAGE_PIXELS"):
        from resmlp.data.images import max_image_pixels

        max_image_pixels()
    if any(name in os.environ for name in LAUNCH_VARIABLES):  # runtime imports torch: only when there is one
        from resmlp.runtime import check_launch_environment

        check_launch_environment()


def _resume_hint(args: argparse.Namespace) -> str:
    """How to continue an interrupted training command ("" for the others); before its first state file, that
    there is nothing to continue and how to keep progress within an epoch."""
    if not hasattr(args, "default_recipe"):
        return ""
    if not (Path(args.output) / "last.pth").is_file():
        return ("; nothing to resume yet: the first state file (last.pth) is written at the end of epoch 1; run "
                "the command again, with --set train.checkpoint_every_steps=N to save every N steps within epochs")
    from resmlp.commands.common import continue_command

    return f"; continue it with: {continue_command(args)}"


if __name__ == "__main__":
    sys.exit(main())

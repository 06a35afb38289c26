"""The `resmlp` command line: one sub-command per module in `resmlp.commands`.

Building the parser imports no torch: `resmlp --help` and every `resmlp CMD --help` answer at once; a
command's own imports happen when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

import resmlp

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
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, FileNotFoundError, RuntimeError, KeyboardInterrupt) as e:
        # bad input gets its message, not a stack trace; RESMLP_DEBUG=1 shows the trace
        if os.environ.get("RESMLP_DEBUG") or not str(e):
            raise
        print(f"resmlp {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""The package's shape: every module imports alone, no import cycles, the CLI answers --help without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from hostspeed import limit

import resmlp

PACKAGE = Path(resmlp.__file__).parent
MODULES = sorted("resmlp." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
                 for p in PACKAGE.rglob("*.py") if p.name != "__main__.py")


def module_imports(name: str, every: bool = False) -> set[str]:
    """The resmlp modules `name` imports at module level, or with `every` anywhere (lazy imports inside
    functions and type-only imports under TYPE_CHECKING too)."""
    path = PACKAGE.joinpath(*name.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree) if every else tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("resmlp"):
            # `from resmlp.data import cifar` imports the submodule resmlp.data.sources.cifar
            found.update(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("resmlp"))
    return {m for m in found if m in MODULES and m != name}


def assert_no_cycle(graph: dict[str, set[str]]) -> None:
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for module in graph:
        if module not in state:
            visit(module, [])


def test_module_level_imports_have_no_cycle():
    assert_no_cycle({m: module_imports(m) for m in MODULES})


def test_package_has_no_cycle_even_through_lazy_or_type_only_imports():
    """A cycle hidden in a function-level import is still a cycle for a reader (and an import-order trap)."""
    assert_no_cycle({m: module_imports(m, every=True) for m in MODULES})


def test_data_folder_is_laid_out_by_stage():
    """records below sources; sources, per-image decoding, device batches, loading: one subfolder each."""
    data = PACKAGE / "data"
    assert {p.name for p in data.iterdir() if p.is_dir() and p.name != "__pycache__"} == {
        "sources", "per_image", "device", "loading"}
    sources = [m for m in MODULES if m.startswith("resmlp.data.sources.")]
    assert sources and all("resmlp.data.sources" not in module_imports(m, every=True) for m in sources)


def test_training_package_has_no_cycle_even_through_lazy_or_type_only_imports():
    """train/: the trainer imports the tasks and the state; they see it through resmlp.train.view only."""
    training = [m for m in MODULES if m.startswith("resmlp.train.") or m == "resmlp.train"]
    assert_no_cycle({m: {i for i in module_imports(m, every=True) if i in training} for m in training})


def test_task_names_of_the_config_are_the_registry():
    from resmlp.train.sections import TASKS
    from resmlp.train.task_registry import TASK_CLASSES

    assert set(TASKS) == set(TASK_CLASSES)


def test_no_training_module_passes_350_lines():
    lengths = {p.name: len(p.read_text().splitlines()) for p in (PACKAGE / "train").glob("*.py")}
    assert max(lengths.values()) <= 350, lengths


def test_every_module_imports():
    """Each module imports in a fresh interpreter, deepest first (no help from a parent imported before it);
    with the acyclic graph above, that is each module importing alone."""
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)"
    modules = sorted(MODULES, key=lambda m: -m.count("."))
    done = subprocess.run([sys.executable, "-c", code, *modules], capture_output=True, text=True, timeout=limit(300))
    assert done.returncode == 0, done.stderr[-1500:]


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["--version"]])
def test_cli_help_imports_no_torch(argv):
    code = ("import sys\nfrom resmlp.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules, 'the CLI imported torch to print its help'")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=limit(60))
    assert done.returncode == 0, done.stderr[-1500:]


def test_training_commands_share_one_flag_grammar():
    from resmlp.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    parsers = {"train": sub.choices["train"], "finetune": sub.choices["finetune"],
               "pretrain dino": sub.choices["pretrain"]._subparsers._group_actions[0].choices["dino"]}
    shared = {"--model", "--batch-size", "--epochs", "--lr", "--opt", "--weight-decay", "--drop-path", "--model-ema",
              "--amp", "--device", "--workers", "--input-size", "--data-dir", "--output", "--resume", "--set",
              "--threads"}
    # what a command does not accept it does not offer: finetune's model is its checkpoint, DINO's teacher its EMA
    refused = {"train": set(), "finetune": {"--model", "--input-size"}, "pretrain dino": {"--model-ema"}}
    for name, parser in parsers.items():
        flags = {s for a in parser._actions for s in a.option_strings}
        assert shared - refused[name] <= flags, f"{name} lacks {sorted(shared - refused[name] - flags)}"
        assert not refused[name] & flags, f"{name} offers {sorted(refused[name] & flags)}"


def test_flags_are_shorthands_for_set_keys():
    from resmlp.cli import build_parser
    from resmlp.commands.common import training_overrides

    args = build_parser().parse_args(["train", "--output", "x", "--lr", "1e-3", "--opt", "sgd", "--drop-path", "0.1",
                                      "--model-ema", "--amp", "none", "--workers", "0", "--input-size", "1", "28",
                                      "28", "--set", "optim.lr=0.002"])
    assert training_overrides(args) == {"optim.lr": 2e-3, "optim.name": "sgd", "model.drop_path_rate": 0.1,
                                        "train.ema": True, "train.amp": "none", "data.num_workers": 0,
                                        "model.in_chans": 1, "model.img_size": 28}  # --set wins over --lr

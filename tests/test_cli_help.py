"""Help texts a user can act on: every option explained, value names a user types, each command offering
only what it accepts."""

from __future__ import annotations

import argparse

from resmlp.cli import build_parser
from resmlp.commands.common import recipe_names


def _commands(parser: argparse.ArgumentParser, name: str = "resmlp"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _commands(sub, f"{name} {sub_name}")
    yield name, parser


def test_every_option_has_a_help_line_and_a_typed_value_name():
    for name, parser in _commands(build_parser()):
        undocumented = [a.option_strings or a.dest for a in parser._actions
                        if not a.help and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        assert not undocumented, f"{name}: {undocumented} without help"
        assert "FLAG_" not in parser.format_help(), name


def test_each_training_command_offers_what_it_accepts():
    commands = dict(_commands(build_parser()))
    dino = commands["resmlp pretrain dino"]
    assert "--model-ema" not in dino.format_help()
    recipe_help = next(a.help for a in dino._actions if "--recipe" in a.option_strings)
    listed = recipe_help.split("(", 1)[1].split(")", 1)[0].split(", ")
    assert listed == [r for r in recipe_names() if r.startswith("dino")] and "dino-fashion-mnist" in listed
    finetune = commands["resmlp finetune"].format_help()
    assert "--model " not in finetune and "--input-size" not in finetune and "--img-size" in finetune
    assert "--model MODEL" in commands["resmlp train"].format_help()


def test_help_says_what_the_commands_do_with_their_options(capsys):
    """--plot draws accuracy with --accuracy or --val-data, throughput alone without; the probes classify a
    folder's test/ when it has one."""
    import pytest

    with pytest.raises(SystemExit):
        build_parser().parse_args(["benchmark", "--help"])
    assert "with --accuracy or --val-data; without them, throughput alone" in " ".join(capsys.readouterr().out.split())
    for command in ("eval-knn", "eval-linear"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "folders: val" not in text and "DIR/test when it exists, else DIR/val" in text


def test_models_takes_a_filter_and_writes_csv(capsys):
    import csv
    import io

    from resmlp.cli import main

    assert main(["models", "*cmlp*", "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["name"] for r in rows} >= {"resmlp_s12_cmlp", "resmlp_s24_cmlp", "S12 avg pooling -> class-MLP"}
    assert all("cmlp" in r["name"] or "cmlp" in r["preset"] for r in rows)
    assert float(next(r for r in rows if r["name"] == "resmlp_s12_cmlp")["params_m"]) == 17.72
    assert main(["models", "nothing*"]) == 2
    assert "no preset or Table 3 row matches" in capsys.readouterr().err

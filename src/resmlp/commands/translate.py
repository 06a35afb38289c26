"""`resmlp translate train|eval|decode`: sequence-to-sequence ResMLP (and a Transformer baseline)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resmlp.commands.common import add_threads_argument

if TYPE_CHECKING:
    from resmlp.seq2seq.config import TranslationConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="machine translation with seq2seq ResMLP or a Transformer baseline")
    tsub = p.add_subparsers(dest="translate_command", required=True, metavar="ACTION")

    t = tsub.add_parser("train", help="train on parallel text or a built-in task, then score the test split")
    src = t.add_mutually_exclusive_group()  # one is needed, except to --resume a run (its config.json has it)
    src.add_argument("--task", choices=("numbers-en-de", "numbers-en-fr"), help="built-in number-words task")
    src.add_argument("--data", help="directory of {train,valid,test}.{SRC,TGT} files, a sentence per line")
    from resmlp.seq2seq.recipes import RECIPES

    t.add_argument("--recipe", choices=sorted(RECIPES), action=_ApplyRecipe,
                   help="the paper's WMT14 setup (section 3.6; sources in resmlp/seq2seq/recipes.py): sets "
                        "--preset --optimizer --lr --warmup-steps --label-smoothing --dropout --attention-dropout "
                        "--activation-dropout --layerscale-init --beam --lenpen --vocab-size --max-tokens "
                        "--average-last --max-minutes, and --update-freq from the number of processes "
                        "(28,672 tokens per update: Ott et al.'s 8 GPUs); give it first: flags after it override it")
    t.add_argument("--src-suffix", default="src", help="source file suffix, e.g. en (default src)")
    t.add_argument("--tgt-suffix", default="tgt", help="target file suffix, e.g. de (default tgt)")
    t.add_argument("--train-size", type=int, default=50_000, help="training pairs of the built-in task")
    t.add_argument("--output", required=True, help="run directory: checkpoint, tokenizer, logs, summary.json")
    t.add_argument("--resume", action="store_true",
                   help="continue the run in --output with the options of its config.json; a flag given again must "
                        "agree, except --max-steps, --max-minutes, --eval-every, --beam, --lenpen, --device, "
                        "--threads, --data (moved) and --no-progress")
    t.add_argument("--arch", choices=("resmlp", "transformer"), default="resmlp",
                   help="encoder-decoder: ResMLP blocks or the Transformer baseline (default resmlp)")
    t.add_argument("--preset", default="small", help="base6, base12 (paper, dim 512), small, tiny")
    for name, typ in (("dim", int), ("hidden", int), ("encoder-layers", int), ("decoder-layers", int),
                      ("heads", int), ("max-len", int), ("dropout", float), ("layerscale-init", float)):
        t.add_argument(f"--{name}", type=typ, help=f"override the preset's {name}")
    t.add_argument("--attention-dropout", type=float, metavar="P",
                   help="dropout on attention probabilities (default 0, fairseq's transformer default)")
    t.add_argument("--activation-dropout", type=float, metavar="P",
                   help="dropout after the FFN's non-linearity (default 0, fairseq's transformer default)")
    t.add_argument("--activation", choices=("gelu", "relu"),
                   help="FFN non-linearity (default: gelu for resmlp, the paper's eq. 3; relu for transformer, "
                        "fairseq's)")
    t.add_argument("--positions", choices=("none", "sinusoidal"),
                   help="ResMLP position encodings added to the embeddings (default sinusoidal)")
    t.add_argument("--vocab-size", type=int, default=1000, help="joint sentencepiece vocabulary (may end smaller)")
    t.add_argument("--optimizer", choices=("adagrad", "adam"), default="adagrad",
                   help="adagrad + linear warm-up (paper), then constant (this project's choice), or adam + "
                        "inverse-sqrt")
    t.add_argument("--lr", type=float, help="peak learning rate (default 0.2 adagrad, 5e-4 adam)")
    t.add_argument("--warmup-steps", type=int, default=500, metavar="N",
                   help="steps of linear learning-rate warm-up (default 500)")
    t.add_argument("--max-tokens", type=int, default=4096, help="padded tokens per batch (per process)")
    t.add_argument("--update-freq", type=int, metavar="N",
                   help="accumulate the gradients of N batches per process into one update, a step (fairseq's "
                        "--update-freq; default 1, or with --recipe what makes its tokens per update)")
    t.add_argument("--max-steps", type=int, default=100_000, metavar="N",
                   help="stop after this many optimizer steps (default 100000: Vaswani et al.'s base models, the "
                        "number a --recipe run should make)")
    t.add_argument("--max-minutes", type=float, default=20.0, help="wall-clock training budget")
    t.add_argument("--test-decode-limit", type=int, metavar="N",
                   help="decode and score only the first N test sentences at the end (0: none; default all)")
    t.add_argument("--eval-every", type=int, default=500, help="validation loss + checkpoint every N steps")
    t.add_argument("--average-last", type=int, default=1, metavar="N",
                   help="keep the last N checkpoints (checkpoint_STEP.pt) and decode the test split with their "
                        "parameter mean, as fairseq's average_checkpoints.py (default 1: no averaging)")
    t.add_argument("--label-smoothing", type=float, default=0.1, metavar="EPS",
                   help="label smoothing of the cross-entropy (default 0.1)")
    t.add_argument("--clip-norm", type=float, default=0.0, help="gradient norm clipping (0 = off)")
    t.add_argument("--precision", choices=("fp32", "bf16", "fp16", "auto"), default="fp32",
                   help="autocast: bf16 (CPU or GPU), fp16 (GPU, with loss scaling), "
                        "auto (bf16 where native, else fp16 on a GPU, fp32 on a CPU)")
    _decode_args(t)
    t.add_argument("--seed", type=int, default=0, help="seed of initialisation and data order (default 0)")
    t.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    _tell_given_flags(t)
    t.set_defaults(run=run_translate_train)

    e = tsub.add_parser("eval", help="score a trained model: BLEU, chrF, exact match, tokenized BLEU")
    e.add_argument("checkpoint", help="training output directory or its checkpoint.pt")
    e.add_argument("--split", default="test", help="split of the run's data directory (default test)")
    e.add_argument("--src", help="source file instead of the run's split")
    e.add_argument("--ref", help="reference file (with --src)")
    _decode_args(e)
    e.add_argument("--json", help="also write the scores to this file")
    e.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    e.set_defaults(run=run_translate_eval)

    a = tsub.add_parser("average", help="average the last N kept checkpoints of a run (fairseq's "
                                        "average_checkpoints.py) into RUN/checkpoint_avgN.pt")
    a.add_argument("run_dir", metavar="RUN", help="training output directory trained with --average-last N or more")
    a.add_argument("--last", type=int, default=5, metavar="N",
                   help="how many of the last kept checkpoints to average (default 5)")
    a.set_defaults(run=run_translate_average)

    d = tsub.add_parser("decode", help="translate lines from a file or stdin")
    d.add_argument("checkpoint", help="training output directory or its checkpoint.pt")
    d.add_argument("--input", default="-", help="source file (default stdin)")
    _decode_args(d)
    d.add_argument("--precision", choices=("fp32", "bf16", "fp16", "auto"), default="fp32", help="autocast")
    d.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    d.set_defaults(run=run_translate_decode)


class _ApplyRecipe(argparse.Action):
    """`--recipe NAME`: the recipe's values become the flags' values; flags after it override them. A flag it sets
    that came before it is refused rather than silently replaced."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, name: object,
                 option_string: str | None = None) -> None:
        from resmlp.seq2seq.recipes import recipe_values

        values = recipe_values(str(name))
        earlier = [f"--{k.replace('_', '-')}" for k in values if getattr(namespace, k) != parser.get_default(k)]
        if earlier:
            parser.error(f"{', '.join(earlier)} came before --recipe {name}, which sets it: put --recipe first so "
                         "the flags after it override its values")
        for key, value in values.items():
            setattr(namespace, key, value)
        setattr(namespace, self.dest, name)


def _tell_given_flags(parser: argparse.ArgumentParser) -> None:
    """Every flag's default becomes None, the real ones kept in `flag_defaults`: a run then tells a flag given
    (even at its default value) from one left out, as a resume needs (a flag left out keeps the run's value; a
    flag given must agree with it). `_fill_flags` puts the defaults back."""
    defaults = {action.dest: action.default for action in parser._actions
                if action.default is not None and action.default != argparse.SUPPRESS}
    parser.set_defaults(flag_defaults=defaults, **dict.fromkeys(defaults))


def _fill_flags(args: argparse.Namespace, values: dict[str, Any]) -> None:
    """The flags left out take `values`."""
    for dest, value in values.items():
        if getattr(args, dest, None) is None:
            setattr(args, dest, value)


def _run_flags(cfg: TranslationConfig, source_given: bool) -> dict[str, Any]:
    """The flag values that make run config `cfg`; its task or data only when the command line names neither
    (--task and --data name the corpus together)."""
    values = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("output", "progress", "model_overrides", "task_train_size")}
    if source_given:
        del values["task"], values["data"]
    return {**values, "train_size": cfg.task_train_size, **cfg.model_overrides}


def _decode_args(p: argparse.ArgumentParser) -> None:
    """Decoding, device and thread flags, shared by train (its test split), eval and decode."""
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy, at most 64); the paper uses 4")
    p.add_argument("--lenpen", type=float, default=0.6, help="length penalty: score / length**lenpen")
    p.add_argument("--device", default="auto", help="auto (cuda:LOCAL_RANK when a GPU is visible), cpu, cuda, cuda:N")
    add_threads_argument(p)


def _preparing(args: argparse.Namespace) -> None:
    """A line before the work that shows no bar (making the built-in task, training the tokenizer, encoding)."""
    if args.progress:
        print("translate train: preparing the data and the tokenizer ...", file=sys.stderr, flush=True)


def run_translate_train(args: argparse.Namespace) -> int:
    from resmlp.seq2seq.config import MODEL_OVERRIDES
    from resmlp.seq2seq.train import TranslationConfig, train_translation

    source_given = args.task is not None or args.data is not None
    if args.resume and (Path(args.output) / "config.json").is_file():
        # resume means the run's options: the flags left out take them, the flags given are checked against them
        # (seq2seq.config.check_resumable), whether or not --task/--data is given again
        _fill_flags(args, _run_flags(_run_config(args.output)[1], source_given))
    elif not source_given:
        raise ValueError("resmlp translate train needs --task NAME or --data DIR (or --resume to continue the "
                         f"run in --output, which needs its config.json: {Path(args.output) / 'config.json'} is "
                         "not there)")
    _fill_flags(args, args.flag_defaults)
    overrides = {k: getattr(args, k) for k in MODEL_OVERRIDES if getattr(args, k) is not None}
    lr = args.lr if args.lr is not None else (0.2 if args.optimizer == "adagrad" else 5e-4)
    cfg = TranslationConfig(
        output=args.output, task=args.task, data=args.data, src_suffix=args.src_suffix,
        tgt_suffix=args.tgt_suffix, task_train_size=args.train_size, arch=args.arch, preset=args.preset,
        model_overrides=overrides, vocab_size=args.vocab_size, optimizer=args.optimizer, lr=lr,
        warmup_steps=args.warmup_steps, max_tokens=args.max_tokens, update_freq=_update_freq(args),
        max_steps=args.max_steps, max_minutes=args.max_minutes, eval_every=args.eval_every,
        average_last=args.average_last, label_smoothing=args.label_smoothing,
        clip_norm=args.clip_norm, precision=args.precision, beam=args.beam, lenpen=args.lenpen,
        seed=args.seed, device=args.device, threads=args.threads, progress=args.progress,
        test_decode_limit=args.test_decode_limit,
    )
    if args.recipe is not None and not args.resume:  # a resume keeps the run's batch, printed when it started
        _print_batch(cfg, args.recipe)
    _preparing(args)
    summary = train_translation(cfg, resume=args.resume)
    if summary:
        print(json.dumps(summary, indent=2))
    return 0


def _processes() -> int:
    """The number of training processes: torchrun's WORLD_SIZE, else 1."""
    value = os.environ.get("WORLD_SIZE", "1")
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"WORLD_SIZE={value!r}: expected the number of processes (torchrun sets it)")
    return int(value)


def _update_freq(args: argparse.Namespace) -> int:
    """--update-freq as given (default 1); with --recipe and none given, the fewest batches per process whose tokens
    make the recipe's tokens per update with this many processes (WORLD_SIZE)."""
    if args.update_freq is not None or args.recipe is None or args.max_tokens < 1:  # TranslationConfig checks them
        return 1 if args.update_freq is None else args.update_freq
    from resmlp.seq2seq.config import RANGES
    from resmlp.seq2seq.recipes import TOKENS_PER_UPDATE

    world, target = _processes(), TOKENS_PER_UPDATE[0]
    freq = max(1, math.ceil(target / (args.max_tokens * world)))
    if freq > RANGES["update_freq"][1]:
        raise ValueError(f"--recipe {args.recipe}: {target:,} tokens per update would take {freq} batches of "
                         f"--max-tokens {args.max_tokens} on {world} processes, more than --update-freq allows "
                         f"({RANGES['update_freq'][1]}); raise --max-tokens")
    return freq


def _print_batch(cfg, recipe: str) -> None:
    """A recipe run's effective batch, once (rank 0), against the recipe's."""
    from resmlp.seq2seq.recipes import TOKENS_PER_UPDATE

    world = _processes()
    if os.environ.get("RANK", "0") == "0":
        print(f"--recipe {recipe}: {cfg.max_tokens} tokens per batch x {cfg.update_freq} batches per update "
              f"(--update-freq) x {world} processes = {cfg.max_tokens * cfg.update_freq * world:,} tokens per update "
              f"at most (the recipe's {TOKENS_PER_UPDATE[0]:,}: {TOKENS_PER_UPDATE[1]})", file=sys.stderr, flush=True)


def _run_config(checkpoint: str):
    from resmlp.seq2seq.runfolder import read_run_config

    run_dir = Path(checkpoint) if Path(checkpoint).is_dir() else Path(checkpoint).parent
    return run_dir, read_run_config(run_dir)


def run_translate_eval(args: argparse.Namespace) -> int:
    from resmlp.runtime import process_settings, resolve_device
    from resmlp.seq2seq.config import check_decoding
    from resmlp.seq2seq.data import read_parallel
    from resmlp.seq2seq.scoring import moses_tokenizer
    from resmlp.seq2seq.train import evaluate_translation, load_trained, scores, translate

    check_decoding(args.beam, args.lenpen)
    moses_tokenizer()  # a broken sacremoses install stops it now, not after translating
    if bool(args.src) != bool(args.ref):
        raise ValueError("--src and --ref go together")
    with process_settings(args.threads):
        model, tok, _ = load_trained(args.checkpoint, resolve_device(args.device))
        run_dir, cfg = _run_config(args.checkpoint)
        cfg.beam, cfg.lenpen = args.beam, args.lenpen
        if args.src:
            src, ref = read_parallel(args.src, args.ref)
            hyps = translate(model, tok, src, beam=args.beam, lenpen=args.lenpen, precision=cfg.precision,
                             progress=args.progress)
            result = scores(hyps, ref)
        else:
            data = Path(cfg.data) if cfg.data else run_dir / "data"
            result = evaluate_translation(model, tok, data, args.split, cfg, progress=args.progress)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        from resmlp.fileio import atomic_write

        atomic_write(args.json, lambda p: p.write_text(text))
    return 0


def run_translate_average(args: argparse.Namespace) -> int:
    from resmlp.seq2seq.averaging import write_average
    from resmlp.seq2seq.config import RANGES

    low, high = RANGES["average_last"]
    if not low <= args.last <= high:
        raise ValueError(f"--last {args.last}: expected a whole number from {low} to {high}")
    if not Path(args.run_dir).is_dir():
        raise FileNotFoundError(f"{args.run_dir} is not a folder; expected a `resmlp translate train` output folder")
    path, averaged = write_average(args.run_dir, args.last)
    steps = ", ".join(map(str, averaged["averaged_steps"]))
    print(f"averaged the checkpoints of steps {steps} into {path}\nscore it with: resmlp translate eval "
          f"{shlex.quote(str(path))}")
    return 0


def run_translate_decode(args: argparse.Namespace) -> int:
    from resmlp.runtime import process_settings, resolve_device
    from resmlp.seq2seq.config import check_decoding
    from resmlp.seq2seq.data import read_lines, split_lines
    from resmlp.seq2seq.train import load_trained, translate

    check_decoding(args.beam, args.lenpen)
    with process_settings(args.threads):
        model, tok, _ = load_trained(args.checkpoint, resolve_device(args.device))
        lines = split_lines(sys.stdin.read()) if args.input == "-" else read_lines(args.input)
        hyps = translate(model, tok, lines, beam=args.beam, lenpen=args.lenpen, precision=args.precision,
                         progress=args.progress)
    for hyp in hyps:
        print(hyp)
    return 0

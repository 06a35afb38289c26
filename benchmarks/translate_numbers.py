"""Number-words translation: seq2seq ResMLP vs the Transformer baseline at equal parameters and budget.

Runs `resmlp translate train` once per (task, arch) with the same wall-clock budget (--max-minutes) and
optimiser, then prints one table (exact match / BLEU / chrF on held-out numbers) and the ResMLP /
Transformer ratios. The ResMLP's FFN width is raised so its parameter count matches the Transformer's
(its token mixing, L x L per layer, is much smaller than self-attention's 4 d^2).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/translate_numbers.py --max-minutes 20 --tasks numbers-en-de

One intra-op thread per run: on the shared 2-core machine a dim-128 training step took ~1.1 s with one
thread against ~3 s with two (the default).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from resmlp.fileio import write_json
from resmlp.seq2seq.model import build_translation_model, translation_model_config


def params(arch: str, vocab: int, **kw) -> int:
    model = build_translation_model(translation_model_config("small", vocab, arch=arch, **kw))
    return sum(p.numel() for p in model.parameters())


def matched_hidden(dim: int, hidden: int, layers: int, max_len: int, vocab: int) -> int:
    """Smallest ResMLP FFN width with at least the Transformer's parameter count."""
    common = dict(dim=dim, encoder_layers=layers, decoder_layers=layers, max_len=max_len)
    target = params("transformer", vocab, hidden=hidden, **common)
    h = hidden
    while params("resmlp", vocab, hidden=h, **common) < target:
        h += 8
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=["numbers-en-de", "numbers-en-fr"])
    ap.add_argument("--archs", nargs="+", default=["resmlp", "transformer"])
    ap.add_argument("--max-minutes", type=float, default=20.0, help="training budget per run")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=512, help="Transformer FFN width (ResMLP's is matched)")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=48)
    ap.add_argument("--vocab-size", type=int, default=400, help="sentencepiece vocabulary requested")
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--lr", type=float, default=3e-3, help="3e-3 beat 1e-3 for both archs in 150-step trials")
    ap.add_argument("--warmup-steps", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=3072)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--positions", default="sinusoidal", choices=("none", "sinusoidal"),
                    help="ResMLP position encodings (the Transformer always has sinusoidal ones)")
    ap.add_argument("--output", default="runs/translate_numbers", help="finished runs found here are reused")
    args = ap.parse_args()

    rows = []
    for task in args.tasks:
        for arch in args.archs:
            out = Path(args.output) / f"{task}_{arch}"
            hidden, extra = args.hidden, []
            if arch == "resmlp":  # vocab size only shifts both counts equally; match on the requested one
                hidden = matched_hidden(args.dim, args.hidden, args.layers, args.max_len, args.vocab_size)
                extra = ["--positions", args.positions]
            cmd = [sys.executable, "-m", "resmlp", "translate", "train", "--task", task, "--arch", arch,
                   "--preset", "small", "--dim", str(args.dim), "--hidden", str(hidden),
                   "--encoder-layers", str(args.layers), "--decoder-layers", str(args.layers),
                   "--max-len", str(args.max_len), "--dropout", str(args.dropout),
                   "--vocab-size", str(args.vocab_size), "--optimizer", args.optimizer, "--lr", str(args.lr),
                   "--warmup-steps", str(args.warmup_steps), "--max-tokens", str(args.max_tokens),
                   "--max-minutes", str(args.max_minutes), "--beam", str(args.beam), "--output", str(out), *extra]
            if (out / "summary.json").is_file():
                print(f"reusing the finished run in {out}", flush=True)
            else:
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)
            summary = json.loads((out / "summary.json").read_text())
            rows.append({**summary, "task": task, "arch": arch, "hidden": hidden})

    print(f"\n{'task':15} {'arch':12} {'params':>9} {'steps':>6} {'exact %':>8} {'BLEU':>6} {'chrF':>6} {'wall s':>7}")
    for r in rows:
        print(f"{r['task']:15} {r['arch']:12} {r['params']:9d} {r['steps']:6d} {r['exact_match']:8.1f} "
              f"{r['bleu']:6.1f} {r['chrf']:6.1f} {r['wall_seconds']:7.0f}")
    for task in args.tasks:
        by = {r["arch"]: r for r in rows if r["task"] == task}
        if {"resmlp", "transformer"} <= by.keys():
            t = by["transformer"]["exact_match"]
            print(f"{task}: ResMLP / Transformer exact match = {by['resmlp']['exact_match']:.1f} / {t:.1f}")
    write_json(Path(args.output) / "results.json", rows)


if __name__ == "__main__":
    main()

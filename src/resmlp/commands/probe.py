"""`resmlp eval-knn` and `resmlp eval-linear`: frozen-feature evaluation of any checkpoint."""

from __future__ import annotations

import argparse
import json

from resmlp.commands.common import (
    add_output_argument,
    add_progress_argument,
    add_threads_argument,
    amp_value,
    batch_size,
)
from resmlp.commands.train import DATA_KINDS


def register(sub: argparse._SubParsersAction) -> None:
    for method, text in (("knn", "DINO's weighted k-NN (k=20, T=0.07) on frozen features"),
                         ("linear", "a linear probe (logistic regression) on frozen features")):
        p = sub.add_parser(f"eval-{method}", help=f"accuracy of {text}",
                           description=f"Accuracy of {text}: the train split is the memory/training set, the "
                                       "held-out split is classified: test (a folder: DIR/test when it exists, "
                                       "else DIR/val). Prints and writes summary.json.")
        p.add_argument("checkpoint", help="any checkpoint (ours, a DINO backbone, timm's or DeiT's) or a run folder")
        p.add_argument("--data", default="fashion-mnist",
                       help="data source (folder:DIR, wds:PATTERN, hf:DIR, fashion-mnist, cifar10:DIR...), "
                            f"dataset kind ({', '.join(DATA_KINDS)}) or a folder")
        p.add_argument("--data-dir", help="dataset folder (default: the kind's default location)")
        add_output_argument(p, help="folder for summary.json")
        add_threads_argument(p)
        add_progress_argument(p)
        p.add_argument("--batch-size", type=batch_size, default=256, metavar="N",
                       help="images per batch (default 256)")
        p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default auto)")
        p.add_argument("--amp", type=amp_value, default="auto", metavar="{auto,bf16,fp16,fp32}",
                       help="features' precision: auto = bf16 where native, else fp16 on a GPU, fp32 on a CPU "
                            "(as `resmlp eval`)")
        if method == "knn":
            p.add_argument("--k", type=int, default=20, help="neighbours (default 20)")
            p.add_argument("--temperature", type=float, default=0.07, help="vote weight exp(sim/T) (default 0.07)")
        p.set_defaults(run=run_probe, method=method)


def run_probe(args: argparse.Namespace) -> int:
    from resmlp.fileio import output_lock
    from resmlp.runtime import process_settings
    from resmlp.train.probe import frozen_feature_eval

    extra = dict(k=args.k, temperature=args.temperature) if args.method == "knn" else {}
    with process_settings(args.threads), output_lock(args.output):
        summary = frozen_feature_eval(args.checkpoint, args.method, args.data, args.data_dir, args.output,
                                      args.batch_size, device=args.device, progress=args.progress, amp=args.amp,
                                      **extra)
    print(json.dumps(summary))
    return 0

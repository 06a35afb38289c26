"""DINO pre-training of a small ResMLP on Fashion-MNIST, then k-NN, linear probe and fine-tuning.

    nice -n 19 .venv/bin/python benchmarks/dino_fashion_mnist.py --output runs/bench-dino   # target k-NN >= 80%
    nice -n 19 .venv/bin/python benchmarks/dino_fashion_mnist.py --tiny   # smoke run on synthetic data

Prints the three numbers the DINO paper reports (k-NN, linear, fine-tuned top-1) and, as the equal-budget
reference for fine-tuning, the same network trained from scratch with the same recipe and epochs;
OUTPUT/results.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import resmlp
from resmlp.fileio import write_json
from resmlp.train import finetune, pretrain_dino, train
from resmlp.train.config import TRAINING_FIELDS, load_config, parse_overrides
from resmlp.train.probe import frozen_feature_eval

TINY = {"data.kind": "synthetic", "data.synthetic_size": [128, 64], "schedule.epochs": 1,
        "schedule.warmup_epochs": 0, "train.progress": False, "train.batch_size": 32,
        "train.compile": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=f"runs/bench-dino-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--epochs", type=int, help="DINO epochs (default: the recipe's)")
    parser.add_argument("--finetune-epochs", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="one epoch on synthetic data: checks the pipeline only")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a key of the DINO recipe (repeatable), e.g. --set dino.num_local=2")
    args = parser.parse_args()
    out = Path(args.output)
    common = dict(TINY) if args.tiny else {}
    epochs = {"schedule.epochs": args.epochs} if args.epochs else {}
    pre = pretrain_dino("dino-fashion-mnist", out / "dino", {**common, **parse_overrides(args.overrides), **epochs})
    data = "synthetic" if args.tiny else "fashion-mnist"
    linear = frozen_feature_eval(pre["checkpoint"], "linear", data, output=out / "linear")
    labelled = {**common, "schedule.epochs": 1 if args.tiny else args.finetune_epochs}
    tuned = finetune(pre["checkpoint"], "fashion-mnist-quick", out / "finetune", labelled)
    scratch_cfg = load_config("fashion-mnist-quick", labelled).to_dict()
    backbone = resmlp.load(pre["checkpoint"]).config.to_dict()  # the same network, from random weights
    scratch_cfg["model"] = {"name": "resmlp_s12", **{k: v for k, v in backbone.items() if k != "num_classes"},
                            **{k: v for k, v in scratch_cfg["model"].items() if k in TRAINING_FIELDS}}
    scratch = train(scratch_cfg, out / "scratch")
    # k-NN: the checkpoint selected on validation k-NN, then classified once on test
    result = {"val_knn_top1": pre["knn_top1"], "knn_top1": pre["test_knn_top1"], "linear_top1": linear["linear_top1"],
              "finetune_top1": tuned["test_top1"],
              "scratch_top1": scratch["test_top1"],
              "dino_epochs": pre["epochs"], "dino_seconds": pre["wall_seconds"], "finetune_epochs": tuned["epochs"],
              "host": pre.get("host"), "tiny": args.tiny}
    write_json(out / "results.json", result)
    print(f"DINO ({pre['epochs']} epochs, {pre['wall_seconds']:.0f}s): k-NN top-1 {result['knn_top1']:.2f}% "
          f"(validation {result['val_knn_top1']:.2f}%), "
          f"linear probe {result['linear_top1']:.2f}%, fine-tuned ({tuned['epochs']} epochs) "
          f"{result['finetune_top1']:.2f}% (from scratch: {result['scratch_top1']:.2f}%) -> {out}/results.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

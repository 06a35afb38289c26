"""Transfer: a Fashion-MNIST ResMLP fine-tuned on scikit-learn's digits vs the same model from scratch.

    nice -n 19 .venv/bin/python benchmarks/transfer_digits.py --output runs/bench-transfer
    nice -n 19 .venv/bin/python benchmarks/transfer_digits.py --source runs/quickstart/best.safetensors
    nice -n 19 .venv/bin/python benchmarks/transfer_digits.py --tiny   # smoke run

sklearn.datasets.load_digits (1797 8x8 images, 16 grey levels) is upsampled to 28x28 (bicubic) and
written as an image folder (fixed stratified splits: 25 % test, 15 % of the rest validation). Both runs
use the fashion-mnist-quick recipe on that folder with the same epochs; only the starting weights differ.
OUTPUT/comparison.json.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from resmlp.fileio import write_json
from resmlp.train import finetune, train


def write_digits(root: Path, seed: int = 0) -> Path:
    """load_digits as root/{train,val,test}/<digit>/<n>.png at 28x28: a fixed stratified 25 % test split (as
    before validation existed) and 15 % of the rest as validation, which picks the checkpoint; test is read
    once, at the end."""
    digits = load_digits()
    images = (digits.images * (255.0 / 16.0)).astype(np.uint8)
    idx_rest, idx_test = train_test_split(np.arange(len(images)), test_size=0.25, random_state=seed,
                                          stratify=digits.target)
    idx_train, idx_val = train_test_split(idx_rest, test_size=0.15, random_state=seed,
                                          stratify=digits.target[idx_rest])
    for split, indices in (("train", idx_train), ("val", idx_val), ("test", idx_test)):
        for i in indices:
            folder = root / split / str(digits.target[i])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(images[i]).resize((28, 28), Image.BICUBIC).save(folder / f"{i}.png")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default=f"runs/bench-transfer-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--source", help="a Fashion-MNIST checkpoint (default: train fashion-mnist-quick first)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs on digits, for both runs")
    parser.add_argument("--tiny", action="store_true", help="1-epoch source on synthetic data, 1 epoch on digits")
    args = parser.parse_args()
    out = Path(args.output)
    data_dir = write_digits(out / "digits")
    source = args.source
    if source is None:
        tiny_src = ({"data.kind": "synthetic", "schedule.epochs": 1, "schedule.warmup_epochs": 0,
                     "train.compile": False} if args.tiny else {})
        source = train("fashion-mnist-quick", out / "source", {**tiny_src, "train.progress": False})["checkpoint"]
    digits = {"data.kind": "folder", "data.dir": str(data_dir), "data.hflip": 0.0,  # digits are not symmetric
              "data.num_workers": 0, "schedule.epochs": 1 if args.tiny else args.epochs, "train.batch_size": 64,
              "train.progress": False, **({"train.compile": False} if args.tiny else {})}
    scratch = train("fashion-mnist-quick", out / "scratch", digits)
    tuned = finetune(source, "fashion-mnist-quick", out / "finetune", digits)
    result = {"scratch_top1": scratch["test_top1"], "finetune_top1": tuned["test_top1"],
              "gain": tuned["test_top1"] - scratch["test_top1"], "epochs": scratch["epochs"], "source": str(source),
              "tiny": args.tiny}
    write_json(out / "comparison.json", result)
    print(f"digits, {result['epochs']} epochs: from scratch {result['scratch_top1']:.2f}%, fine-tuned from "
          f"Fashion-MNIST {result['finetune_top1']:.2f}% ({result['gain']:+.2f}) -> {out}/comparison.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

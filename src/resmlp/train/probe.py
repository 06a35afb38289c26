"""Frozen-feature evaluation: DINO's weighted k-NN (in torch) and a linear probe (scikit-learn)."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from resmlp.errors import ConfigError
from resmlp.runtime import copy_to


@torch.inference_mode()
def extract_features(features: torch.nn.Module, loader: DataLoader,
                     device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Pooled pre-logits features (the representation DINO evaluates) and labels of a whole loader
    ((images, targets) or (images, targets, skipped) batches), both on `device`: on a GPU they stay there for
    the k-NN, with no copy back per batch. `features` is `inference.optimize_features(model, precision)`, built
    once for all the loaders of one evaluation."""
    device = torch.device(device)
    feats, labels = [], []
    for images, targets, *_ in loader:
        feats.append(features(copy_to(images, device) if images.device != device else images).float())
        labels.append(copy_to(targets, device) if targets.device != device else targets)
    return torch.cat(feats), torch.cat(labels)


def knn_accuracy(train_x: torch.Tensor | np.ndarray, train_y: torch.Tensor | np.ndarray,
                 test_x: torch.Tensor | np.ndarray, test_y: torch.Tensor | np.ndarray,
                 k: int = 20, temperature: float = 0.07, chunk: int = 1024) -> float:
    """Top-1 (%) of DINO's weighted k-NN: cosine similarity, the k nearest vote with weight exp(sim / T).

    Done in torch as DINO's eval_knn.py does it (one matrix product and a top-k per chunk of test images), on
    the features' device, read once at the end: scikit-learn's brute-force neighbours with a Python weight
    function were 5.7x slower on the quickstart (benchmarks/knn_speed.py).
    """
    check_knn_arguments(k, temperature)
    memory = torch.nn.functional.normalize(torch.as_tensor(train_x).float(), dim=1)
    device = memory.device
    labels = torch.as_tensor(train_y).long().to(device)
    queries = torch.nn.functional.normalize(torch.as_tensor(test_x).float().to(device), dim=1)
    test_labels = torch.as_tensor(test_y).long().to(device)
    num_classes = int(torch.stack([labels.max(), test_labels.max()]).max()) + 1  # one read
    k = min(k, len(memory))
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for start in range(0, len(queries), chunk):
        sims, idx = (queries[start:start + chunk] @ memory.T).topk(k, dim=1)
        # weights relative to the nearest neighbour's (the same vote, scaled per query): no overflow at small T
        weights = ((sims - sims[:, :1]) / temperature).exp()
        votes = torch.zeros(len(idx), num_classes, device=device).scatter_add_(1, labels[idx], weights)
        correct += (votes.argmax(dim=1) == test_labels[start:start + chunk]).sum()
    # the one read of the vote; 100 * k / n: 28.0, not 0.28 * 100 = 28.000000000000004
    return 100.0 * int(correct.item()) / len(test_labels)


MAX_K = 10_000
TEMPERATURE_RANGE = (1e-4, 100.0)  # DINO uses 0.07; the same range as the dino.knn_temperature recipe key


def check_knn_arguments(k: int, temperature: float) -> None:
    """k a whole number from 1 to MAX_K, the temperature a finite number in TEMPERATURE_RANGE."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise ConfigError(f"--k {k!r}: expected a whole number of neighbours from 1 to {MAX_K} (DINO uses 20)")
    low, high = TEMPERATURE_RANGE
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and low <= temperature <= high):
        raise ConfigError(f"--temperature {temperature!r}: expected a number from {low:g} to {high:g} (DINO uses "
                          "0.07); it weighs each neighbour's vote by exp(similarity / T)")


def linear_probe_accuracy(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
                          max_iter: int = 1000) -> float:
    """Top-1 (%) of a multinomial logistic regression on standardised frozen features."""
    # imported here: scikit-learn takes seconds to import and eval-knn / DINO's k-NN don't need it
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter))
    probe.fit(train_x, train_y)
    return 100.0 * int((probe.predict(test_x) == test_y).sum()) / len(test_y)


def frozen_feature_eval(checkpoint: str | Path, method: str = "knn", data: str = "fashion-mnist",
                        data_dir: str | Path | None = None, output: str | Path | None = None, batch_size: int = 256,
                        num_workers: int = 2, device: str = "auto", k: int = 20,
                        temperature: float = 0.07, progress: bool = False, amp: str = "auto") -> dict[str, Any]:
    """k-NN (`knn_top1`) or linear-probe (`linear_top1`) accuracy of any checkpoint's frozen features.

    The training split is the memory / probe training set, the held-out split is classified (test; a folder:
    DIR/test when it exists, else DIR/val, as `resmlp.data.heldout_split` says);
    both with the checkpoint's evaluation preprocessing. data: a dataset kind or
    a folder holding train/<class>/ and val/<class>/. amp: the features' precision as `resmlp eval`'s
    (auto = runtime.resolve_amp's rule: bf16 where native, else fp16 on a GPU, fp32 on a CPU; bf16, fp16 or
    none). With `output`, writes OUTPUT/summary.json, host and precision included.
    """
    from resmlp import reporting
    from resmlp.data import ArrayDataset, build_dataset, heldout_split, resolve_data
    from resmlp.evaluation import eval_batches_or_loader, resolve_checkpoint
    from resmlp.hostinfo import host_info
    from resmlp.inference import load_for_inference, optimize_features
    from resmlp.runtime import check_device_name, precision_name, resolve_amp, resolve_device

    check_device_name(device)  # before the checkpoint and the data are read
    if method not in ("knn", "linear"):
        raise ValueError(f"method must be knn or linear, got {method!r}")
    if method == "knn":  # before minutes of feature extraction
        check_knn_arguments(k, temperature)
    if not 1 <= batch_size <= 65536:
        raise ConfigError(f"--batch-size {batch_size}: expected a number of images from 1 to 65536")
    checkpoint = resolve_checkpoint(checkpoint)
    spec = resolve_data(data, data_dir)
    loaded = load_for_inference(checkpoint, dataset=spec.kind)
    pre, model = loaded.preprocess, loaded.model
    if pre.note:  # assumed, not read from the file (resmlp.preprocess.preprocess_of_file): said in one line
        print(pre.note, file=sys.stderr, flush=True)
    torch_device = resolve_device(device)
    precision = precision_name(resolve_amp(amp, torch_device))  # the one rule: fp16 on a GPU without native bf16
    features = optimize_features(model, precision).to(torch_device)
    start = time.perf_counter()
    split_features = []
    for split in ("train", heldout_split(spec)):
        dataset = build_dataset(spec, split, None, pre.in_chans, pre.eval_transform(), img_size=pre.img_size)
        # in-memory images already at the model's size are preprocessed in whole batches (exact, and ~10x faster
        # than the per-image PIL transform that dominated eval-knn's time)
        batched = (pre.batched_eval(*dataset.images.shape[1:3]) if isinstance(dataset, ArrayDataset) else None)
        loader = eval_batches_or_loader(dataset, batched, batch_size, num_workers)
        if progress:
            from resmlp.progress import progress_bar

            # the batched form is a generator: the total (and so the ETA) comes from the split's size
            loader = progress_bar(loader, desc=f"features {split}", unit="batch", total=-(-len(dataset) // batch_size))
        split_features += extract_features(features, loader, torch_device)
    if method == "knn":
        key, top1 = "knn_top1", knn_accuracy(*split_features, k=k, temperature=temperature)
    else:
        if progress:  # the fit shows no bar of its own and takes a while on a large training split
            train_x = split_features[0]
            print(f"fitting the linear probe on {len(train_x)} features of {train_x.shape[1]} dimensions ...",
                  file=sys.stderr, flush=True)
        key, top1 = "linear_top1", linear_probe_accuracy(*(t.cpu().numpy() for t in split_features))
    summary = {key: top1, "checkpoint": str(Path(checkpoint).resolve()), "dataset": spec.kind,
               "train_images": len(split_features[1]), "test_images": len(split_features[3]),
               "feature_dim": int(split_features[0].shape[1]), "wall_seconds": round(time.perf_counter() - start, 1),
               "precision": precision, "host": host_info(precision),
               "preprocess": dict(pre.to_dict(), source=pre.source), "preprocess_note": pre.note or None}
    if method == "knn":
        summary.update(k=k, temperature=temperature)
    if output is not None:
        reporting.write_json(Path(output) / "summary.json", summary)
    return summary

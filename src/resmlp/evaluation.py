"""Classification accuracy of a model on a dataset: the loop training evaluates with, and `resmlp eval`.

`classify` sums loss, top-1/top-5 and the confusion matrix over all ranks of a torchrun job; `evaluate` runs
it for a checkpoint (or a run folder) with the checkpoint's own preprocessing, dataset kind and class names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from resmlp.command_files import claim_outputs, note_inputs
from resmlp.complexity import CONFUSION_MAX_CLASSES
from resmlp.data import ShardSampler, build_dataset, heldout_split, resolve_data
from resmlp.data.arrays import ArrayDataset
from resmlp.data.device.batch_augment import BatchAugment, eval_batches
from resmlp.data.loading.loaders import eval_loader
from resmlp.data.records import SourceSpec
from resmlp.data.sources import spec_from_config
from resmlp.eval_extras import EvalExtras
from resmlp.runtime import (
    DistInfo,
    all_reduce_sum,
    autocast,
    check_device_name,
    data_workers,
    is_accelerator,
    precision_name,
    resolve_amp,
    resolve_device,
)

EVAL_BATCH_SIZE = 256  # `resmlp eval`'s default, and the batch of a run's final test scoring: same batches, same number


MAX_CONFUSION_CELLS = CONFUSION_MAX_CLASSES ** 2  # ImageNet-1k's 10^6 cells fit; 100,000 classes would be 74.5 GiB


@torch.no_grad()
def classify(model: nn.Module, batches: Iterable, num_classes: int, device: torch.device, amp: str,
             info: DistInfo | None = None) -> dict[str, Any]:
    """Loss, top-1, top-5 (percent; None for 5 classes or fewer) and the confusion matrix of (images, targets,
    skipped) batches, summed over all ranks. Non-finite logits are an error: a broken model gets no score.

    The sums stay on `device` and are read once at the end: a GPU never waits for the host between batches.
    """
    model.eval()
    # the K x K matrix only where it is small (MAX_CONFUSION_CELLS): bounded by what is allocated, not by the
    # class list's bound; beyond it, each class's hits and images (2K cells) give top-1 and per-class top-1
    dense = num_classes * num_classes <= MAX_CONFUSION_CELLS
    confusion = torch.zeros(num_classes * num_classes if dense else 2 * num_classes, dtype=torch.int64,
                            device=device)
    # loss sum, top-5 hits, non-finite batches (float64: integer counts stay exact below 2**53)
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    images, skipped = 0, 0  # known on the host: no read
    top5 = num_classes > 5  # top-5 of 5 classes or fewer is 100 % whatever the model: not a score
    for batch_images, targets, batch_skipped in batches:
        batch_images = batch_images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        with autocast(device, amp):
            logits = model(batch_images)
        logits = logits.float()
        sums += torch.stack([nn.functional.cross_entropy(logits, targets, reduction="sum"),
                             (logits.topk(5, dim=1).indices == targets[:, None]).any(dim=1).sum() if top5
                             else torch.zeros((), device=device),
                             (~torch.isfinite(logits).all())]).double()
        # scatter_add, not bincount: bincount sizes its output from the data, a host read on a GPU
        predicted = logits.argmax(dim=1)
        if dense:
            cell = targets * num_classes + predicted
            confusion.scatter_add_(0, cell, torch.ones_like(cell))
        else:
            confusion.scatter_add_(0, torch.cat([targets, targets + num_classes]),
                                   torch.cat([(predicted == targets).long(), torch.ones_like(targets)]))
        images += len(targets)
        skipped += batch_skipped
    counts = sums.new_empty(2)  # the host's counts written by two fills: no host data copied up
    counts[0], counts[1] = images, skipped
    packed = torch.cat([sums, counts, confusion.double()])
    if info is not None:
        all_reduce_sum(packed, info)
    values = packed.tolist()  # the one read of the whole evaluation
    loss_sum, top5_hits, bad, images, skipped = values[:5]
    if bad:
        raise ValueError("the model's outputs are NaN or infinite (non-finite weights?); no accuracy to report")
    cells = np.rint(values[5:]).astype(np.int64)
    confusion = cells.reshape(num_classes, num_classes) if dense else None
    hits, counts = (np.diag(confusion), confusion.sum(axis=1)) if dense else np.split(cells, 2)
    n = max(images, 1)
    return dict(loss=loss_sum / n, top1=100.0 * int(hits.sum()) / n,
                top5=100.0 * top5_hits / n if top5 else None, images=int(images), skipped=int(skipped),
                confusion=confusion, class_hits=hits, class_images=counts)


def eval_batches_or_loader(dataset, batched: BatchAugment | None, batch_size: int, num_workers: int,
                           info: DistInfo | None = None, device: torch.device | None = None) -> Iterable:
    """This rank's share of `dataset` in (images, targets, skipped) batches: preprocessed whole (on `device`
    when it is a GPU: the images are kept there) when `batched` is the exact batched form of the evaluation
    transform, else by a DataLoader."""
    world, rank = (info.world_size, info.rank) if info else (1, 0)
    if batched is not None:
        shard = ShardSampler(len(dataset), world, rank)
        return eval_batches(dataset, shard, batch_size, batched, device if is_accelerator(device) else None)
    return eval_loader(dataset, batch_size, data_workers(num_workers), world, rank, is_accelerator(device))


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, a run folder (its best.safetensors), or published weights named as timm names them
    (resmlp_s12.fb_in1k: their file in the cache, resmlp.models.weight_tags)."""
    from resmlp.models.weight_tags import hub_model_file, tagged_weights

    weights = None if Path(path).exists() else (hub_model_file(str(path)) or tagged_weights(str(path)))
    if weights is not None:
        return weights
    path = Path(path)
    if path.is_dir():
        best = path / "best.safetensors"
        if not best.is_file():
            raise FileNotFoundError(f"{path} is a folder without best.safetensors; name a checkpoint file or a "
                                    "finished run folder")
        path = best
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    note_inputs(path)  # an output of this command may not replace it (resmlp.command_files)
    return path


def evaluate(checkpoint: str | Path, data: str | None = None, data_dir: str | Path | None = None,
             split: str | None = None, output: str | Path | None = None, batch_size: int = EVAL_BATCH_SIZE,
             num_workers: int = 2,
             device: str = "auto", amp: str = "auto", plot: bool = True, progress: bool = False,
             announce: Callable[[dict[str, Any]], None] | None = None,
             crop_pct: float | None = None, real_labels: str | Path | None = None,
             valid_labels: str | Path | None = None, results: str | Path | None = None,
             topk: int = 5, use_ema: bool = False, img_size: int | None = None, interpolation: str | None = None,
             torchcompile: str | None = None) -> dict[str, Any]:
    """Accuracy of `checkpoint` (a file or a run folder) on a dataset, with the preprocessing in its metadata.

    data: a source (resmlp.data.sources: folder:DIR, wds:PATTERN, hf:DIR, fashion-mnist, cifar10:DIR...), a
    dataset kind with its folder in `data_dir`, or a folder path (DIR/<split>/<class>/ images); None: the
    dataset the checkpoint was trained on. split:
    train, val or test; None: test where the dataset has one, else val (resmlp.data.heldout_split). With
    `output`, writes OUTPUT/summary.json (keys as a training run's) and OUTPUT/confusion_matrix.png (none with
    plot=False); without it, no file. `announce(summary)` is called before any file is written, so a score
    is shown even when the output folder can't be written. crop_pct: replaces the evaluation crop (the
    preprocessing is resmlp.preprocess.preprocess_of_file's; summary["preprocess_note"] says what was assumed).

    timm validate.py's extras (resmlp.eval_extras): real_labels, ImageNet-ReaL's real.json (summary real_top1,
    real_top5); valid_labels, a file of the model's class indices, one per data class (ImageNet-A/R); results,
    a per-image CSV of each image's `topk` classes and probabilities, written whether or not `output` is given;
    and its model options (resmlp.eval_options): use_ema (the checkpoint's weight EMA), img_size, interpolation,
    torchcompile (a torch.compile backend).
    """
    from resmlp import reporting
    from resmlp.hostinfo import host_info
    from resmlp.inference import load_for_inference

    check_device_name(device)
    extras = EvalExtras.read(real_labels, valid_labels, results, topk)  # the files checked before any work
    checkpoint = resolve_checkpoint(checkpoint)
    # no output may be another, nor an input, the checkpoint included (resmlp.command_files): refused before any work
    claim_outputs({"--results": results} if output is None else
                  {"--results": results, "the summary": Path(output) / "summary.json",
                   "the confusion matrix": Path(output) / "confusion_matrix.png"})
    options: dict[str, Any] = {}
    spec = resolve_data(data, data_dir) if data is not None else None
    if spec is None and data_dir is None:
        spec, options = _run_data(checkpoint)
    from resmlp.eval_options import apply_model_options, ema_checkpoint_key

    key = ema_checkpoint_key(checkpoint) if use_ema else None
    loaded = load_for_inference(checkpoint, dataset=spec.kind if spec else None, crop_pct=crop_pct,
                                checkpoint_key=key)
    apply_model_options(loaded, img_size, interpolation, torchcompile)
    if spec is None:
        if loaded.dataset is None:
            raise ValueError(f"{checkpoint} does not say which dataset it was trained on; pass --data KIND or a "
                             "folder")
        spec = resolve_data(loaded.dataset, data_dir)
    data = spec.kind
    if data == "imagenetv2":  # V2's labels are ImageNet-1k indices: only a 1k model in the 1k order is scored
        from resmlp.data.sources.imagenet_v2 import check_imagenet1k_model

        check_imagenet1k_model(loaded.num_classes, loaded.class_names, checkpoint)
    split = split or heldout_split(spec)
    pre = loaded.preprocess
    dataset = build_dataset(spec, split, None, pre.in_chans, pre.eval_transform(), img_size=pre.img_size, **options)
    names = dataset.class_names
    num_classes = loaded.num_classes
    if extras.valid is not None:
        extras.check_valid(num_classes, len(names))
    elif num_classes != len(names):
        raise ValueError(f"{checkpoint} predicts {num_classes} classes but the {data} dataset has {len(names)}; "
                         "for a subset of its classes pass --valid-labels FILE (ImageNet-A/R)")
    model_names = ([loaded.class_names[i] for i in extras.valid] if loaded.class_names and extras.valid is not None
                   else loaded.class_names)
    if model_names and list(model_names) != list(names) and extras.valid is not None:
        at = next(i for i, (a, b) in enumerate(zip(model_names, names, strict=True)) if a != b)
        raise ValueError(f"--valid-labels {extras.valid_labels}: line {at + 1} names model class {extras.valid[at]} "
                         f"({model_names[at]!r}) for the dataset's class {at} ({names[at]!r}); line i names the "
                         "model class scored as the dataset's class i (the subset as listed: "
                         f"{list(model_names[:5])}...; the dataset's: {list(names[:5])}...)")
    if data == "imagenetv2":
        model_names = None  # checked above against ImageNet-1k's order (its synsets, or the Hub's lemmas)
    if model_names and list(model_names) != list(names):
        raise ValueError(f"{checkpoint} was trained on classes {loaded.class_names[:5]}... but the dataset's "
                         f"are {names[:5]}...; evaluate on the dataset it was trained for")
    torch_device = resolve_device(device)
    precision = resolve_amp(amp, torch_device)
    start = time.perf_counter()
    # the batched form where it is exact, as a training run scores its test split: the same batches give the
    # same number for the same checkpoint, precision and device
    batched = (pre.batched_eval(*dataset.images.shape[1:3])
               if isinstance(dataset, ArrayDataset) else None)
    batches = eval_batches_or_loader(dataset, batched, batch_size, num_workers, device=torch_device)
    if progress:
        from resmlp.progress import progress_bar

        batches = progress_bar(batches, desc=f"eval {data} {split}", unit="batch",
                               total=-(-len(dataset) // batch_size))  # a generator has no len: the ETA needs the total
    result = classify(extras.wrap(loaded.model).to(torch_device), batches, len(names), torch_device, precision)
    scored = (extras.finish(image_files(dataset), dataset_labels(dataset), names, num_classes, result["skipped"])
              if extras.per_image else {})
    confusion, hits, counts = result.pop("confusion"), result.pop("class_hits"), result.pop("class_images")
    per_class = {name: round(100.0 * hits[i] / max(counts[i], 1), 2) for i, name in enumerate(names)}
    # keys named by the split scored (test_top1 as a training run's summary, val_top1...), and top1/top5 whatever it is
    summary = dict(top1=result["top1"], top5=result["top5"], **{f"{split}_top1": result["top1"],
                                                                  f"{split}_top5": result["top5"]},
                   epochs=loaded.metadata.get("epoch"),
                   wall_seconds=round(time.perf_counter() - start, 1), checkpoint=str(checkpoint.resolve()),
                   loss=result["loss"], images=result["images"], skipped_images=result["skipped"],
                   dataset=data, split=split, per_class_top1=per_class, precision=precision_name(precision),
                   device=str(torch_device), batch_size=batch_size, host=host_info(precision),
                   preprocess=dict(pre.to_dict(), source=pre.source), preprocess_note=pre.note or None,
                   valid_labels=str(extras.valid_labels) if extras.valid_labels else None, **scored)
    if announce is not None:
        announce(summary)
    if output is not None:  # only where asked: never beside the checkpoint, whose folder may be read-only
        if plot and confusion is None:
            summary["confusion_matrix"] = (f"not made: {len(names):,} classes make more than the "
                                           f"{MAX_CONFUSION_CELLS:,} cells it may have")
        elif plot:
            png = reporting.plot_confusion_matrix(Path(output) / "confusion_matrix.png", confusion, names)
            summary["confusion_matrix"] = str(png.resolve())
        reporting.write_json(Path(output) / "summary.json", summary)
    return summary


def image_files(dataset: Any) -> list[str] | None:
    """Each image's file (its record's name: a path, a tar member), in the dataset's order; None for a stream.
    In-memory data (Fashion-MNIST, CIFAR) names its images by index."""
    if isinstance(dataset, ArrayDataset):
        return [f"{i:08d}" for i in range(len(dataset))]
    records = getattr(dataset, "records", None)
    if records is None or not hasattr(records, "name") or not hasattr(records, "__getitem__"):
        return None
    return [records.name(i) for i in range(len(records))]


def dataset_labels(dataset: Any) -> list[int]:
    """Each image's label in the dataset's order (read without decoding the images); [] for a stream."""
    labels = getattr(dataset, "labels", None)
    if labels is None:
        labels = getattr(getattr(dataset, "records", None), "labels", [])
    return [int(label) for label in labels]


def _run_data(checkpoint: Path) -> tuple[SourceSpec | None, dict[str, Any]]:
    """(source, options) of the run whose config.json sits next to `checkpoint` (a run's image folder,
    generated data and pixel permutation are in its config, not in the checkpoint): `options` are
    build_dataset's arguments that make the run's own splits; (None, {}) outside a run."""
    from resmlp.errors import ConfigError
    from resmlp.fileio import read_json_object

    config = checkpoint.parent / "config.json"
    run = read_json_object(config, "run config") if config.is_file() else {}
    data, train = run.get("data", {}), run.get("train", {})
    if not isinstance(data, dict) or not isinstance(train, dict):
        raise ConfigError(f"run config {config}: data and train must be objects; restore the file or pass --data "
                          "(and --data-dir)")
    kind, folder, source = data.get("kind"), data.get("dir"), data.get("source")
    if not all(v is None or isinstance(v, str) for v in (kind, folder, source)):
        raise ConfigError(f"run config {config}: data.source, data.kind and data.dir must be strings, got {source!r}, "
                          f"{kind!r} and {folder!r}; restore the file or pass --data (and --data-dir)")
    if not (source or kind):
        return None, {}
    options = {key: data[key] for key in ("synthetic_classes", "permute", "permute_patch", "permute_seed")
               if key in data}
    if "synthetic_size" in data:
        options["synthetic_size"] = tuple(data["synthetic_size"])
    if "seed" in train:
        options["seed"] = train["seed"]
    return spec_from_config(source, kind, folder), options

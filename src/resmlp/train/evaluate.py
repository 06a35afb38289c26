"""Evaluate a saved model on a dataset: top-1/top-5, per-class accuracy, confusion matrix."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from resmlp.checkpoint import load, read_metadata
from resmlp.data import KINDS, Preprocess, build_dataset, build_transform
from resmlp.train import reporting
from resmlp.train.distributed import resolve_device
from resmlp.train.engine import eval_loader, resolve_amp, run_eval


def evaluate(checkpoint: str | Path, data: str = "fashion-mnist", data_dir: str | Path | None = None,
             split: str = "val", output: str | Path | None = None, batch_size: int = 256, num_workers: int = 2,
             device: str = "auto", amp: str = "auto", plot: bool = True) -> dict[str, Any]:
    """Accuracy of `checkpoint` on a dataset, with the preprocessing stored in its metadata.

    data: a dataset kind (fashion-mnist, folder, cifar10, cifar100, synthetic) or a folder path (then
    `folder`, reading DIR/<split>/<class>/ images). With `output`, writes OUTPUT/summary.json (keys as a
    training run's) and OUTPUT/confusion_matrix.png (next to the checkpoint without `output`; none with
    plot=False).
    """
    if data not in KINDS:
        if not Path(data).is_dir():
            raise ValueError(f"--data {data!r} is neither a dataset kind ({', '.join(KINDS)}) nor a folder")
        data, data_dir = "folder", data
    model = load(checkpoint)
    meta = read_metadata(checkpoint)
    pre = Preprocess.from_metadata(meta, model, dataset=data)  # without metadata: the dataset's statistics
    dataset = build_dataset(data, split, data_dir, pre.in_chans, build_transform(pre, training=False),
                            img_size=pre.img_size)
    names = dataset.class_names
    if model.num_classes != len(names):
        raise ValueError(f"{checkpoint} predicts {model.num_classes} classes but the dataset has {len(names)}")
    if meta.get("class_names") and list(meta["class_names"]) != list(names):
        raise ValueError(f"{checkpoint} was trained on classes {meta['class_names'][:5]}... but the dataset's "
                         f"are {names[:5]}...; evaluate on the dataset it was trained for")
    torch_device = resolve_device(device)
    start = time.perf_counter()
    result = run_eval(model.to(torch_device), eval_loader(dataset, batch_size, num_workers), len(names),
                      torch_device, resolve_amp(amp, torch_device))
    confusion = result.pop("confusion")
    per_class = {name: round(100.0 * confusion[i, i] / max(confusion[i].sum(), 1), 2)
                 for i, name in enumerate(names)}
    summary = dict(test_top1=result["top1"], test_top5=result["top5"], epochs=meta.get("epoch"),
                   wall_seconds=round(time.perf_counter() - start, 1), checkpoint=str(Path(checkpoint).resolve()),
                   loss=result["loss"], images=result["images"], skipped_images=result["skipped"],
                   dataset=data, split=split, per_class_top1=per_class)
    if plot:  # next to the checkpoint unless an output folder is given
        png = (Path(output) / "confusion_matrix.png" if output is not None
               else Path(checkpoint).with_name(f"{Path(checkpoint).stem}_confusion_{data}_{split}.png"))
        summary["confusion_matrix"] = str(reporting.plot_confusion_matrix(png, confusion, names).resolve())
    if output is not None:
        reporting.write_json(Path(output) / "summary.json", summary)
    return summary

"""The recipes of the paper's other datasets equal their cited sources, and each runs on a tiny replica of its data in
the released layout: Table 4's transfer recipes (transfer-flowers, -cars, -inat18, -inat19, -cifar100) and Table
3's ImageNet-21k row (in21k-pretrain, in21k-finetune-1k).

Sources: facebookresearch/deit issues #45 (DeiT's CIFAR-10 / Stanford Cars fine-tuning), #105 (DeiT-B on
iNaturalist) and #141 (that lr is "the lr after scaling"), #117 (ResMLP on CIFAR), #106 (ResMLP on ImageNet),
#113 (ResMLP's evaluation crop); DeiT III's README (README_revenge.md: ImageNet-21k training and fine-tuning on
ImageNet-1k, the ViT-B commands); the paper's Table 3; "DeiT main.py default" where those leave a value at DeiT's
default.
"""

from __future__ import annotations

import pytest
from test_paper_datasets import _flowers, _in21k, _inat
from test_recipes_cited import CITED, UNCITED, _comments, _dotted, _raw

import resmlp
from resmlp.train import finetune, train
from resmlp.train.config import load_config

D45, D105, D117, D106, CROP = "deit#45", "deit#105", "deit#117", "deit#106", "deit#113"
DEFAULT, III = "DeiT main.py default", "DeiT III README"
AS_IMAGENET = "the same as for training on ImageNet"
MAIN, STEP = "DeiT main.py", "lr_scheduler.step(epoch) once after each epoch"
SMALL = {  # deit#45's recipe: CIFAR-10 and Stanford Cars (and, with no source of its own, Flowers-102)
    "model.drop_path_rate": (0.0, D45, "We remove random erasing and stochastic depth"),
    "data.crop_pct": (0.875, DEFAULT, "eval resize 256/224 x input size, center crop"),
    "data.interpolation": ("bicubic", DEFAULT, "--train-interpolation bicubic"),
    "data.scale": ([0.08, 1.0], DEFAULT, "timm RandomResizedCrop scale"),
    "data.hflip": (0.5, DEFAULT, "timm hflip"),
    "data.color_jitter": (0.0, DEFAULT, "0.4, unused by timm when RandAugment is on"),
    "data.auto_augment": ("rand-m9-mstd0.5-inc1", D45, AS_IMAGENET),
    "data.reprob": (0.0, D45, "We remove random erasing"),
    "data.mixup": (0.8, D45, AS_IMAGENET),
    "data.cutmix": (1.0, D45, AS_IMAGENET),
    "data.repeated_aug": (3, D45, AS_IMAGENET),
    "optim.name": ("sgd", D45, "optimizer: SGD"),
    "optim.lr": (0.01, D45, "lr: 0.01"),
    "optim.reference_batch": (768, D45, "Batch size: 768"),
    "optim.momentum": (0.9, DEFAULT, "--momentum 0.9"),
    "optim.weight_decay": (1e-4, D45, "weight-decay: 1e-4"),
    "schedule.name": ("cosine", D45, AS_IMAGENET),
    "schedule.epochs": (1000, D45, "epochs: 1000"),
    "schedule.warmup_epochs": (5, DEFAULT, "--warmup-epochs 5"),
    "schedule.warmup_lr": (1e-6, DEFAULT, "--warmup-lr 1e-6"),
    "schedule.min_lr": (1e-5, DEFAULT, "--min-lr 1e-5"),
    "schedule.step_on": ("epoch", MAIN, STEP),
    "loss.label_smoothing": (0.1, DEFAULT, "--smoothing 0.1"),
    "train.batch_size": (768, D45, "Batch size: 768"),
    "train.amp": ("fp32", D117, "Remove mixed precision: True"),
}
INAT = {
    "model.drop_path_rate": (0.1, D105, "Stochastic Depth:0.1"),
    "data.crop_pct": (0.875, DEFAULT, "eval resize 256/224 x input size, center crop"),
    "data.interpolation": ("bicubic", DEFAULT, "--train-interpolation bicubic"),
    "data.scale": ([0.08, 1.0], DEFAULT, "timm RandomResizedCrop scale"),
    "data.hflip": (0.5, DEFAULT, "timm hflip"),
    "data.color_jitter": (0.0, DEFAULT, "0.4, unused by timm when RandAugment is on"),
    "data.auto_augment": ("rand-m9-mstd0.5-inc1", D105, "RandAugment: rand-m9-mstd0.5-inc1"),
    "data.reprob": (0.1, D105, "Erasing: 0.1"),
    "data.mixup": (0.8, D105, "Mixup: 0.8"),
    "data.cutmix": (1.0, D105, "CutMix: 1.0"),
    "data.repeated_aug": (3, D105, "Repeated augmentation: True"),
    "optim.name": ("adamw", D105, "Optimizer: AdamW"),
    "optim.lr": (7.5e-5, D105, "LR: 7.5e-5 (deit#141: the lr after scaling)"),
    "optim.reference_batch": (768, D105, "Batch size: 768"),
    "optim.weight_decay": (0.05, D105, "Weight decay 0.05"),
    "schedule.name": ("cosine", D105, "Scheduler: cosine"),
    "schedule.epochs": (360, D105, "epochs: 360"),
    "schedule.warmup_epochs": (5, D105, "Warmup: 5 epochs"),
    "schedule.warmup_lr": (1e-6, DEFAULT, "--warmup-lr 1e-6"),
    "schedule.min_lr": (1e-5, DEFAULT, "--min-lr 1e-5"),
    "schedule.step_on": ("epoch", MAIN, STEP),
    "loss.label_smoothing": (0.1, D105, "Smoothing: 0.1"),
    "train.batch_size": (768, D105, "Batch size: 768"),
    "train.amp": ("fp32", D117, "Remove mixed precision: True"),
}
DEIT3 = {  # DeiT III README, ViT-B on ImageNet-21k (and its fine-tuning on ImageNet-1k where noted)
    "data.interpolation": ("bicubic", DEFAULT, "--train-interpolation bicubic"),
    "data.scale": ([0.08, 1.0], DEFAULT, "timm RandomResizedCrop scale (--src not implemented)"),
    "data.hflip": (0.5, DEFAULT, "timm hflip"),
    "data.color_jitter": (0.3, III, "--color-jitter 0.3"),
    "data.auto_augment": (None, III, "--ThreeAugment, no RandAugment"),
    "data.reprob": (0.0, III, "--reprob 0.0"),
    "data.mixup": (0.0, III, "--mixup 0"),
    "data.cutmix": (1.0, III, "--cutmix 1.0"),
    "data.repeated_aug": (0, III, "--no-repeated-aug"),
    "optim.name": ("lamb", III, "--opt fusedlamb"),
    "optim.reference_batch": (2048, III, "--batch 64 on 4 nodes x 8 GPUs, --unscale-lr"),
    "optim.weight_decay": (0.02, III, "--weight-decay 0.02"),
    "schedule.name": ("cosine", III, "--sched cosine"),
    "schedule.warmup_epochs": (5, III, "--warmup-epochs 5"),
    "schedule.warmup_lr": (1e-6, III, "--warmup-lr 1e-6"),
    "schedule.min_lr": (1e-5, DEFAULT, "--min-lr 1e-5"),
    "schedule.step_on": ("epoch", "DeiT III main.py", STEP),
    "loss.label_smoothing": (0.1, III, "--smoothing 0.1"),
    "train.batch_size": (2048, III, "--batch 64 on 4 nodes x 8 GPUs"),
    "train.amp": ("fp32", D106, "FP16: False"),
}
RECIPES: dict[str, dict[str, tuple[object, str, str]]] = {
    "transfer-cars": {**SMALL, "data.val_size": (800, "ours", "10 % of 8,144 held out for model selection")},
    "transfer-flowers": SMALL,
    "transfer-inat18": INAT,
    "transfer-inat19": INAT,
    "transfer-cifar100": CITED["cifar-finetune"],
    "in21k-pretrain": {
        **DEIT3,
        "model.name": ("resmlp_b24_p8", "Table 3", "ResMLP-B24/8 pre-trained ImageNet-21k"),
        "model.img_size": (224, "Table 3", "224x224"),
        "model.drop_path_rate": (0.1, III, "--drop-path 0.1"),
        "data.crop_pct": (0.875, DEFAULT, "--eval-crop-ratio 0.875"),
        "optim.lr": (0.001, III, "--lr 0.001"),
        "schedule.epochs": (60, "Table 3", "pre-trained ImageNet-21k (60 epochs)"),
    },
    "in21k-finetune-1k": {
        **DEIT3,
        "model.drop_path_rate": (0.15, III, "--drop-path 0.15"),
        "data.crop_pct": (0.9, CROP, "crop-ratio of 0.9 at test time"),
        "optim.lr": (3e-4, III, "--lr 0.0003"),
        "schedule.epochs": (50, III, "--epochs 50"),
    },
}
KINDS = {"transfer-cars": "stanford-cars", "transfer-flowers": "flowers102", "transfer-inat18": "inat2018",
         "transfer-inat19": "inat2019", "transfer-cifar100": "cifar100", "in21k-pretrain": "imagenet21k",
         "in21k-finetune-1k": "folder"}


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_value_equals_its_cited_source_and_names_it(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr("resmlp.runtime.physical_memory_bytes", lambda: 2**40)  # sized for GPU machines
    raw, comments = _dotted(_raw(recipe)), _comments(recipe)
    cfg = load_config(recipe, {"data.dir": str(tmp_path)}).to_dict()  # and the values validate as typed
    for key, (value, source, says) in RECIPES[recipe].items():
        assert key in raw, f"{recipe}: {key} is cited ({source}: {says}) but not set in the recipe"
        assert raw[key] == value, f"{recipe}: {key} is {raw[key]!r}, {source} says {says!r} ({value!r})"
        section, _, name = key.partition(".")
        assert cfg[section][name] == value
        assert source in comments.get(key, ""), f"{recipe}: the comment of {key} does not name {source}"
    uncited = sorted(set(raw) - set(RECIPES[recipe]) - UNCITED)
    assert not uncited, f"{recipe}: {uncited} have no cited source here"
    assert raw["data.kind"] == KINDS[recipe]
    assert "no source" in _text(recipe).lower() or recipe in ("transfer-cifar100",) or "paper gives" in _text(recipe)


def _text(recipe: str) -> str:
    from importlib import resources

    return (resources.files("resmlp") / "recipes" / f"{recipe}.yaml").read_text()


SIZES = {"schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 2, "data.num_workers": 0,
         "train.compile": False, "train.threads": 1, "train.progress": False, "train.device": "cpu"}


def _checkpoint(tmp_path) -> str:
    model = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=16, depth=1, num_classes=7)
    return str(resmlp.save(model, tmp_path / "imagenet.safetensors"))


@pytest.mark.parametrize(("recipe", "make", "extra"), [
    ("transfer-flowers", lambda root: _flowers(root), {}),
    ("transfer-inat18", lambda root: _inat(root, 2018, categories_json=True), {}),
    ("transfer-inat19", lambda root: _inat(root, 2019, deit_layout=True), {}),
])
def test_each_transfer_recipe_finetunes_from_its_released_layout(tmp_path, recipe, make, extra):
    """The recipe as shipped (its augmentation, optimizer, precision), one short epoch of a tiny checkpoint on a
    tiny replica: only the sizes are overridden."""
    data = make(tmp_path / "data")
    summary = finetune(_checkpoint(tmp_path), recipe, tmp_path / "run", overrides={**SIZES, "data.dir": str(data),
                                                                                    **extra})
    assert summary["epochs"] == 1 and summary["val_top1"] is not None
    assert summary["lr"] == pytest.approx(RECIPES[recipe]["optim.lr"][0] * 2 / 768)  # the authors' lr, scaled
    meta = resmlp.read_metadata(summary["checkpoint"])
    assert len(meta["class_names"]) == 3 and meta["preprocess"]["crop_pct"] == 0.875


def test_transfer_cars_finetunes_from_the_devkit(tmp_path):
    from test_paper_datasets import _cars

    data = _cars(tmp_path / "cars")
    summary = finetune(_checkpoint(tmp_path), "transfer-cars", tmp_path / "run",
                       overrides={**SIZES, "data.dir": str(data), "data.val_size": 3})
    assert summary["epochs"] == 1 and summary["test_top1"] is not None
    assert resmlp.read_metadata(summary["checkpoint"])["class_names"][0] == "AM General Hummer SUV 2000"


def test_in21k_pretrain_then_finetune_to_1k(tmp_path):
    """in21k-pretrain on a 3-class ImageNet-21k replica (the download's tar of class tars), then in21k-finetune-1k
    of its checkpoint on an ImageNet folder: the two halves of Table 3's ImageNet-21k row, tiny."""
    from test_paper_datasets import _jpeg, _write

    data = _in21k(tmp_path / "in21k", "download")
    tiny = {**SIZES, "model.name": "resmlp_s12", "model.img_size": 32, "model.patch_size": 8, "model.dim": 16,
            "model.depth": 1, "data.val_size": 3}
    summary = train("in21k-pretrain", tmp_path / "pre", overrides={**tiny, "data.dir": str(data)})
    assert summary["epochs"] == 1 and summary["lr"] == pytest.approx(0.001 * 2 / 2048)
    imagenet = tmp_path / "imagenet"
    for split, count in (("train", 6), ("val", 2)):
        for c in ("n01440764", "n01443537"):
            for i in range(count):
                _write(imagenet / split / c / f"{i}.JPEG", _jpeg(i))
    tuned = finetune(summary["checkpoint"], "in21k-finetune-1k", tmp_path / "ft",
                     overrides={**SIZES, "data.dir": str(imagenet)})
    meta = resmlp.read_metadata(tuned["checkpoint"])
    assert tuned["epochs"] == 1 and meta["class_names"] == ["n01440764", "n01443537"]
    assert meta["preprocess"]["crop_pct"] == 0.9

"""The paper's recipes equal their sources: every value of `deit`, `cifar-finetune` and `old-fashioned` is checked
against a table of cited values, and each recipe line names that source in its comment.

Sources: the paper (section 3.1, Table 3, Table D.1), [23] (He et al., the ResNet paper the "old-fashioned" recipe
follows), the first author's answers in facebookresearch/deit issues #106 (ImageNet) and #117 (CIFAR), deit's
README_resmlp.md / issue #113 (evaluation crop 0.9), and "DeiT main.py default" for a value the authors left at
the default of the DeiT training code (#106: "the hparams are similar to the default setting used in DeiT").
"""

from __future__ import annotations

import pickle
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
import yaml

import resmlp
from resmlp.train import finetune
from resmlp.train.config import load_config

D106, D117, CROP = "deit#106", "deit#117", "deit#113"
DEIT_DEFAULT = "DeiT main.py default"

# recipe -> dotted key -> (value, source named in the key's comment, what the source says)
CITED: dict[str, dict[str, tuple[object, str, str]]] = {
    "deit": {
        "model.img_size": (224, D106, "input size: 224"),
        "model.drop_path_rate": (0.05, D106, "Stochastic Depth: 0.05"),
        "data.crop_pct": (0.9, CROP, "crop-ratio of 0.9 at test time"),
        "data.interpolation": ("bicubic", "README_resmlp", "transforms.Resize(..., interpolation=3)"),
        "data.scale": ([0.08, 1.0], DEIT_DEFAULT, "timm RandomResizedCrop scale"),
        "data.hflip": (0.5, DEIT_DEFAULT, "timm hflip"),
        "data.color_jitter": (0.0, DEIT_DEFAULT, "0.4, unused by timm when RandAugment is on"),
        "data.auto_augment": ("rand-m9-mstd0.5-inc1", D106, "Rand Augment: rand-m9-mstd0.5-inc1"),
        "data.reprob": (0.25, D106, "Erasing: 0.25"),
        "data.mixup": (0.8, D106, "Mixup .8"),
        "data.cutmix": (1.0, D106, "Cutmix 1.0"),
        "data.repeated_aug": (3, D106, "Repeated augmentation: True (RASampler, 3 repeats)"),
        "data.num_workers": (10, DEIT_DEFAULT, "--num_workers 10"),
        "optim.name": ("lamb", D106, "Optimizer: lamb"),
        "optim.lr": (5e-3, D106, "lr: 5e-3"),
        "optim.reference_batch": (2048, D106, "Batch size: 2048"),
        "optim.weight_decay": (0.2, D106, "weight-decay: 0.2"),
        "optim.eps": (1e-8, DEIT_DEFAULT, "--opt-eps 1e-8"),
        "schedule.name": ("cosine", D106, "sched: cosine"),
        "schedule.epochs": (400, D106, "epochs: 400"),
        "schedule.warmup_epochs": (5, D106, "Warmup epochs: 5"),
        "schedule.warmup_lr": (1e-6, DEIT_DEFAULT, "--warmup-lr 1e-6"),
        "schedule.min_lr": (1e-5, DEIT_DEFAULT, "--min-lr 1e-5"),
        "schedule.step_on": ("epoch", "DeiT main.py", "lr_scheduler.step(epoch) after each epoch"),
        "loss.label_smoothing": (0.1, D106, "smoothing: 0.1"),
        "train.batch_size": (2048, D106, "Batch size: 2048"),
        "train.amp": ("fp32", D106, "FP16: False"),
        "train.clip_grad": (None, DEIT_DEFAULT, "--clip-grad None"),
        # DeiT main.py keeps an EMA by default but scores and saves as `model` the raw weights: those are scored here
        "train.ema": (False, "DeiT main.py", "evaluate(data_loader_val, model, device); checkpoint['model']"),
    },
    "cifar-finetune": {
        "model.drop_path_rate": (0.05, D117, "drop-path: 0.1 (for 24) / 0.05 (for 12)"),
        "data.kind": ("cifar100", D117, "CIFAR-10 and CIFAR-100"),
        "data.crop_pct": (0.875, DEIT_DEFAULT, "eval resize 256/224 x input size, center crop"),
        "data.interpolation": ("bicubic", DEIT_DEFAULT, "--train-interpolation bicubic"),
        "data.scale": ([0.08, 1.0], DEIT_DEFAULT, "timm RandomResizedCrop scale"),
        "data.hflip": (0.5, DEIT_DEFAULT, "timm hflip"),
        "data.color_jitter": (0.0, DEIT_DEFAULT, "0.4, unused by timm when RandAugment is on"),
        "data.auto_augment": ("rand-m9-mstd0.5-inc1", D117, "RandAugment: rand-m9-mstd0.5-inc1"),
        "data.reprob": (0.25, DEIT_DEFAULT, "--reprob 0.25"),
        "data.mixup": (0.8, D117, "Mixup: .8"),
        "data.cutmix": (1.0, D117, "Cutmix: 1.0"),
        "data.repeated_aug": (3, D117, "Repeated Aug: True (RASampler, 3 repeats)"),
        "data.num_workers": (10, DEIT_DEFAULT, "--num_workers 10"),
        "optim.name": ("adamw", D117, "optimizer: Adamw"),
        "optim.lr": (5e-6, D117, "lr: 5e-6"),
        "optim.reference_batch": (768, D117, "global batch size: 768"),
        "optim.weight_decay": (0.05, D117, "weight-decay: 0.05"),
        "schedule.name": ("cosine", D117, "sched cosine"),
        "schedule.epochs": (1000, D117, "epochs: 1000"),
        "schedule.warmup_epochs": (5, D117, "warmup epochs: 5"),
        "schedule.warmup_lr": (1e-6, D117, "Warmup LR: 1e-6"),
        "schedule.min_lr": (1e-5, D117, "We have not changed the default value for min-lr"),
        "schedule.step_on": ("epoch", "DeiT main.py", "lr_scheduler.step(epoch) after each epoch"),
        "loss.label_smoothing": (0.1, D117, "Label smoothing: 0.1"),
        "train.batch_size": (768, D117, "global batch size: 768"),
        "train.amp": ("fp32", D117, "Remove mixed precision: True"),
    },
    "old-fashioned": {
        "model.name": ("resmlp_s12", "Table D.1", "ResMLP-S12"),
        "model.img_size": (224, "Table 3", "224x224"),
        "model.drop_path_rate": (0.0, "Table D.1", "- Stochastic-depth"),
        "data.crop_pct": (0.9, CROP, "crop-ratio of 0.9 at test time"),
        "data.interpolation": ("bicubic", "README_resmlp", "interpolation=3"),
        "data.scale": ([0.08, 1.0], "[23]", "scale augmentation"),
        "data.hflip": (0.5, "[23]", "horizontal flip"),
        "data.auto_augment": (None, "Table D.1", "- RandAugment"),
        "data.reprob": (0.0, "Table D.1", "- Random-erasing"),
        "data.mixup": (0.0, "Table D.1", "- CutMix - Mixup"),
        "data.cutmix": (0.0, "Table D.1", "- CutMix - Mixup"),
        "data.repeated_aug": (0, "Table D.1", "- Repeated-augmentation"),
        "optim.name": ("sgd", "Table D.1", "SGD optimizer"),
        "optim.lr": (0.1, "[23]", "learning rate starts from 0.1"),
        "optim.reference_batch": (256, "Table D.1", "Batch size 256"),
        "optim.momentum": (0.9, "[23]", "momentum of 0.9"),
        "optim.weight_decay": (1e-4, "[23]", "weight decay of 0.0001"),
        "schedule.name": ("step", "Table D.1", "Step decay"),
        "schedule.epochs": (90, "Table D.1", "ResNet-50 training 90 epochs"),
        "schedule.warmup_epochs": (0, "[23]", "no warm-up"),
        "schedule.decay_epochs": (30, "[23]", "divided by 10 (at 30 and 60 of 90 epochs)"),
        "schedule.decay_rate": (0.1, "[23]", "divided by 10"),
        "loss.label_smoothing": (0.0, "[23]", "plain cross-entropy"),
        "train.batch_size": (256, "Table D.1", "Batch size 256"),
        "train.amp": ("fp32", D106, "FP16: False"),
    },
}
DEIT_README, DINO = "DeiT README", "DINO default"
# DINO's README, "Boosting DINO performance": the 300-epoch ViT-S/16 run (73.3 % k-NN against 69.3 % for the
# 100-epoch code defaults), `--epochs 300 --teacher_temp 0.07 --warmup_teacher_temp_epochs 30 --norm_last_layer false`
DINO300 = "DINO 300-ep"
CITED["deit-distill"] = {
    **CITED["deit"],
    "distill.teacher": ("timm:regnety_160", "paper 3.1", "the same RegNety-16GF as in DeiT"),
    "distill.type": ("hard", "Appendix A", "hard-distillation"),
    "distill.weights": (None, DEIT_README, "--teacher-path .../regnety_160-a5fe301d.pth (the user's download)"),
}
CITED["dino-imagenet"] = {
    "model.name": ("resmlp_s12", "paper 3.2", "We pre-train ResMLP-S12"),
    "model.img_size": (224, DINO, "global crops of 224"),
    "model.drop_path_rate": (0.1, DINO, "--drop_path_rate 0.1"),
    "data.crop_pct": (0.875, DINO, "eval_knn.py: resize 256, center crop 224"),
    "optim.name": ("adamw", DINO, "--optimizer adamw"),
    "optim.lr": (5e-4, DINO, "--lr 0.0005"),
    "optim.reference_batch": (256, DINO, "lr for a reference batch size of 256"),
    "optim.weight_decay": (0.04, DINO, "--weight_decay 0.04"),
    "schedule.name": ("cosine", DINO, "cosine_scheduler"),
    "schedule.epochs": (300, "paper 3.2", "during 300 epochs"),
    "schedule.warmup_epochs": (10, DINO, "--warmup_epochs 10"),
    "schedule.warmup_lr": (0.0, DINO, "linear warm-up from 0"),
    "schedule.min_lr": (1e-6, DINO, "--min_lr 1e-6"),
    "dino.out_dim": (65536, DINO, "--out_dim 65536"),
    "dino.hidden_dim": (2048, DINO, "DINOHead hidden_dim 2048"),
    "dino.bottleneck_dim": (256, DINO, "DINOHead bottleneck_dim 256"),
    "dino.norm_last_layer": (False, DINO300, "--norm_last_layer false"),
    "dino.num_local": (8, DINO, "--local_crops_number 8"),
    "dino.global_scale": ([0.4, 1.0], DINO, "--global_crops_scale 0.4 1."),
    "dino.local_scale": ([0.05, 0.4], DINO, "--local_crops_scale 0.05 0.4"),
    "dino.local_size": (96, DINO, "local crops of 96 px"),
    "dino.teacher_temp": (0.07, DINO300, "--teacher_temp 0.07"),
    "dino.warmup_teacher_temp": (0.04, DINO, "--warmup_teacher_temp 0.04"),
    "dino.warmup_teacher_temp_epochs": (30, DINO300, "--warmup_teacher_temp_epochs 30"),
    "dino.student_temp": (0.1, DINO, "DINOLoss student_temp 0.1"),
    "dino.center_momentum": (0.9, DINO, "DINOLoss center_momentum 0.9"),
    "dino.momentum_teacher": (0.996, DINO, "--momentum_teacher 0.996"),
    "dino.weight_decay_end": (0.4, DINO, "--weight_decay_end 0.4"),
    "dino.freeze_last_layer_epochs": (1, DINO, "--freeze_last_layer 1"),
    "train.batch_size": (1024, DINO, "--batch_size_per_gpu 64 on 2 nodes x 8 GPUs"),
    "train.clip_grad": (3.0, DINO, "--clip_grad 3.0"),
    "train.clip_mode": ("per_param", "DINO utils.clip_gradients", "each parameter's grad norm clipped to clip"),
    "schedule.warmup_prefix": (True, "DINO utils.cosine_scheduler", "cosine over the iterations after warm-up"),
    "train.amp": ("auto", DINO, "--use_fp16 True (mixed precision)"),
}
# keys that are not hyper-parameters of the method (where the data is, how many loader workers, how often to save,
# the preset a fine-tuning run replaces by its checkpoint) or that are off and not stated (EMA): no citation needed
UNCITED = {"model.name", "data.kind", "data.num_workers", "data.pipeline", "train.checkpoint_every_steps", "train.ema",
           "train.ema_decay"}


def _raw(recipe: str) -> dict:
    return yaml.safe_load(_text(recipe))


def _text(recipe: str) -> str:
    return (resources.files("resmlp") / "recipes" / f"{recipe}.yaml").read_text()


def _dotted(raw: dict) -> dict[str, object]:
    return {f"{section}.{key}": value for section, values in raw.items() if isinstance(values, dict)
            for key, value in values.items()}


def _comments(recipe: str) -> dict[str, str]:
    """dotted key -> the comment on its line plus the comment-only lines indented under it."""
    comments: dict[str, str] = {}
    section = last = None
    for line in _text(recipe).splitlines():
        body, _, comment = line.partition("#")
        if not line.startswith(" ") and body.strip().endswith(":"):
            section, last = body.strip()[:-1], None
        elif section and body.strip():
            last = f"{section}.{body.strip().split(':')[0]}"
            comments[last] = comment
        elif last and not body.strip() and comment:
            comments[last] += " " + comment
    return comments


@pytest.mark.parametrize("recipe", sorted(CITED))
def test_every_value_equals_its_cited_source(recipe, tmp_path, monkeypatch):
    # the ImageNet recipes are sized for GPU machines: their values are what is checked here, not this host's memory
    monkeypatch.setattr("resmlp.runtime.physical_memory_bytes", lambda: 2**40)
    raw = _dotted(_raw(recipe))
    cfg = load_config(recipe, {"data.dir": str(tmp_path)}).to_dict()  # and the values validate as typed
    for key, (value, source, says) in CITED[recipe].items():
        assert key in raw, f"{recipe}: {key} is cited ({source}: {says}) but not set in the recipe"
        assert raw[key] == value, f"{recipe}: {key} is {raw[key]!r}, {source} says {says!r} ({value!r})"
        section, _, name = key.partition(".")
        assert cfg[section][name] == value


@pytest.mark.parametrize("recipe", sorted(CITED))
def test_every_value_is_cited_and_names_its_source(recipe):
    raw, comments = _dotted(_raw(recipe)), _comments(recipe)
    uncited = sorted(set(raw) - set(CITED[recipe]) - UNCITED)
    assert not uncited, f"{recipe}: {uncited} have no cited source in tests/test_recipes_cited.py"
    for key, (_, source, _) in CITED[recipe].items():
        assert source in comments.get(key, ""), f"{recipe}: the comment of {key} does not name {source}"


def test_the_lr_belongs_to_the_authors_global_batch():
    """The lr is scaled from the batch the authors trained with, so at that batch it is theirs unchanged."""
    for recipe, batch in (("deit", 2048), ("cifar-finetune", 768), ("old-fashioned", 256)):
        raw = _raw(recipe)
        assert raw["optim"]["reference_batch"] == raw["train"]["batch_size"] == batch


def _cifar100(root: Path, n_train: int = 16, n_test: int = 8, classes: int = 5) -> Path:
    """A tiny CIFAR-100 in the python-pickle layout of the original (protocol 2, bytes keys)."""
    base = root / "cifar-100-python"
    base.mkdir(parents=True)
    rng = np.random.default_rng(0)
    with open(base / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"class{i}".encode() for i in range(classes)]}, f, protocol=2)
    for name, n in (("train", n_train), ("test", n_test)):
        labels = [i % classes for i in range(n)]
        with open(base / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), b"fine_labels": labels,
                         b"coarse_labels": [0] * n}, f, protocol=2)
    return root


def test_cifar_finetune_runs_on_the_python_layout(tmp_path):
    """The recipe as shipped (RandAugment, Mixup/CutMix, repeated augmentation, erasing, AdamW, fp32), one short
    epoch of a tiny checkpoint on a tiny CIFAR-100: only the sizes are overridden."""
    data = _cifar100(tmp_path / "data", n_train=21)
    source = resmlp.create_model("resmlp_s12", img_size=32, patch_size=8, dim=32, depth=2, num_classes=7)
    ckpt = tmp_path / "imagenet.safetensors"
    resmlp.save(source, ckpt)
    small = {"data.dir": str(data), "schedule.epochs": 2, "schedule.warmup_epochs": 1, "train.batch_size": 8,
             "data.num_workers": 0, "train.compile": False, "train.threads": 1, "train.progress": False,
             "data.val_size": 5}  # validation carved from the 21 training images (the recipe: 5,000 of 50,000)
    summary = finetune(ckpt, "cifar-finetune", tmp_path / "run", overrides=small)
    assert summary["epochs"] == 2
    assert summary["lr"] == pytest.approx(5e-6 * 8 / 768)  # the authors' lr, scaled to this batch
    model, meta = resmlp.load(summary["checkpoint"]), resmlp.read_metadata(summary["checkpoint"])
    assert model.head.out_features == 5 and meta["class_names"][4] == "class4"  # the new head: CIFAR's classes
    assert meta["preprocess"]["crop_pct"] == 0.875 and meta["preprocess"]["img_size"] == 32


@pytest.mark.parametrize(("val_size", "train_images", "validation"), [(5, 16, "carved from train"),
                                                                      (0, 21, "the test split")])
def test_cifar_finetune_trains_on_all_images_with_val_size_0(tmp_path, val_size, train_images, validation):
    """The recipe's header names --set data.val_size=0 as the way to train on every training image, as DeiT did
    (the test split becomes the per-epoch metric); the default holds images out for model selection."""
    from resmlp.data.loading.assemble import build_data

    data = _cifar100(tmp_path / "data", n_train=21)
    cfg = load_config("cifar-finetune", {"data.dir": str(data), "data.val_size": val_size, "data.num_workers": 0})
    run = build_data(cfg.data, in_chans=3, img_size=32, seed=0)
    assert len(run.train) == train_images and validation in run.validation
    assert "data.val_size=0" in _text("cifar-finetune")

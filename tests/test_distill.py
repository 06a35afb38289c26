"""Distillation: the formulas, a frozen teacher, loss going down, teachers of every origin, bad teachers."""

from __future__ import annotations

import hashlib
import math

import pytest
import timm
import torch
import torch.nn.functional as F

import resmlp
from resmlp.cli import main
from resmlp.runtime import DistInfo
from resmlp.train import train
from resmlp.train.config import load_config
from resmlp.train.losses import (
    DistillationLoss,
    hard_distillation_loss,
    soft_distillation_loss,
    supervised_loss,
)
from resmlp.train.task_registry import task_for
from resmlp.train.trainer import Trainer

TINY = {
    "data.kind": "synthetic", "data.hflip": 0.0, "data.scale": [1.0, 1.0], "data.ratio": [1.0, 1.0],
    "data.num_workers": 0, "data.crop_pct": 1.0, "model.img_size": 16, "model.patch_size": 4, "model.dim": 32,
    "model.depth": 2, "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 16,
    "train.progress": False, "optim.lr": 3e-3, "data.synthetic_size": [64, 32], "train.threads": 1,
}
SYNTHETIC_NAMES = [f"class_{i}" for i in range(4)]  # the synthetic data's classes, in order


def test_hard_and_soft_formulas_match_a_hand_computation():
    student = torch.tensor([[2.0, 0.0, -1.0], [0.5, 1.5, 0.0]])
    teacher = torch.tensor([[0.0, 3.0, 0.0], [1.0, 0.0, 0.0]])  # argmax 1, 0
    labels = torch.tensor([0, 1])
    base = F.cross_entropy(student, labels)

    def log_softmax(row, t=1.0):
        z = [v / t for v in row]
        lse = math.log(sum(math.exp(v) for v in z))
        return [v - lse for v in z]

    s, t = student.tolist(), teacher.tolist()
    ce_teacher = -(log_softmax(s[0])[1] + log_softmax(s[1])[0]) / 2
    assert hard_distillation_loss(student, teacher, base).item() == pytest.approx(0.5 * base.item() + 0.5 * ce_teacher)
    tau, alpha = 2.0, 0.3
    kl = 0.0
    for srow, trow in zip(s, t, strict=True):
        ls, lt = log_softmax(srow, tau), log_softmax(trow, tau)
        kl += sum(math.exp(b) * (b - a) for a, b in zip(ls, lt, strict=True))
    # DeiT's losses.py: kl_div(..., reduction='sum') * T * T / outputs_kd.numel(), i.e. over batch x classes
    expected = (1 - alpha) * base.item() + alpha * tau**2 * kl / student.numel()
    assert student.numel() == 2 * len(s[0]) > 2
    assert soft_distillation_loss(student, teacher, base, alpha, tau).item() == pytest.approx(expected, rel=1e-5)


def test_teacher_gets_no_gradient_sees_mixed_images_and_student_learns():
    cfg = load_config("fashion-mnist-quick", {**TINY, "data.mixup": 0.8})
    torch.manual_seed(0)
    teacher = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1)
    student = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    seen, student_seen = [], []
    teacher.register_forward_pre_hook(lambda m, args: seen.append(args[0].clone()))
    student.register_forward_pre_hook(lambda m, args: student_seen.append(args[0].clone()))
    loss_fn = DistillationLoss(supervised_loss(cfg, 4), teacher, "hard")
    images, labels = torch.randn(8, 1, 16, 16), torch.arange(8) % 4
    opt = torch.optim.AdamW(student.parameters(), lr=1e-2)
    losses = []
    for _ in range(8):
        loss = loss_fn(student, images.clone(), labels)  # timm's Mixup mixes in place
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    assert all(torch.equal(before[k], v) for k, v in teacher.state_dict().items())
    assert not teacher.training
    # the teacher saw the mixed batch the student saw, not the original images
    assert all(torch.equal(t, s) for t, s in zip(seen, student_seen, strict=True))
    assert not any(torch.equal(x, images) for x in seen)


def test_convnet_teacher_trained_by_the_engine_then_distilled_from_the_cli(tmp_path):
    teacher_run = train("fashion-mnist-teacher", tmp_path / "teacher",
                        {**{k: v for k, v in TINY.items() if not k.startswith("model.")},
                         "model.name": "timm:resnet10t", "model.img_size": 16, "model.in_chans": 1,
                         "train.amp": "none"})  # bf16 autocast broke this tiny convnet's weights on some steps
    teacher = resmlp.load(teacher_run["checkpoint"])
    assert isinstance(teacher, timm.models.ResNet) and teacher.num_classes == 4
    out = tmp_path / "student"
    args = ["train", "--recipe", "fashion-mnist-distill", "--output", str(out), "--distill", teacher_run["checkpoint"],
            "--distill-type", "soft", "--distill-tau", "2"] + [f"--set={k}={v}" for k, v in TINY.items()]
    assert main(args) == 0
    cfg = (out / "config.json").read_text()
    assert '"type": "soft"' in cfg and '"tau": 2.0' in cfg
    assert (out / "best.safetensors").is_file()


@pytest.mark.parametrize("teacher", ["timm:resnet10t", "torchvision:resnet18"])
def test_library_teachers_and_class_count_mismatch(tmp_path, teacher):
    # a library teacher without weights is refused unless random weights are asked for explicitly
    with pytest.raises(ValueError, match="has no weights.*--allow-random-teacher"):
        train("fashion-mnist-quick", tmp_path / "random", {**TINY, "distill.teacher": teacher})
    ok = train("fashion-mnist-quick", tmp_path / "ok", {**TINY, "distill.teacher": teacher,
                                                        "distill.allow_random_teacher": True,
                                                        "data.synthetic_size": [16, 16]})
    assert ok["epochs"] == 1 and ok["task"] == "distillation"
    assert ok["teacher"]["spec"] == teacher and ok["teacher"]["weights"] is None
    assert 0 <= ok["teacher"]["val_top1"] <= 100
    # weights of a 10-class teacher do not fit the 4-class dataset: an error before any step
    net = (timm.create_model("resnet10t", num_classes=10, in_chans=1) if teacher.startswith("timm")
           else __import__("torchvision").models.resnet18(num_classes=10))
    torch.save(net.state_dict(), tmp_path / "w.pth")
    with pytest.raises(ValueError, match="dataset's"):
        train("fashion-mnist-quick", tmp_path / "bad", {**TINY, "distill.teacher": teacher,
                                                         "distill.weights": str(tmp_path / "w.pth")})
    assert not (tmp_path / "bad" / "last.pth").exists()


def test_checkpoint_teacher_with_wrong_class_count_is_refused_before_training(tmp_path, capsys):
    wrong = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=7, dim=16, depth=1)
    resmlp.save(wrong, tmp_path / "t.safetensors")
    args = ["train", "--output", str(tmp_path / "run"), "--distill", str(tmp_path / "t.safetensors")]
    assert main(args + [f"--set={k}={v}" for k, v in TINY.items()]) == 2
    err = capsys.readouterr().err
    assert "predicts 7 classes but the dataset has 4" in err
    assert not (tmp_path / "run" / "last.pth").exists()


def test_teacher_cache_runs_the_teacher_once_per_distinct_image_and_changes_nothing():
    cfg = load_config("fashion-mnist-quick", TINY)
    torch.manual_seed(0)
    teacher = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1)
    student = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1)
    plain = DistillationLoss(supervised_loss(cfg, 4), teacher, "soft", alpha=0.5, tau=2.0)
    cached = DistillationLoss(supervised_loss(cfg, 4), teacher, "soft", alpha=0.5, tau=2.0, cache=True)
    images, labels = torch.randn(8, 1, 16, 16), torch.arange(8) % 4
    for batch in (images, images.flip(0), torch.cat([images[:4], torch.randn(4, 1, 16, 16)])):
        targets = labels if batch is images else labels.flip(0)
        assert torch.allclose(cached(student, batch, targets), plain(student, batch, targets), atol=1e-6)
    # 8 images, the same 8 in another order, then 4 seen and 4 new: the teacher ran on 12 images, not 24
    assert (cached.teacher_images, plain.teacher_images) == (12, 24)


def test_teacher_cache_is_refused_with_random_augmentation():
    with pytest.raises(ValueError, match=r"distill\.cache needs a fixed augmentation.*data\.mixup"):
        load_config("fashion-mnist-quick", {**TINY, "distill.cache": True, "data.mixup": 0.8})
    load_config("fashion-mnist-quick", {**TINY, "distill.cache": True, "data.hflip": 0.5})  # flips are fine


def test_distillation_with_teacher_cache_trains_the_same_weights(tmp_path):
    teacher = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1)
    resmlp.save(teacher, tmp_path / "t.safetensors", metadata={"class_names": SYNTHETIC_NAMES})
    common = {**TINY, "schedule.epochs": 2, "data.hflip": 0.5, "distill.teacher": str(tmp_path / "t.safetensors")}
    runs = {cache: train("fashion-mnist-distill", tmp_path / f"cache{cache}", {**common, "distill.cache": cache})
            for cache in (False, True)}
    a, b = (resmlp.load(runs[c]["checkpoint"].replace("best", "last")).state_dict() for c in (False, True))
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    # and the config's switch reaches the engine's loss
    cfg = load_config("fashion-mnist-distill", {**common, "distill.cache": True})
    trainer = Trainer(cfg, tmp_path / "unused", DistInfo(1, 0, 0, torch.device("cpu")), False, task_for(cfg))
    assert trainer.loss_fn.cache == {}
    # the teacher is recorded in summary.json: its file's hash and its own accuracy
    teacher_record = runs[True]["teacher"]
    assert teacher_record["weights_sha256"] == hashlib.sha256((tmp_path / "t.safetensors").read_bytes()).hexdigest()
    assert 0 <= teacher_record["val_top1"] <= 100


@pytest.mark.parametrize("names,words", [(["3", "2", "1", "0"], "the same classes in another order"),
                                         (["cat", "dog", "fox", "owl"], "other classes")])
def test_a_teacher_of_other_classes_is_refused_before_training(tmp_path, capsys, names, words):
    from resmlp.data import build_dataset

    data_names = build_dataset("synthetic", "train", None, 1, synthetic_size=(8, 8)).class_names
    teacher = resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16,
                                  depth=1)
    # the same class count as the data: only the names (the meaning of each logit) tell them apart
    labels = [data_names[int(n)] for n in names] if names[0].isdigit() else names
    resmlp.save(teacher, tmp_path / "t.safetensors", metadata={"class_names": labels})
    args = ["train", "--output", str(tmp_path / "run"), "--distill", str(tmp_path / "t.safetensors")]
    assert main(args + [f"--set={k}={v}" for k, v in TINY.items()]) == 2
    err = capsys.readouterr().err
    assert words in err and "distil from a teacher trained on this dataset" in err
    assert not (tmp_path / "run" / "last.pth").exists()

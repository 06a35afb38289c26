"""Distillation teachers of every origin: their class order checked against the data's, however their file
stores it, and fed their own preprocessing (resolution, normalisation), with their accuracy as `resmlp eval`
measures it."""

from __future__ import annotations

import json

import numpy as np
import pytest
import timm
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from test_distill import TINY

import resmlp
from resmlp.cli import main
from resmlp.evaluation import evaluate
from resmlp.preprocess import Preprocess
from resmlp.train import train
from resmlp.train.teacher import TeacherInput, stored_class_names

NAMES = [f"class_{i}" for i in range(4)]  # the synthetic data's classes, in order
REVERSED = NAMES[::-1]
RANDOM_FIRST_STEP = {**TINY, "data.synthetic_size": [16, 16]}


@pytest.mark.parametrize("stored,expected", [
    (NAMES, NAMES),
    (json.dumps(NAMES), NAMES),
    ("class_0\nclass_1\nclass_2\nclass_3\n", NAMES),
    ("class_0, class_1, class_2, class_3", NAMES),
    ({"0": "class_0", "1": "class_1", "3": "class_3", "2": "class_2"}, NAMES),  # index -> name
    ({"class_3": 3, "class_2": 2, "class_1": 1, "class_0": 0}, NAMES),  # class_to_idx: name -> index
    (json.dumps({"class_1": 0, "class_0": 1}), ["class_1", "class_0"]),
    ({"0": "a", "2": "b"}, None),  # a gap: no order
    ({"a": 0, "b": 0}, None),
    ({"a": [1]}, None),
    ([["a"]], None),
    (3, None),
])
def test_class_names_are_read_in_every_stored_form(stored, expected):
    assert stored_class_names(stored) == expected


def _run(tmp_path, name, overrides):
    args = ["train", "--output", str(tmp_path / name)] + [f"--set={k}={json.dumps(v)}" for k, v in overrides.items()]
    return main(args)


def _resmlp_teacher(**kw):
    return resmlp.create_model("resmlp_s12", img_size=16, patch_size=4, in_chans=1, num_classes=4, dim=16, depth=1,
                               **kw)


@pytest.mark.parametrize("stored", [json.dumps(REVERSED), "\n".join(REVERSED), dict(enumerate(REVERSED)),
                                    {n: i for i, n in enumerate(REVERSED)}])
def test_a_checkpoint_teacher_in_another_order_is_refused_whatever_the_form(tmp_path, capsys, stored):
    path = tmp_path / "t.safetensors"
    resmlp.save(_resmlp_teacher(), path, metadata={"class_names": stored})
    assert _run(tmp_path, "run", {**TINY, "distill.teacher": str(path)}) == 2
    assert "the same classes in another order" in capsys.readouterr().err
    assert not (tmp_path / "run" / "last.pth").exists()
    # the data's order in the same form trains
    good = json.loads(json.dumps(stored).replace("class_3", "X").replace("class_0", "class_3").replace("X", "class_0")
                      .replace("class_2", "Y").replace("class_1", "class_2").replace("Y", "class_1"))
    resmlp.save(_resmlp_teacher(), path, metadata={"class_names": good})
    assert _run(tmp_path, "ok", {**TINY, "distill.teacher": str(path)}) == 0


def _timm_weights(tmp_path, suffix, names=None):
    net = timm.create_model("resnet10t", num_classes=4, in_chans=1)
    if suffix == ".safetensors":
        path = tmp_path / f"w{len(list(tmp_path.iterdir()))}.safetensors"
        resmlp.save(net, path, metadata={"class_names": names} if names is not None else None)
    else:
        path = tmp_path / "w.pth"
        torch.save({"state_dict": net.state_dict(), **({"class_to_idx": names} if names is not None else {})}, path)
    return str(path)


def test_a_timm_teacher_is_checked_through_its_weights_file(tmp_path, capsys):
    base = {**TINY, "distill.teacher": "timm:resnet10t"}
    # the weights' recorded order differs from the data's: refused, as for a checkpoint teacher
    wrong = _timm_weights(tmp_path, ".safetensors", REVERSED)
    assert _run(tmp_path, "wrong", {**base, "distill.weights": wrong}) == 2
    assert "the same classes in another order" in capsys.readouterr().err
    # a weights file that records no classes: refused until the user vouches for the order
    bare = _timm_weights(tmp_path, ".pth")
    assert _run(tmp_path, "bare", {**base, "distill.weights": bare}) == 2
    err = capsys.readouterr().err
    assert "records no class names" in err and "--teacher-classes-match" in err
    assert not (tmp_path / "bare" / "last.pth").exists()
    assert _run(tmp_path, "vouched", {**base, "distill.weights": bare, "distill.classes_match": True}) == 0
    # the data's own order recorded: no flag needed; vouching never admits a recorded other order
    assert _run(tmp_path, "named", {**base, "distill.weights": _timm_weights(tmp_path, ".safetensors", NAMES)}) == 0
    assert _run(tmp_path, "overruled", {**base, "distill.weights": wrong, "distill.classes_match": True}) == 2


def test_a_torchvision_teacher_with_class_to_idx_and_the_flag_on_the_command_line(tmp_path, capsys):
    net = torchvision.models.resnet18(num_classes=4)
    path = tmp_path / "tv.pth"
    torch.save({"model": net.state_dict(), "class_to_idx": {n: i for i, n in enumerate(REVERSED)}}, path)
    base = {**TINY, "distill.teacher": "torchvision:resnet18", "distill.weights": str(path)}
    assert _run(tmp_path, "wrong", base) == 2
    assert "the same classes in another order" in capsys.readouterr().err
    torch.save({"model": net.state_dict()}, path)
    args = ["train", "--output", str(tmp_path / "flag"), "--distill", "torchvision:resnet18", "--teacher-weights",
            str(path)] + [f"--set={k}={json.dumps(v)}" for k, v in TINY.items()]
    assert main(args) == 2
    assert main(args + ["--teacher-classes-match"]) == 0


def test_a_random_teacher_has_no_order_to_check(tmp_path):
    summary = train("fashion-mnist-quick", tmp_path / "random", {
        **RANDOM_FIRST_STEP, "distill.teacher": "timm:resnet10t", "distill.allow_random_teacher": True})
    assert summary["teacher"]["weights"] is None


# ------------------------------------------------------------------------------------------ preprocessing
def test_the_teacher_input_is_the_student_batch_resized_and_renormalised():
    raw = torch.rand(2, 3, 16, 16)
    student = Preprocess(16, 3, (0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    own = Preprocess(32, 3, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), interpolation="bilinear")
    seen = []
    adapter = TeacherInput(lambda x: seen.append(x) or x.mean((2, 3)), student, own)
    batch = (raw - torch.tensor(student.mean).view(1, 3, 1, 1)) / torch.tensor(student.std).view(1, 3, 1, 1)
    adapter(batch)
    expected = F.interpolate(raw, size=(32, 32), mode="bilinear", antialias=True, align_corners=False)
    expected = (expected - torch.tensor(own.mean).view(1, 3, 1, 1)) / torch.tensor(own.std).view(1, 3, 1, 1)
    torch.testing.assert_close(seen[0], expected, rtol=1e-5, atol=1e-5)


def _image_folder(root, classes=3, per_class=4, size=20):
    """Class-coloured noisy images in train/ and val/: a teacher can tell them apart."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(per_class):
                base = np.zeros((size, size, 3))
                base[..., c] = 200
                pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / f"c{c}" / f"{i}.png")
    return root


def test_a_teacher_of_another_resolution_and_statistics_is_fed_its_own_and_scored_as_eval_scores_it(tmp_path):
    data = _image_folder(tmp_path / "data")
    teacher = resmlp.create_model("resmlp_s12", img_size=24, patch_size=8, num_classes=3, dim=16, depth=1)
    with torch.no_grad():  # a teacher that reads colour: the head sees the mean of each channel
        teacher.head.weight.zero_()
        teacher.head.weight[:, :3] = torch.eye(3) * 10
    path = tmp_path / "teacher.safetensors"
    resmlp.save(teacher, path, metadata={"class_names": ["c0", "c1", "c2"], "preprocess": dict(
        img_size=24, in_chans=3, mean=[0.1, 0.2, 0.3], std=[0.5, 0.4, 0.3], crop_pct=0.9, interpolation="bicubic")})
    overrides = {k: v for k, v in TINY.items() if not k.startswith("data.synthetic")}
    summary = train("fashion-mnist-quick", tmp_path / "run", {
        **overrides, "data.kind": "folder", "data.dir": str(data), "model.in_chans": 3, "train.batch_size": 4,
        "distill.teacher": str(path)})
    record = summary["teacher"]
    assert record["preprocess"]["img_size"] == 24 and record["preprocess_source"] == "checkpoint"
    assert record["val_top1"] == evaluate(path, data=str(data), split="val")["top1"]

"""One evaluation-preprocessing rule for every kind of file (resmlp.preprocess.preprocess_of_file): a file's own
metadata, a run's training state's config, or an assumption by where the weights come from, printed in one line;
`--crop-pct` replaces the crop of any of them. Each kind's values are pinned against their source."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

import resmlp
from resmlp.build import build_model
from resmlp.checkpoint import export_checkpoint
from resmlp.cli import main
from resmlp.inference import load_for_inference
from resmlp.preprocess import Preprocess

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
TINY_RESMLP = dict(img_size=32, patch_size=8, dim=16, depth=1, num_classes=3)
# a tiny run on in-memory data at a crop no default has (0.5), so only the run's own preprocessing gives it
TINY_RUN = ["--epochs", "1", "--batch-size", "16", "--no-progress", "--threads", "1", "--set", "data.kind=synthetic",
            "--set", "data.synthetic_size=[32,16]", "--set", "data.synthetic_classes=3", "--set",
            "train.compile=false", "--set", "schedule.warmup_epochs=0", "--set", "train.amp=none",
            "--set", "data.crop_pct=0.5"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("rule") / "run"
    assert main(["train", "--output", str(out), *TINY_RUN]) == 0
    return out


def _resmlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return resmlp.create_model("resmlp_s12", **TINY_RESMLP).eval()


def _mixer() -> torch.nn.Module:
    torch.manual_seed(0)
    return resmlp.create_model("mixer_s16", img_size=32, patch_size=8, dim=16, depth=1, num_classes=3).eval()


def test_a_runs_safetensors_carry_the_runs_preprocessing(run):
    pre = load_for_inference(run / "last.safetensors").preprocess
    assert (pre.crop_pct, pre.source, pre.note) == (0.5, "checkpoint", "")


def test_a_runs_state_file_is_evaluated_with_the_runs_preprocessing_and_scores_as_its_safetensors(run, tmp_path,
                                                                                                  capsys):
    """issue 43 M1: last.pth holds the same weights as last.safetensors; it scored them at the default crop."""
    state = load_for_inference(run / "last.pth")
    assert state.preprocess.to_dict() == load_for_inference(run / "last.safetensors").preprocess.to_dict()
    assert (state.preprocess.crop_pct, state.preprocess.source, state.preprocess.note) == (0.5, "run config", "")
    assert state.dataset == "synthetic"
    scores = {}
    for name in ("last.pth", "last.safetensors"):
        assert main(["eval", str(run / name), "--output", str(tmp_path / name)]) == 0
        scores[name] = json.loads((tmp_path / name / "summary.json").read_text())
    assert scores["last.pth"]["test_top1"] == scores["last.safetensors"]["test_top1"]
    assert scores["last.pth"]["preprocess"]["crop_pct"] == 0.5
    assert "no preprocessing metadata" not in capsys.readouterr().out  # read, not assumed: nothing to say


@pytest.mark.parametrize("fmt,suffix", [("deit", ".pth"), ("deit", ".safetensors"), ("timm", ".pth"),
                                        ("timm", ".safetensors")])
def test_resmlp_weights_in_deits_or_timms_layout_get_the_authors_crop_0_9_and_say_so(fmt, suffix, tmp_path):
    """DeiT's README_resmlp.md: "ResMLP employs ... a crop-ratio of 0.9 at test time"."""
    path = export_checkpoint(_resmlp(), tmp_path / f"w{suffix}", fmt)
    pre = load_for_inference(path).preprocess
    assert (pre.crop_pct, (pre.mean, pre.std), pre.interpolation, pre.source) == (0.9, IMAGENET, "bicubic", "assumed")
    assert "crop 0.9" in pre.note and "README_resmlp.md" in pre.note and len(pre.note.splitlines()) == 1


def test_mixer_weights_in_timms_layout_get_timms_mixer_preprocessing(tmp_path):
    """timm's mlp_mixer.py _cfg (Google's Mixer weights): mean = std = 0.5, crop_pct 0.875."""
    from timm.models.mlp_mixer import _cfg

    path = export_checkpoint(_mixer(), tmp_path / "mixer.pth", "timm")
    pre = load_for_inference(path).preprocess
    timm_cfg = _cfg()
    assert (pre.mean, pre.std, pre.crop_pct) == (timm_cfg["mean"], timm_cfg["std"], timm_cfg["crop_pct"])
    assert "Mixer" in pre.note


def test_a_dino_checkpoint_gets_dinos_evaluation_crop(tmp_path):
    """DINO's eval_knn.py / eval_linear.py: Resize(256, interpolation=3) then CenterCrop(224), i.e. 224/256."""
    path = export_checkpoint(_resmlp(), tmp_path / "dino.pth", "dino")
    pre = load_for_inference(path).preprocess
    assert (pre.crop_pct, (pre.mean, pre.std), pre.source) == (224 / 256, IMAGENET, "assumed")
    assert "DINO" in pre.note


def test_weights_in_this_projects_layout_without_metadata_get_timms_default_crop(tmp_path):
    torch.save(_resmlp().state_dict(), tmp_path / "plain.pth")
    pre = load_for_inference(tmp_path / "plain.pth").preprocess
    assert (pre.crop_pct, pre.source) == (0.875, "assumed") and "default crop" in pre.note


def test_timm_and_torchvision_models_use_their_files_metadata_else_timms_pretrained_cfg_or_a_refusal(tmp_path):
    from timm.data import resolve_data_config

    timm_model = build_model("timm:resnet10t", num_classes=3)
    vision = build_model("torchvision:resnet18", num_classes=3)
    own = Preprocess(40, 3, (0.1, 0.2, 0.3), (0.3, 0.2, 0.1), crop_pct=0.7)
    for name, model in (("timm", timm_model), ("tv", vision)):
        resmlp.save(model, tmp_path / f"{name}.safetensors", {"preprocess": own.to_dict()})
        pre = load_for_inference(tmp_path / f"{name}.safetensors").preprocess
        assert pre.to_dict() == own.to_dict() and pre.note == ""
    resmlp.save(timm_model, tmp_path / "bare_timm.safetensors")
    pre = load_for_inference(tmp_path / "bare_timm.safetensors").preprocess
    cfg = resolve_data_config({}, model=timm_model)
    assert (pre.crop_pct, pre.mean, pre.img_size) == (cfg["crop_pct"], tuple(cfg["mean"]), cfg["input_size"][1])
    assert "pretrained_cfg" in pre.note
    resmlp.save(vision, tmp_path / "bare_tv.safetensors")
    with pytest.raises(ValueError, match="no preprocessing metadata"):
        load_for_inference(tmp_path / "bare_tv.safetensors")


def test_crop_pct_replaces_the_crop_of_every_kind_and_says_so(run, tmp_path):
    deit = export_checkpoint(_resmlp(), tmp_path / "w.pth", "deit")
    for path, was in ((run / "last.safetensors", 0.5), (run / "last.pth", 0.5), (deit, 0.9)):
        pre = load_for_inference(path, crop_pct=0.95).preprocess
        assert pre.crop_pct == 0.95 and "0.95" in pre.note and len(pre.note.splitlines()) == 1, path
        assert load_for_inference(path).preprocess.crop_pct == was
    assert load_for_inference(run / "last.safetensors", crop_pct=0.5).preprocess.note == ""  # the file's own


def _image_folder(root, classes=3):
    rng = np.random.default_rng(0)
    for c in range(classes):
        (root / "test" / f"c{c}").mkdir(parents=True)
        Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(root / "test" / f"c{c}" / "0.png")


def test_eval_and_predict_print_the_assumption_in_one_line_and_take_crop_pct(tmp_path, capsys):
    deit = export_checkpoint(_resmlp(), tmp_path / "w.pth", "deit")
    _image_folder(tmp_path / "data")
    assert main(["eval", str(deit), "--data", str(tmp_path / "data"), "--output", str(tmp_path / "ev")]) == 0
    out = capsys.readouterr().out
    assert sum("no preprocessing metadata: assumed ImageNet's mean/std, crop 0.9" in line
               for line in out.splitlines()) == 1
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["preprocess"]["crop_pct"] == 0.9 and summary["preprocess"]["source"] == "assumed"
    assert main(["predict", str(deit), str(tmp_path / "data"), "--crop-pct", "0.8"]) == 0
    assert "crop 0.8 (--crop-pct)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:  # argparse's one-line refusal, before any file is read
        main(["predict", str(deit), str(tmp_path / "data"), "--crop-pct", "1.5"])
    assert refused.value.code == 2 and "--crop-pct" in capsys.readouterr().err


def test_the_probes_print_the_assumption_too(tmp_path, capsys):
    dino = export_checkpoint(_resmlp(), tmp_path / "dino.pth", "dino")
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for c in range(2):
            (tmp_path / "data" / split / f"c{c}").mkdir(parents=True)
            for i in range(2):
                Image.fromarray(rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)).save(
                    tmp_path / "data" / split / f"c{c}" / f"{i}.png")
    assert main(["eval-knn", str(dino), "--data", str(tmp_path / "data"), "--k", "2", "--threads", "1"]) == 0
    captured = capsys.readouterr()
    assert "DINO's eval_knn.py" in captured.err
    assert json.loads(captured.out.splitlines()[-1])["preprocess"]["crop_pct"] == 0.875


def test_the_state_of_a_timm_run_is_refused_naming_the_runs_safetensors(tmp_path, capsys):
    model = build_model("timm:resnet10t", num_classes=3)
    state = {"version": 2, "config": {"model": {"name": "timm:resnet10t"}, "data": {"kind": "synthetic"}},
             "model": model.state_dict()}
    torch.save(state, tmp_path / "last.pth")
    assert main(["eval", str(tmp_path / "last.pth")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(tmp_path / "last.safetensors") in err and "timm:resnet10t" in err

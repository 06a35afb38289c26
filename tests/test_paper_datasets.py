"""The paper's other datasets, each from a tiny replica in its released layout: ImageNet-V2 (evaluation, and the
refusal of a model whose classes are not ImageNet-1k's), ImageNet-21k (its tar of class tars, the folder of
class tars, the folder of class folders; the listing cache), Flowers-102, Stanford Cars (devkit and class
folders), iNaturalist 2018 / 2019 (DeiT's class numbering) and CIFAR-100; training and evaluation read each.
Bad layouts and bad numbers are one line."""

from __future__ import annotations

import csv
import io
import json
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

import resmlp
from resmlp.cli import main
from resmlp.data.sources import open_source
from resmlp.errors import DataError

TINY = {
    "data.num_workers": 0, "data.crop_pct": 1.0, "data.scale": [0.6, 1.0], "data.ratio": [1.0, 1.0],
    "model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1, "model.in_chans": 3,
    "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 4, "train.progress": False,
    "train.threads": 1, "train.compile": False, "train.amp": "none", "train.device": "cpu",
    "data.mean": [0.5, 0.5, 0.5], "data.std": [0.25, 0.25, 0.25], "data.mixup": 0.0, "data.cutmix": 0.0,
    "data.repeated_aug": 0, "data.auto_augment": None, "data.reprob": 0.0,
}


def _jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (20, 24, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _sets(overrides: dict) -> list[str]:
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={json.dumps(value)}")]


def _train(source: str, out: Path, **extra) -> dict:
    assert main(["train", "--recipe", "deit", "--output", str(out), *_sets({**TINY, "data.source": source,
                                                                              **extra})]) == 0
    return json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------------------------------------ ImageNet-V2
def _imagenet_v2(root: Path, classes=(0, 1, 999), images: int = 2) -> Path:
    folder = root / "imagenetv2-matched-frequency-format-val"
    for c in classes:
        for i in range(images):
            _write(folder / str(c) / f"{c:04d}{i:02d}abcdef.jpeg", _jpeg(c * 10 + i))
    return folder


def _imagenet_model(path: Path, num_classes: int = 1000, names: list[str] | None = None) -> Path:
    from resmlp.data.sources.imagenet_v2 import imagenet1k_synsets

    model = resmlp.create_model("resmlp_s12", img_size=16, patch_size=8, dim=16, depth=1, num_classes=num_classes)
    names = imagenet1k_synsets() if names is None and num_classes == 1000 else names
    meta = {"preprocess": {"img_size": 16, "crop_pct": 1.0, "interpolation": "bicubic", "mean": [0.5] * 3,
                           "std": [0.25] * 3, "in_chans": 3}}
    if names is not None:
        meta["class_names"] = names
    return resmlp.save(model, path, metadata=meta)


def test_imagenet_v2_is_labelled_by_its_folder_index_in_the_1k_order(tmp_path):
    folder = _imagenet_v2(tmp_path)
    for spec in (f"imagenetv2:{folder}", f"imagenetv2:{tmp_path}"):  # the set, or the folder holding it
        source = open_source(spec)
        assert source.splits == ("test",)
        records = source.records("test")
        assert len(records.class_names) == 1000 and records.class_names[0] == "n01440764"
        assert records.labels.tolist() == [0, 0, 1, 1, 999, 999]
        assert records.name(4).endswith("999/099900abcdef.jpeg")


def test_resmlp_eval_scores_an_imagenet_model_on_v2_and_refuses_others(tmp_path, capsys):
    folder = _imagenet_v2(tmp_path)
    ckpt = _imagenet_model(tmp_path / "in1k.safetensors")
    assert main(["eval", str(ckpt), "--data", f"imagenetv2:{folder}", "--output", str(tmp_path / "v2"),
                 "--amp", "fp32", "--device", "cpu"]) == 0
    summary = json.loads((tmp_path / "v2" / "summary.json").read_text())
    assert summary["dataset"] == "imagenetv2" and summary["split"] == "test" and summary["images"] == 6
    # a published 1k head without class names is scored too, and one trained on the Hub's imagenet-1k (its
    # classes named by their lemmas, in the 1k order)
    from resmlp.data.sources.imagenet_v2 import imagenet1k_descriptions

    for name, names in (("plain", []), ("hub", imagenet1k_descriptions())):
        assert main(["eval", str(_imagenet_model(tmp_path / f"{name}.safetensors", names=names)), "--data",
                     f"imagenetv2:{folder}", "--amp", "fp32", "--device", "cpu"]) == 0
    shuffled = imagenet1k_descriptions()
    shuffled[:2] = shuffled[1::-1]  # the lemmas in another order: not the 1k order
    capsys.readouterr()
    for bad, says in ((_imagenet_model(tmp_path / "ten.safetensors", 10, [f"c{i}" for i in range(10)]),
                       "predicts 10 classes"),
                      (_imagenet_model(tmp_path / "other.safetensors", 1000, [f"c{i}" for i in range(1000)]),
                       "not ImageNet-1k's"),
                      (_imagenet_model(tmp_path / "swapped.safetensors", 1000, shuffled), "class 0 is 'goldfish")):
        assert main(["eval", str(bad), "--data", f"imagenetv2:{folder}", "--device", "cpu"]) == 2
        err = capsys.readouterr().err
        assert says in err and "ImageNet-V2" in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(("make", "says"), [
    (lambda f: (f / "1000").mkdir(parents=True), "0 to 999"),
    (lambda f: (f / "tench").mkdir(parents=True), "not an ImageNet-V2 class folder"),
    (lambda f: (f / "007").mkdir(parents=True), "not an ImageNet-V2 class folder"),
    (lambda f: f.mkdir(parents=True), "no class folders"),
])
def test_a_bad_imagenet_v2_folder_is_one_line(tmp_path, capsys, make, says):
    folder = tmp_path / "v2"
    make(folder)
    ckpt = _imagenet_model(tmp_path / "in1k.safetensors")
    assert main(["eval", str(ckpt), "--data", f"imagenetv2:{folder}", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1


# ------------------------------------------------------------------------------------------------ ImageNet-21k
def _class_tar(images: list[tuple[str, bytes]]) -> bytes:
    inner = io.BytesIO()
    with tarfile.TarFile(fileobj=inner, mode="w") as tar:
        for name, data in images:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return inner.getvalue()


WNIDS = ("n00004475", "n00005787", "n15102894")


def _in21k(root: Path, form: str, images: int = 4) -> Path:
    """The three forms of a 3-class ImageNet-21k: the download (a tar of class tars), it extracted once (a folder of
    class tars), fully (class folders)."""
    per_class = {w: [(f"{w}_{i}.JPEG", _jpeg(k * 10 + i)) for i in range(images)] for k, w in enumerate(WNIDS)}
    root.mkdir(parents=True)
    if form == "download":
        with tarfile.open(root / "fall11_whole.tar", "w") as outer:
            for wnid, files in per_class.items():
                data = _class_tar(files)
                info = tarfile.TarInfo(f"{wnid}.tar")
                info.size = len(data)
                outer.addfile(info, io.BytesIO(data))
        return root / "fall11_whole.tar"
    for wnid, files in per_class.items():
        if form == "class tars":
            _write(root / f"{wnid}.tar", _class_tar(files))
        else:
            for name, data in files:
                _write(root / wnid / name, data)
    return root


@pytest.mark.parametrize("form", ["download", "class tars", "class folders"])
def test_imagenet21k_is_read_in_place_in_each_download_form(tmp_path, form):
    path = _in21k(tmp_path / "in21k", form)
    cache = tmp_path / "run"
    first = open_source(f"imagenet21k:{path}", index_cache=cache).records("train")
    assert first.class_names == list(WNIDS) and len(first) == 12
    assert first.labels.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    payloads = [first[i][0] for i in range(len(first))]
    assert payloads[5] == _jpeg(11)  # the image's bytes, read at its offset (inside its class tar)
    assert list((cache / "data_index").iterdir())  # the listing kept for the next start
    if form == "download":  # the folder holding the download names it too
        assert open_source(f"imagenet21k:{path.parent}").records("train").labels.tolist() == first.labels.tolist()
    again = open_source(f"imagenet21k:{path}", index_cache=cache).records("train")
    assert [again[i][0] for i in range(len(again))] == payloads and again.labels.tolist() == first.labels.tolist()
    held = first.subset(np.asarray([11, 0]))
    assert held[0][0] == payloads[11] and held.labels.tolist() == [2, 0]


def test_imagenet21k_class_tar_cache_is_checked_and_refreshed(tmp_path):
    path = _in21k(tmp_path / "in21k", "class tars")
    cache = tmp_path / "run"
    open_source(f"imagenet21k:{path}", index_cache=cache).records("train")
    saved = next((cache / "data_index").iterdir())
    arrays = dict(np.load(saved))
    arrays["data_offsets"] = arrays["data_offsets"] + 10**9  # a damaged cache: members outside their tars
    with open(saved, "wb") as f:
        np.savez(f, **arrays)
    records = open_source(f"imagenet21k:{path}", index_cache=cache).records("train")
    assert records[0][0] == _jpeg(0)  # ignored and listed again
    _write(path / "n15102894.tar", _class_tar([("n15102894_9.JPEG", _jpeg(99))]))  # a class tar replaced
    records = open_source(f"imagenet21k:{path}", index_cache=cache).records("train")
    assert len(records) == 9 and records[8][0] == _jpeg(99)


def test_imagenet21k_trains_and_a_bad_layout_is_one_line(tmp_path, capsys):
    path = _in21k(tmp_path / "in21k", "download")
    summary = _train(f"imagenet21k:{path}", tmp_path / "run", **{"data.val_size": 3})
    assert summary["epochs"] == 1 and "carved from train" in summary["validation"]
    mixed = _in21k(tmp_path / "mixed", "class folders")
    _write(mixed / "n09999999.tar", _class_tar([("x.JPEG", _jpeg(0))]))
    empty = tmp_path / "empty"
    empty.mkdir()
    gz = tmp_path / "winter21_whole.tar"
    gz.write_bytes(b"\x1f\x8b" + bytes(1000))
    for bad, says in ((mixed, "both class tars"), (empty, "no class tars nor class folders"), (gz, "gzip")):
        assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "bad"),
                     *_sets({**TINY, "data.source": f"imagenet21k:{bad}"})]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1, err


def test_imagenet21k_limits_admit_its_21841_classes():
    from resmlp.data.records import MAX_CLASSES, check_class_names
    from resmlp.data.sources.walk import MAX_WALK_ENTRIES

    assert MAX_CLASSES >= 21_841 and MAX_WALK_ENTRIES >= 14_197_122  # fall11_whole: classes and images
    assert len(check_class_names([f"n{i:08d}" for i in range(21_841)], "in21k")) == 21_841


# ------------------------------------------------------------------------------------------------ Flowers-102
def _flowers(root: Path, labels=(1, 2, 3, 1, 2, 3, 1, 2, 3, 3), split=((1, 2, 3), (4, 5, 6), (7, 8, 9, 10))) -> Path:
    for i in range(1, len(labels) + 1):
        _write(root / "jpg" / f"image_{i:05d}.jpg", _jpeg(i))
    scipy.io.savemat(root / "imagelabels.mat", {"labels": np.asarray([labels], dtype=np.uint8)})
    scipy.io.savemat(root / "setid.mat", {name: np.asarray([ids], dtype=np.uint16)
                                          for name, ids in zip(("trnid", "valid", "tstid"), split, strict=True)})
    return root


def test_flowers102_splits_and_labels_follow_its_mat_files(tmp_path):
    source = open_source(f"flowers102:{_flowers(tmp_path / 'flowers')}")
    assert source.splits == ("train", "val", "test")
    test = source.records("test")
    assert test.class_names == ["1", "2", "3"] and test.labels.tolist() == [0, 1, 2, 2]
    assert test[3][0] == _jpeg(10) and test.name(0).endswith("jpg/image_00007.jpg")


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: scipy.io.savemat(r / "imagelabels.mat", {"labels": np.asarray([[0, 1, 2]])}), "outside [1"),
    (lambda r: scipy.io.savemat(r / "imagelabels.mat", {"labels": np.asarray([[1.5] * 10])}), "fraction"),
    (lambda r: scipy.io.savemat(r / "setid.mat", {"trnid": [[1, 99]], "valid": [[4]], "tstid": [[7]]}),
     "outside [1, 10]"),
    (lambda r: scipy.io.savemat(r / "setid.mat", {"trnid": [[1, 1]], "valid": [[4]], "tstid": [[7]]}), "twice"),
    (lambda r: scipy.io.savemat(r / "setid.mat", {"valid": [[4]], "tstid": [[7]]}), "no variable 'trnid'"),
    (lambda r: (r / "setid.mat").write_bytes(b"not a mat file"), "not a readable MATLAB file"),
])
def test_bad_flowers102_files_are_one_line(tmp_path, capsys, change, says):
    root = _flowers(tmp_path / "flowers")
    change(root)
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "run"),
                 *_sets({**TINY, "data.source": f"flowers102:{root}"})]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


def test_a_mat_variable_declaring_too_many_entries_is_refused_before_it_is_read(tmp_path):
    from resmlp.data.sources.matfiles import read_mat_variable

    scipy.io.savemat(tmp_path / "big.mat", {"labels": np.zeros((1, 5000), dtype=np.uint8)})
    with pytest.raises(DataError, match="declares 5,000 entries"):
        read_mat_variable(tmp_path / "big.mat", "labels", 100, "labels")


# ------------------------------------------------------------------------------------------------ Stanford Cars
def _annotations(files: list[str], classes: list[int]) -> np.ndarray:
    fields = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")
    table = np.zeros((1, len(files)), dtype=[(f, "O") for f in fields])
    for i, (name, label) in enumerate(zip(files, classes, strict=True)):
        table[0, i] = (np.array([[1]]), np.array([[1]]), np.array([[10]]), np.array([[10]]), np.array([[label]]),
                       np.array([name]))
    return table


def _cars(root: Path, kaggle_nesting: bool = False) -> Path:
    names = np.empty((1, 3), dtype=object)
    names[0, :] = ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "smart fortwo Convertible 2012"]
    (root / "devkit").mkdir(parents=True)
    scipy.io.savemat(root / "devkit" / "cars_meta.mat", {"class_names": names})
    for split, n, mat in (("train", 9, root / "devkit" / "cars_train_annos.mat"),
                          ("test", 3, root / "cars_test_annos_withlabels.mat")):
        files = [f"{i:05d}.jpg" for i in range(1, n + 1)]
        scipy.io.savemat(mat, {"annotations": _annotations(files, [i % 3 + 1 for i in range(n)])})
        folder = root / f"cars_{split}" / (f"cars_{split}" if kaggle_nesting else "")
        for i, name in enumerate(files):
            _write(folder / name, _jpeg(100 * (split == "test") + i))
    return root


@pytest.mark.parametrize("kaggle_nesting", [False, True])
def test_stanford_cars_devkit_layout(tmp_path, kaggle_nesting):
    source = open_source(f"stanford-cars:{_cars(tmp_path / 'cars', kaggle_nesting)}")
    assert source.splits == ("train", "test")
    test = source.records("test")
    assert test.class_names[2] == "smart fortwo Convertible 2012" and test.labels.tolist() == [0, 1, 2]
    assert test[2][0] == _jpeg(102)


def test_stanford_cars_trains_from_the_devkit_and_from_class_folders(tmp_path):
    summary = _train(f"stanford-cars:{_cars(tmp_path / 'cars')}", tmp_path / "devkit-run", **{"data.val_size": 3})
    assert summary["epochs"] == 1 and summary["test_top1"] is not None
    folders = tmp_path / "car_data"
    for split in ("train", "test"):
        for c in ("Acura RL Sedan 2012", "Ram C-V Cargo Van Minivan 2012"):
            for i in range(3):
                _write(folders / "car_data" / split / c / f"{i}.jpg", _jpeg(i))
    assert open_source(f"stanford-cars:{folders}").records("test").class_names[1] == "Ram C-V Cargo Van Minivan 2012"


@pytest.mark.parametrize(("change", "says"), [
    (lambda r: scipy.io.savemat(r / "cars_test_annos_withlabels.mat", {"annotations": _annotations(
        ["00001.jpg"], [4])}), "outside [1, 3]"),
    (lambda r: scipy.io.savemat(r / "devkit" / "cars_train_annos.mat", {"annotations": _annotations(
        ["../../etc/passwd"], [1])}), "not an image file name"),
    (lambda r: scipy.io.savemat(r / "devkit" / "cars_train_annos.mat", {"annotations": np.zeros((1, 2))}),
     "expected fname and class"),
])
def test_bad_stanford_cars_files_are_one_line(tmp_path, capsys, change, says):
    root = _cars(tmp_path / "cars")
    change(root)
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "run"),
                 *_sets({**TINY, "data.source": f"stanford-cars:{root}", "data.val_size": 0})]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------------------ iNaturalist
def _inat(root: Path, year: int, deit_layout: bool = False, categories_json: bool = False) -> Path:
    """Categories 7, 3, 5 (ids out of order), the training annotations meeting them in the order 5, 7, 3."""
    categories = [{"id": 3, "name": "Aa"}, {"id": 5, "name": "Bb"}, {"id": 7, "name": "Cc"}]
    splits = {"train": [(10, 5), (11, 7), (12, 3), (13, 5), (14, 7), (15, 3)], "val": [(20, 3), (21, 7)]}
    for split, rows in splits.items():
        images, annotations = [], []
        for ident, category in rows:
            name = f"train_val{year}/Plantae/{category}/{ident}.jpg"
            images.append({"id": ident, "file_name": name, "width": 24, "height": 20})
            annotations.append({"id": ident, "image_id": ident, "category_id": category})
            stored = f"train_val{year}/{category}/{ident}.jpg" if deit_layout else name
            _write(root / stored, _jpeg(ident))
        data = {"images": images, "annotations": annotations, "categories": [] if categories_json else categories}
        (root / f"{split}{year}.json").write_text(json.dumps(data))
    if categories_json:  # DeiT's categories.json: a list indexed by category id
        (root / "categories.json").write_text(json.dumps([{"name": f"species {i}"} for i in range(8)]))
    return root


@pytest.mark.parametrize(("year", "deit_layout", "categories_json"), [(2018, False, True), (2019, True, False)])
def test_inaturalist_classes_are_numbered_as_deit_numbers_them(tmp_path, year, deit_layout, categories_json):
    source = open_source(f"inat{year}:{_inat(tmp_path / 'inat', year, deit_layout, categories_json)}")
    train, val = source.records("train"), source.records("val")
    expected = ["species 5", "species 7", "species 3"] if categories_json else ["Bb", "Cc", "Aa"]
    assert train.class_names == val.class_names == expected  # first appearance in train's annotations
    assert train.labels.tolist() == [0, 1, 2, 0, 1, 2] and val.labels.tolist() == [2, 1]
    assert val[1][0] == _jpeg(21)


def test_inaturalist_trains(tmp_path):
    summary = _train(f"inat2019:{_inat(tmp_path / 'inat', 2019)}", tmp_path / "run")
    assert summary["epochs"] == 1 and summary["val_top1"] is not None


@pytest.mark.parametrize(("change", "says"), [
    (lambda d: d["annotations"].append({"image_id": 10, "category_id": 7}), "two annotations"),
    (lambda d: d["annotations"].__setitem__(0, {"image_id": 10, "category_id": 99}), "category 99"),
    (lambda d: d["images"].__setitem__(0, {"id": 10, "file_name": "../../x.jpg"}), "not a relative path"),
    (lambda d: d["images"].append({"id": 99, "file_name": "train_val2018/x/1/y.jpg"}), "has no annotation"),
    (lambda d: d.pop("images"), "not an iNaturalist annotation file"),
])
def test_bad_inaturalist_files_are_one_line(tmp_path, capsys, change, says):
    root = _inat(tmp_path / "inat", 2018)
    data = json.loads((root / "train2018.json").read_text())
    change(data)
    (root / "train2018.json").write_text(json.dumps(data))
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "run"),
                 *_sets({**TINY, "data.source": f"inat2018:{root}"})]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err


# ------------------------------------------------------------------------------------------------ CIFAR-100
def test_cifar100_is_a_source_beside_cifar10(tmp_path):
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    with open(base / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [b"apple", b"aquarium_fish"]}, f, protocol=2)
    for name, n in (("train", 8), ("test", 4)):
        with open(base / name, "wb") as f:
            pickle.dump({b"data": np.zeros((n, 3072), np.uint8), b"fine_labels": [i % 2 for i in range(n)]}, f,
                        protocol=2)
    source = open_source(f"cifar100:{tmp_path}")
    assert source.records("test").class_names == ["apple", "aquarium_fish"] and len(source.records("train")) == 8


# ------------------------------------------------------------------------------------------------ Fig. 4
def _summary(path: Path, checkpoint: str, dataset: str, top1: float) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"checkpoint": checkpoint, "dataset": dataset, "top1": top1, "split": "val"}))
    return str(path)


def test_analyze_fig4_plots_v2_against_val_with_a_linear_fit_per_family(tmp_path, capsys):
    scores = {"a": (76.0, 64.0), "b": (79.0, 67.5), "c": (81.0, 69.0)}  # v2 = 1.0 * val - 12 +- 0.5... fitted
    args = []
    for name, (val, v2) in scores.items():
        ckpt = f"/runs/{name}/best.safetensors"
        args += [_summary(tmp_path / name / "val.json", ckpt, "folder", val),
                 _summary(tmp_path / name / "v2.json", ckpt, "imagenetv2", v2)]
    args += [f"DeiT={_summary(tmp_path / 'd' / 'val.json', '/deit.pth', 'folder', 80.0)}",
             f"DeiT={_summary(tmp_path / 'd' / 'v2.json', '/deit.pth', 'imagenetv2', 69.0)}"]
    assert main(["analyze-fig4", *args, "--paper", "--output", str(tmp_path / "fig4")]) == 0
    rows = list(csv.DictReader(Path(tmp_path / "fig4" / "fig4.csv").read_text().splitlines()))
    assert [(r["family"], r["label"]) for r in rows[:4]] == [("ResMLP", "a"), ("ResMLP", "b"), ("ResMLP", "c"),
                                                             ("DeiT", "deit")]
    assert float(rows[1]["gap"]) == pytest.approx(11.5) and len(rows) == 9  # 4 checkpoints + the paper's 5
    fits = {r["family"]: r for r in csv.DictReader(Path(tmp_path / "fig4" / "fig4_fits.csv").read_text().splitlines())}
    slope, intercept = np.polyfit([76.0, 79.0, 81.0], [64.0, 67.5, 69.0], 1)
    assert float(fits["ResMLP"]["slope"]) == pytest.approx(slope) and float(fits["ResMLP"]["intercept"]) == \
        pytest.approx(intercept)
    assert "DeiT" not in fits and "ResMLP (paper Table 3)" in fits  # one point: no line
    assert (tmp_path / "fig4" / "fig4.png").read_bytes()[:4] == b"\x89PNG"
    assert "fig4.png" in (tmp_path / "fig4" / "index.html").read_text()


def test_analyze_fig4_needs_both_evaluations_of_each_checkpoint(tmp_path, capsys):
    only_val = _summary(tmp_path / "val.json", "/x/best.safetensors", "folder", 70.0)
    assert main(["analyze-fig4", only_val, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "no ImageNet-V2 (resmlp eval CKPT --data imagenetv2:DIR) summary" in err and err.count("\n") == 1
    (tmp_path / "bad.json").write_text(json.dumps({"top1": "high"}))
    assert main(["analyze-fig4", str(tmp_path / "bad.json"), "--output", str(tmp_path / "out")]) == 2
    assert "is not a `resmlp eval --output DIR` summary" in capsys.readouterr().err


def test_fig4_from_real_evaluations(tmp_path, capsys):
    """The whole chain on tiny replicas: a checkpoint evaluated on an ImageNet val folder (1,000 class folders of one
    image; through the API without the 1000x1000 confusion plot) and with `resmlp eval` on ImageNet-V2, then
    analyze-fig4 over the two summaries."""
    from resmlp.data.sources.imagenet_v2 import imagenet1k_synsets
    from resmlp.evaluation import evaluate

    v2 = _imagenet_v2(tmp_path)
    val = tmp_path / "imagenet"
    image = _jpeg(0)
    for synset in imagenet1k_synsets():
        _write(val / "val" / synset / "0.JPEG", image)
    ckpt = _imagenet_model(tmp_path / "m0.safetensors")
    evaluate(ckpt, data=f"folder:{val}", split="val", output=tmp_path / "val", amp="fp32", device="cpu", plot=False)
    assert main(["eval", str(ckpt), "--data", f"imagenetv2:{v2}", "--output", str(tmp_path / "v2"), "--amp", "fp32",
                 "--device", "cpu", "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["analyze-fig4", str(tmp_path / "val" / "summary.json"), str(tmp_path / "v2" / "summary.json"),
                 "--paper", "--output", str(tmp_path / "fig4")]) == 0
    printed = capsys.readouterr().out
    assert "m0" in printed and "fig4.png" in printed
    rows = list(csv.DictReader(Path(tmp_path / "fig4" / "fig4.csv").read_text().splitlines()))
    v2_top1 = json.loads((tmp_path / "v2" / "summary.json").read_text())["top1"]
    assert rows[0]["label"] == "m0" and float(rows[0]["v2_top1"]) == pytest.approx(v2_top1)


# ------------------------------------------------------------------------------------------------ 21k-sized heads
@pytest.mark.parametrize("num_classes", [10, 21_841])
def test_evaluation_of_a_21k_head_sums_per_class_counts_not_a_matrix(num_classes):
    """A 21,841-class evaluation keeps two per-class vectors (a 477 M-cell confusion matrix would be 27 GB with its
    copies); the scores are those of the full matrix."""
    import torch

    from resmlp.complexity import CONFUSION_MAX_CLASSES, evaluation_memory_bytes
    from resmlp.evaluation import classify

    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(64, num_classes, generator=generator)
    targets = torch.randint(0, num_classes, (64,), generator=generator)
    targets[:20] = logits[:20].argmax(dim=1)  # some hits
    batches = [(logits[i:i + 16], targets[i:i + 16], 0) for i in range(0, 64, 16)]
    result = classify(torch.nn.Identity(), batches, num_classes, torch.device("cpu"), "fp32")
    hits = (logits.argmax(dim=1) == targets).numpy()
    assert result["top1"] == pytest.approx(100.0 * hits.mean())
    assert result["class_images"].sum() == 64 and result["class_hits"].sum() == hits.sum()
    first = int(targets[0])
    assert result["class_hits"][first] == hits[(targets == first).numpy()].sum()
    assert (result["confusion"] is None) == (num_classes > CONFUSION_MAX_CLASSES)
    assert evaluation_memory_bytes(21_841) < 2**24 < 2**27 < evaluation_memory_bytes(CONFUSION_MAX_CLASSES)


def test_the_stratified_validation_carve_draws_as_a_per_class_scan_does():
    """One stable sort instead of a scan per class (21,841 scans of 14 M labels for ImageNet-21k), the same
    held-out images for the same seed as before: runs carved earlier keep their validation split."""
    from resmlp.data.arrays import stratified_split

    labels = np.random.default_rng(3).integers(0, 40, 3000)
    kept, held = stratified_split(labels, 300, seed=7)
    rng = np.random.default_rng(7)
    classes, counts = np.unique(labels, return_counts=True)
    quota = np.floor(counts / len(labels) * 300).astype(int)
    quota[np.argsort(-(counts / len(labels) * 300 - quota))[: 300 - quota.sum()]] += 1
    expected = np.sort(np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:q]
                                       for c, q in zip(classes, quota, strict=True)]))
    assert np.array_equal(held, expected) and len(kept) == 2700


# ------------------------------------------------------------------------------------------------ benchmark
@pytest.mark.slow
def test_the_in21k_listing_benchmark_runs_in_its_tiny_form(tmp_path, form="download"):
    """benchmarks/in21k_listing.py at 5 classes of 2 images: a first and a cached start, both listing every image
    (the figure itself is measured with --classes 21841 on an idle host)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "in21k_listing.py"
    out = tmp_path / "result.json"
    done = subprocess.run([sys.executable, str(script), "--classes", "5", "--images", "2", "--form", form,
                           "--repeats", "1", "--folder", str(tmp_path / "replica"), "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["classes"] == 5 and result["images"] == 10 and result["form"] == form
    assert result["runs"]["cached"][0]["images"] == 10 and result["first_start_s"] > 0
    assert "| cached |" in done.stdout

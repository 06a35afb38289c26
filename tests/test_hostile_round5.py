"""Hostile inputs, fifth round (issue 55): outputs that replaced their own inputs (1), listing caches trusted by size
and time (2), foreign shard folders (3), numbers from files reaching allocations unbounded (4), ReaL and valid-label
files (5), a linked class tar (6), the device path on the CPU (7), a truncated JPEG and ImageNet's name (8).

Each test failed before its fix: an input replaced, a wrong number with exit 0, a traceback, or a size taken from a
file unbounded."""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from resmlp.cli import main
from resmlp.data.records import MAX_CLASSES
from resmlp.data.sources import open_source, wds_census
from resmlp.errors import ConfigError, DataError
from resmlp.fileio import atomic_write

TINY_TRAIN = ["--set", "data.kind=synthetic", "--set", "model.img_size=16", "--set", "model.patch_size=8",
              "--set", "model.dim=8", "--set", "model.depth=1", "--set", "schedule.epochs=1",
              "--set", "schedule.warmup_epochs=0", "--set", "train.batch_size=8", "--set", "train.progress=false",
              "--set", "data.synthetic_size=[16,8]", "--set", "data.num_workers=0", "--set", "train.threads=1",
              "--set", "train.compile=false"]
CLASSES = ("n01440764", "n01443537")


def _one_line(capsys, *words: str) -> None:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def _jpeg(seed: int, size: tuple[int, int] = (12, 10)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def _tar_of(path: Path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


# ------------------------------------------------------------------------------------------ 1: outputs
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("round5") / "run"
    assert main(["train", "--output", str(out), *TINY_TRAIN]) == 0
    return out


def test_an_output_that_is_an_input_of_the_command_is_refused_and_the_input_kept(run, tmp_path, capsys):
    model = tmp_path / "m.safetensors"
    model.write_bytes((run / "best.safetensors").read_bytes())
    before = model.read_bytes()
    capsys.readouterr()
    # eval --results over the checkpoint evaluated (before: replaced by the CSV, exit 0)
    assert main(["eval", str(model), "--results", str(model), "--no-progress"]) == 2
    _one_line(capsys, "is an input of this command")
    # through the run folder: its best.safetensors is the input, whatever name reaches it
    assert main(["eval", str(run), "--results", str(run / "best.safetensors"), "--no-progress"]) == 2
    _one_line(capsys, "best.safetensors is an input of this command")
    # a hard link to the checkpoint is the same file
    os.link(model, tmp_path / "alias.safetensors")
    assert main(["eval", str(model), "--results", str(tmp_path / "alias.safetensors"), "--no-progress"]) == 2
    _one_line(capsys, "the same file as")
    # the ReaL file of the same command
    real = tmp_path / "real.json"
    real.write_text("[[0]]")
    assert main(["eval", str(model), "--real-labels", str(real), "--results", str(real), "--no-progress"]) == 2
    _one_line(capsys, "real.json is an input of this command")
    assert real.read_text() == "[[0]]"
    # export over the checkpoint it reads
    assert main(["export", str(model), "--format", "pt2", "--output", str(model)]) == 2
    _one_line(capsys, "is an input of this command")
    assert model.read_bytes() == before


def test_an_output_that_another_output_of_the_command_writes_is_refused_before_any_work(run, tmp_path, capsys):
    capsys.readouterr()
    out = tmp_path / "out"
    assert main(["eval", str(run), "--output", str(out), "--results", str(out / "summary.json"),
                 "--no-progress"]) == 2
    _one_line(capsys, "is both --results and the summary of this command")
    assert not (out / "summary.json").exists()


def _null_device(path: Path) -> Path | None:
    """A character device like /dev/null at `path` (as root; None where this process may not make or open one):
    never the system's own, which a broken implementation would replace for the whole machine."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        os.close(os.open(path, os.O_WRONLY))
    except OSError:
        return None
    return path


def test_a_device_or_fifo_at_the_output_is_written_in_place_never_replaced(tmp_path):
    device = _null_device(tmp_path / "null")
    if device is not None:  # as root, a rename replaced it (`--results /dev/null` replaced the system's)
        atomic_write(device, lambda tmp: tmp.write_text("x"))
        assert device.is_char_device()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="a FIFO that nobody reads"):
        atomic_write(fifo, lambda tmp: tmp.write_text("lost"))
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    for _ in range(200):  # the reader's open; atomic_write refuses a FIFO nobody reads rather than wait
        try:
            atomic_write(fifo, lambda tmp: tmp.write_text("rows\n"))
            break
        except OSError:
            threading.Event().wait(0.05)
    reader.join()
    assert got == ["rows\n"] and fifo.is_fifo()


def test_a_symlink_to_a_pipe_is_written_through_and_one_to_another_device_refused(tmp_path):
    fifo, link = tmp_path / "fifo", tmp_path / "stdout"
    os.mkfifo(fifo)
    link.symlink_to(fifo)  # /dev/stdout or `>(cmd)`'s /dev/fd/63: as root, a rename replaced /dev/stdout
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    for _ in range(200):
        try:
            atomic_write(link, lambda tmp: tmp.write_text("rows\n"))
            break
        except OSError:
            threading.Event().wait(0.05)
    reader.join()
    assert got == ["rows\n"] and link.is_symlink()
    if Path("/dev/zero").is_char_device():  # a link planted in an output folder may not aim a write at a device
        (tmp_path / "zero").symlink_to("/dev/zero")
        with pytest.raises(OSError, match="is a symlink to a device"):
            atomic_write(tmp_path / "zero", lambda tmp: tmp.write_text("x"))
        assert (tmp_path / "zero").is_symlink()


# ------------------------------------------------------------------------------------------ 2: listing caches
def _class_tar(tmp_path: Path, members: dict[str, bytes]) -> Path:
    return _tar_of(tmp_path / "data.tar", members)


def test_a_cached_tar_listing_is_checked_against_each_members_header(tmp_path):
    members = {f"train/{c}/{i}.JPEG": _jpeg(10 * k + i) for k, c in enumerate(CLASSES) for i in range(2)}
    tar = _class_tar(tmp_path, members)
    cache = tmp_path / "run"
    records = open_source(f"folder:{tar}", index_cache=cache).records("train")
    first = [records[i] for i in range(len(records))]
    (saved,) = (cache / "data_index").glob("tar-*.npz")
    with np.load(saved) as arrays:
        arrays = {name: arrays[name] for name in arrays.files}
    arrays["data_offsets"] = arrays["data_offsets"][::-1].copy()  # offsets reversed, names kept
    np.savez(saved, **arrays)
    tampered = open_source(f"folder:{tar}", index_cache=cache).records("train")
    with pytest.raises(ConfigError, match="not train/n01440764/0.JPEG .* as listed"):
        tampered[0]
    # the tar rewritten with its size and time kept (cp -p, rsync, touch -d): the old offsets are another member's
    before = tar.stat()
    _tar_of(tar, dict(reversed(members.items())))
    os.utime(tar, ns=(before.st_atime_ns, before.st_mtime_ns))
    saved.unlink()
    assert open_source(f"folder:{tar}", index_cache=cache).records("train")[0] == first[0]  # listed again
    _tar_of(tar, members)
    os.utime(tar, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert tar.stat().st_size == before.st_size
    with pytest.raises(ConfigError, match="rewritten since it was listed"):
        open_source(f"folder:{tar}", index_cache=cache).records("train")[0]


def test_a_folder_caches_labels_come_from_its_names_never_from_stored_numbers(tmp_path):
    from resmlp.data.sources.imagenet import PackedNames, _restore

    split = tmp_path / "train"
    for c in CLASSES:
        (split / c).mkdir(parents=True)
        (split / c / "a.JPEG").write_bytes(_jpeg(0))
    names = PackedNames.pack([f"{c}/a.JPEG" for c in CLASSES])
    folders = PackedNames.pack(["", *CLASSES])
    mtimes = np.asarray([os.stat(split / f).st_mtime_ns for f in ["", *CLASSES]], np.int64)
    saved = {"buffer": names.buffer, "offsets": names.offsets, "labels": np.zeros(2, np.int64),  # all set to 0
             "folder_buffer": folders.buffer, "folder_offsets": folders.offsets, "mtimes": mtimes}
    assert _restore(saved, split, list(CLASSES)).labels.tolist() == [0, 1]
    assert _restore(saved, split, ["other", "names"]) is None  # names outside the classes: listed again


# ------------------------------------------------------------------------------------------ 3, 4: shard folders
def _shard(path: Path, records: int, label: int = 0) -> Path:
    with tarfile.open(path, "w") as tar:
        for i in range(records):
            for suffix, data in (("jpg", _jpeg(i)), ("cls", str(label).encode())):
                member = tarfile.TarInfo(f"{i:06d}.{suffix}")
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    return path


def _info(folder: Path, splits: dict[str, tuple[list[str], list[int]]]) -> None:
    (folder / "_info.json").write_text(json.dumps({"splits": {
        name: {"filenames": names, "shard_lengths": lengths} for name, (names, lengths) in splits.items()}}))


def test_shard_info_whose_validation_names_training_shards_is_refused(tmp_path):
    _shard(tmp_path / "a.tar", 2)
    _shard(tmp_path / "b.tar", 2)
    _info(tmp_path, {"train": (["a.tar", "b.tar"], [2, 2]), "validation": (["b.tar"], [2])})
    with pytest.raises(DataError, match="shard b.tar is in both the train and the val split"):
        open_source(f"wds:{tmp_path}")


def test_shard_info_lengths_are_bounded_by_the_shards_bytes(tmp_path):
    _shard(tmp_path / "a.tar", 2)
    _info(tmp_path, {"train": (["a.tar"], [10 ** 30])})  # an OverflowError before
    with pytest.raises(DataError, match="holds 1,000,000,000,000,000,000,000,000,000,000 records, more than"):
        open_source(f"wds:{tmp_path}")


def test_a_linked_shard_is_followed_as_info_and_patterns_follow_it_and_a_dangling_one_named(tmp_path):
    shards, elsewhere = tmp_path / "shards", tmp_path / "elsewhere"
    shards.mkdir()
    elsewhere.mkdir()
    _shard(shards / "x-train-0.tar", 2)
    (shards / "x-train-1.tar").symlink_to(_shard(elsewhere / "real.tar", 3))  # skipped without a word before
    assert len(open_source(f"wds:{shards}", index_cache=str(tmp_path / "run")).records("train")) == 5
    (shards / "x-train-2.tar").symlink_to(elsewhere / "gone.tar")
    with pytest.raises(DataError, match="x-train-2.tar .* is not a regular file nor a link to one"):
        open_source(f"wds:{shards}")


def test_the_mid_epoch_shard_fingerprint_sees_a_rewrite_within_the_second(tmp_path):
    from resmlp.data.sources.wds import ShardFiles

    shard = _shard(tmp_path / "a.tar", 1)
    os.utime(shard, ns=(10**18, 10**18 + 100))
    files = ShardFiles([str(shard)], [1], ["0"], None, "test")
    before = files.fingerprint()
    os.utime(shard, ns=(10**18, 10**18 + 900_000_000))  # the same whole second
    assert files.fingerprint() != before


def test_a_census_caches_largest_label_is_bounded_before_a_class_list_is_made(tmp_path):
    shard = _shard(tmp_path / "a.tar", 2, label=2)
    cache = tmp_path / "run"
    assert wds_census.census([str(shard)], cache) == ([2], 2)
    (saved,) = (cache / "data_index").glob("wds-census-*.npz")
    np.savez(saved, counts=np.asarray([2], np.int64), largest=np.asarray([10 ** 12], np.int64))
    assert wds_census.census([str(shard)], cache) == ([2], 2)  # counted again, not 10**12 + 1 class names


def test_a_resumed_model_that_no_longer_fits_the_datas_classes_is_one_line():
    from resmlp.train.state import check_same_shapes

    trainer = SimpleNamespace(model=torch.nn.Linear(4, 3), state_path="OUT/last.pth")
    with pytest.raises(ValueError, match=r"weight is \(5, 4\), but the one built for the data now is \(3, 4\): the "
                                         "data's classes changed"):
        check_same_shapes(trainer, torch.nn.Linear(4, 5).state_dict())


def test_a_confusion_matrix_is_bounded_by_its_cells_not_by_the_class_list():
    from resmlp.evaluation import MAX_CONFUSION_CELLS, classify

    classes = 3000  # 9 M cells, under MAX_CLASSES: 72 MB of int64 before, 100,000 classes 74.5 GiB
    assert classes * classes > MAX_CONFUSION_CELLS
    weights = torch.zeros(classes, 2)
    weights[7, 0] = weights[9, 1] = 1.0
    model = torch.nn.Linear(2, classes, bias=False)
    model.weight.data = weights
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    result = classify(model, [(images, torch.tensor([7, 9, 9]), 0)], classes, torch.device("cpu"), "fp32")
    assert result["confusion"] is None and result["top1"] == pytest.approx(200 / 3)
    assert result["class_hits"][[7, 9]].tolist() == [1, 1] and result["class_images"][[7, 9]].tolist() == [1, 2]


# ------------------------------------------------------------------------------------------ 5: ReaL, valid labels
def test_real_labels_are_bounded_when_read_and_a_file_scoring_no_image_is_refused(tmp_path):
    from resmlp.eval_extras import read_real_labels

    (tmp_path / "huge.json").write_text(json.dumps([[2 ** 63 - 1], [0]]))  # an OverflowError after the evaluation
    with pytest.raises(DataError, match=f"below {MAX_CLASSES:,}"):
        read_real_labels(tmp_path / "huge.json")
    (tmp_path / "none.json").write_text("[[], [], []]")  # ReaL 0.0, exit 0 before
    with pytest.raises(DataError, match="none of its 3 images has a valid label"):
        read_real_labels(tmp_path / "none.json")


def test_real_labels_match_images_by_the_number_in_their_name_and_say_how_many_were_left_out(tmp_path):
    from resmlp.eval_extras import EvalExtras, real_order

    names = ["a_ILSVRC2012_val_00000002.JPEG", "b_ILSVRC2012_val_00000003.JPEG", "c_ILSVRC2012_val_00000001.JPEG"]
    assert real_order(names).tolist() == [2, 0, 1]  # entry i: the image numbered i + 1 (by sorted name: 0, 1, 2)
    with pytest.raises(DataError, match="include ILSVRC2012_val_00000004.JPEG"):  # one missing: by position, shifted
        real_order([*names[:2], "ILSVRC2012_val_00000004.JPEG"])
    (tmp_path / "real.json").write_text("[[4], [], [5]]")
    extras = EvalExtras.read(real_labels=tmp_path / "real.json")
    # entry 0 is image ..01 (index 2): right at top-1; entry 2 is image ..03 (index 1): right at top-2 only
    top = np.asarray([[4, 5, 2, 3, 6], [1, 5, 2, 3, 4], [4, 1, 2, 3, 6]])
    extras.recorder = SimpleNamespace(read=lambda: (top, np.zeros(top.shape, np.float32)))
    with pytest.warns(UserWarning, match="1 of 3 images have no valid label"):
        out = extras.finish(names, [0, 0, 0], [str(i) for i in range(7)], 7, 0)
    assert out["real_left_out"] == 1 and out["real_top1"] == pytest.approx(50.0) and out["real_top5"] == 100.0


# ------------------------------------------------------------------------------------------ 6, 8: tars of class tars
def _downloads(tmp_path: Path, classes: tuple[str, ...], links: dict[str, str] | None = None) -> Path:
    class_tars = {f"{c}.tar": _tar_of(tmp_path / f"{c}.tar", {f"{c}_{i}.JPEG": _jpeg(i) for i in range(2)})
                  .read_bytes() for c in classes}
    return _tar_of(tmp_path / "ILSVRC2012_img_train.tar", class_tars, links)


def test_a_linked_class_tar_is_refused_as_a_linked_class_folder_is(tmp_path):
    tar = _downloads(tmp_path, CLASSES, {"n09999999.tar": "/etc/passwd"})  # dropped with its class before
    with pytest.raises(DataError, match=r"member n09999999\.tar .*is a link, device or FIFO"):
        open_source(f"folder:{tar}")


def test_imagenets_training_tar_holding_other_than_1000_class_tars_says_so(tmp_path):
    tar = _downloads(tmp_path, CLASSES)
    with pytest.warns(UserWarning, match="holds 2 class tars, not ImageNet-1k's 1,000"):
        assert open_source(f"folder:{tar}").records("train").class_names == list(CLASSES)


def test_a_truncated_jpeg_is_skipped_with_its_file_name(recwarn):
    from resmlp.data.device.decode import encoded_item

    whole = _jpeg(0, (64, 64))
    assert encoded_item(whole, 0, (0, 0, 0, 0), "whole.JPEG", 3, None)[1] is True  # decoded on the device
    # cut short: its header reads, so it went to the device, where the failure lost its name
    assert encoded_item(whole[:len(whole) // 2], 0, (0, 0, 0, 1), "n01/cut.JPEG", 3, None) is None
    assert any("skipping unreadable image n01/cut.JPEG" in str(w.message) for w in recwarn.list)


# ------------------------------------------------------------------------------------------ 7: the device path on CPU
def test_a_one_pixel_image_batched_with_a_large_one_gets_a_crop_of_at_least_one_pixel():
    from resmlp.data.device.augment import DeviceAugment, crop_boxes, uniforms

    boxes = crop_boxes(uniforms(range(200), 23), np.ones(200), np.ones(200), (0.08, 1.0), (3 / 4, 4 / 3))
    assert (boxes[:, 2:] == 1).all() and (boxes[:, :2] == 0).all()  # 0 x 0 boxes before (timm's rounding)
    augment = DeviceAugment(16, 3, (0.5,) * 3, (0.25,) * 3)
    images = [torch.zeros(3, 1, 1, dtype=torch.uint8), torch.zeros(3, 3000, 3000, dtype=torch.uint8)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = augment(images, [3, 4])  # interpolate asked for a 0x0 input before: a traceback
    assert out.shape == (2, 3, 16, 16) and torch.isfinite(out).all()


# ------------------------------------------------------------------------------------------ the benchmark's rows
@pytest.mark.parametrize("rows", ["I55 2", "I55 6"])
def test_the_adversarial_benchmarks_round5_rows_run_and_pass(rows):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "adversarial.py"), "-k", rows, "--markdown"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(root / "src")})
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line for line in done.stdout.splitlines() if line.startswith(f"| {rows} ")]
    assert table and all("| yes |" in line for line in table), done.stdout
    assert f"{len(table)} of {len(table)} cases handled cleanly" in done.stderr

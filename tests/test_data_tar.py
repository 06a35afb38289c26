"""`folder:FILE.tar`: a tar of an ImageNet-layout folder read in place (resmlp.data.sources.imagenet_tar): the
same records, labels and classes as the extracted folder, read by offset in DataLoader workers, trained on and
evaluated; and hostile tars (truncated, `..` names, link members, no class folders, compressed) refused in one line."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from resmlp.cli import main
from resmlp.data.per_image.decoded import load
from resmlp.data.records import SourceSpec
from resmlp.data.sources import open_source, parse_source
from resmlp.errors import DataError

CLASSES = ("n01440764", "n01443537")
TINY = {
    "data.num_workers": 0, "data.crop_pct": 1.0, "data.scale": [0.6, 1.0], "data.ratio": [1.0, 1.0],
    "model.img_size": 16, "model.patch_size": 8, "model.dim": 16, "model.depth": 1, "model.in_chans": 3,
    "schedule.epochs": 1, "schedule.warmup_epochs": 0, "train.batch_size": 8, "train.progress": False,
    "train.threads": 1, "train.compile": False, "train.amp": "none", "data.mean": [0.5, 0.5, 0.5],
    "data.std": [0.25, 0.25, 0.25], "train.device": "cpu", "data.repeated_aug": 0,
}


def _jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


def _folder(root: Path, raw_val: bool = False) -> Path:
    """train/<class>/ (one image in a sub-folder, as list_files walks), and val/<class>/ or the raw flat val."""
    for label, cls in enumerate(CLASSES):
        for i in range(6):
            path = root / "train" / cls / ("sub" if i == 5 else "") / f"{cls}_{i}.JPEG"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(_jpeg(100 * label + i))
        if not raw_val:
            for i in range(2):
                (root / "val" / cls).mkdir(parents=True, exist_ok=True)
                (root / "val" / cls / f"v{i}.JPEG").write_bytes(_jpeg(1000 + 10 * label + i))
    if raw_val:
        (root / "val").mkdir()
        for i in range(4):
            (root / "val" / f"ILSVRC2012_val_{i:08d}.JPEG").write_bytes(_jpeg(2000 + i))
        (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(
            f"ILSVRC2012_val_{i:08d},{CLASSES[i % 2]} 1 2 3 4\n" for i in range(4)))
    return root


def _tar(folder: Path, path: Path, arcname: str = ".") -> Path:
    with tarfile.open(path, "w") as tar:
        tar.add(folder, arcname=arcname)
    return path


def _members(path: Path, members: dict[str, bytes | None], links: dict[str, str] | None = None) -> Path:
    """A tar written member by member: a None payload is a folder; `links` {name: target} are symlinks."""
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return path


def _data_end(path: Path) -> int:
    """Where the last member's data (padded to a block) ends: the archive cut there has whole members only."""
    with tarfile.open(path) as tar:
        last = tar.getmembers()[-1]
    return -(-(last.offset_data + last.size) // 512) * 512


@pytest.mark.parametrize("raw_val", [False, True])
@pytest.mark.parametrize("arcname", [".", "imagenet"])  # members ./train/... or under one top folder
def test_the_tar_gives_the_extracted_folders_records(tmp_path, raw_val, arcname):
    folder = _folder(tmp_path / "imagenet", raw_val)
    tar = _tar(folder, tmp_path / "imagenet.tar", arcname)
    from_folder, from_tar = open_source(f"folder:{folder}"), open_source(f"folder:{tar}")
    assert parse_source(str(tar)) == SourceSpec("folder", str(tar))  # --data FILE.tar, as --data DIR
    assert from_tar.splits == from_folder.splits == ("train", "val")
    for split in ("train", "val"):
        want, got = from_folder.records(split), from_tar.records(split)
        assert got.class_names == want.class_names == list(CLASSES)
        assert got.labels.tolist() == want.labels.tolist() and len(got) == len(want) == (12 if split == "train" else 4)
        assert all(got[i][0] == want[i][0] for i in range(len(want)))  # same bytes, same order
        assert got.name(0).startswith(f"{tar}:") and got.name(0).endswith(want.name(0)[len(str(folder)) + 1:])
        kept = np.array([3, 0])
        assert [r[0] for r in got.subset(kept)] == [want[int(i)][0] for i in kept]


def test_dataloader_workers_read_the_right_bytes_each_with_its_own_descriptor(tmp_path):
    folder = _folder(tmp_path / "d")
    records = open_source(f"folder:{_tar(folder, tmp_path / 'd.tar')}").records("train")
    want = open_source(f"folder:{folder}").records("train")
    records.payload(0)  # the parent opens its descriptor before the fork: the workers must not use it
    loader = torch.utils.data.DataLoader(records, batch_size=None, num_workers=2, multiprocessing_context="fork")
    got = [(payload, label) for payload, label in loader]
    assert got == [want[i] for i in range(len(want))]
    opened = torch.utils.data.DataLoader(_Opener(records), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    owners = {tuple(pair) for pair in opened}
    assert len(owners) == 2 and all(owner == worker != os.getpid() for owner, worker in owners)
    assert records.__getstate__()["_fd"] is None  # a spawned worker's pickled copy opens its own


class _Opener(torch.utils.data.Dataset):
    """Which process opened the descriptor that read each record, and which process read it."""

    def __init__(self, records) -> None:
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[int, int]:
        self.records.payload(index)
        return self.records._pid, os.getpid()


@pytest.mark.parametrize("layout", ["tar", "downloads"])
def test_train_and_eval_from_a_tar(tmp_path, layout):
    if layout == "tar":
        tar = _tar(_folder(tmp_path / "imagenet", raw_val=True), tmp_path / "imagenet.tar", "imagenet")
    else:
        tar = _imagenet_downloads(tmp_path / "downloads")
    recipe = {**TINY, "data.source": f"folder:{tar}", "train.batch_size": 8 if layout == "tar" else 4}
    sets = [a for k, v in recipe.items() for a in ("--set", f"{k}={json.dumps(v)}")]
    assert main(["train", "--recipe", "deit", "--output", str(tmp_path / "run"), *sets]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["validation"] == "the dataset's val split"
    assert len(list((tmp_path / "run" / "data_index").glob("tar-*.npz"))) == (1 if layout == "tar" else 2)
    assert main(["eval", str(tmp_path / "run"), "--output", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["images"] == 4


def test_a_truncated_tar_is_one_line_at_listing_and_a_changed_one_skips_the_member(tmp_path):
    whole = _tar(_folder(tmp_path / "d"), tmp_path / "d.tar").read_bytes()
    header = int(open_source(f"folder:{tmp_path / 'd.tar'}").records("train").offsets[3]) - 512
    # inside a member's data; at a member's header (tarfile stops quietly there); inside a header
    for cut, why in ((header + 512 + 7, "is truncated: member .* ends at byte"), (header, "truncated"),
                     (header + 100, "truncated"), (_data_end(tmp_path / "d.tar"), "without the end-of-archive block")):
        (tmp_path / "cut.tar").write_bytes(whole[:cut])
        with pytest.raises(DataError, match=f"cut.tar .*{why}"):
            open_source(f"folder:{tmp_path / 'cut.tar'}")
    (tmp_path / "changed.tar").write_bytes(whole)
    records = open_source(f"folder:{tmp_path / 'changed.tar'}").records("train")
    end = int(records.offsets[-1])
    (tmp_path / "changed.tar").write_bytes(whole[:end + 5])  # cut after listing: that member is unreadable
    assert records[0][0] == open_source(f"folder:{tmp_path / 'd'}").records("train")[0][0]
    with pytest.raises(DataError, match=r"is truncated: 5 of \d+ bytes"):
        records.payload(len(records) - 1)
    with pytest.warns(UserWarning, match="skipping unreadable image .*changed.tar:train/"):
        assert load(records, len(records) - 1, "RGB", None, None) is None  # skipped, then counted by collate


def test_hostile_members_are_refused_in_one_line(tmp_path):
    image = _jpeg(0)
    good = {f"train/{c}/{i}.JPEG": image for c in CLASSES for i in range(2)}
    with pytest.raises(DataError, match=r"member '\.\./x\.jpg' names a path outside the archive"):
        open_source(f"folder:{_members(tmp_path / 'dots.tar', {**good, '../x.jpg': image})}")
    with pytest.raises(DataError, match="outside the archive"):
        open_source(f"folder:{_members(tmp_path / 'abs.tar', {**good, '/etc/x.jpg': image})}")
    link = _members(tmp_path / "link.tar", good, {f"train/{CLASSES[0]}/evil.JPEG": "/etc/passwd"})
    with pytest.raises(DataError, match=r"evil\.JPEG .*is a link, device or FIFO.*tar -h"):
        open_source(f"folder:{link}")
    hard = tarfile.TarInfo(f"train/{CLASSES[1]}/twin.JPEG")
    hard.type, hard.linkname = tarfile.LNKTYPE, f"train/{CLASSES[0]}/0.JPEG"
    with tarfile.open(_members(tmp_path / "hard.tar", good), "a") as tar:
        tar.addfile(hard)
    with pytest.raises(DataError, match=r"twin\.JPEG .*is a link, device or FIFO.*--hard-dereference"):
        open_source(f"folder:{tmp_path / 'hard.tar'}")
    with pytest.raises(DataError, match=r"has no train/ folder .*inside"):
        open_source(f"folder:{_members(tmp_path / 'none.tar', {'images/a.JPEG': image, 'readme.txt': b'x'})}")
    flat = _members(tmp_path / "flat.tar", {"train/a.JPEG": image, "train/b.JPEG": image})
    with pytest.raises(ValueError, match="has no class sub-folders"):
        open_source(f"folder:{flat}").records("train")
    empty = _members(tmp_path / "empty.tar", {**good, "train/n09999999": None})
    with pytest.raises(ValueError, match="class folder.* with no images in .*: n09999999"):
        open_source(f"folder:{empty}").records("train")
    synonyms = _members(tmp_path / "two.tar", {**good, "val/x/1.JPEG": image, "validation/x/1.JPEG": image})
    with pytest.raises(DataError, match="val/ and validation/: both name the val split"):
        open_source(f"folder:{synonyms}")
    raw_val = _members(tmp_path / "raw.tar", {**good, "val/ILSVRC2012_val_00000001.JPEG": image})
    with pytest.raises(DataError, match="holds 1 images but no class folders and no ground-truth file"):
        open_source(f"folder:{raw_val}").records("val")
    with tarfile.open(tmp_path / "d.tar.gz", "w:gz") as tar:
        tar.add(_folder(tmp_path / "d"), arcname=".")
    with pytest.raises(DataError, match="gzip-compressed.*decompress it first"):
        open_source(f"folder:{tmp_path / 'd.tar.gz'}")


def test_the_cli_refuses_a_hostile_tar_in_one_line(tmp_path, capsys):
    tar = _members(tmp_path / "dots.tar", {"train/n01/a.JPEG": _jpeg(0), "../x.jpg": _jpeg(1)})
    code = main(["train", "--recipe", "deit", "--output", str(tmp_path / "run"), "--data", f"folder:{tar}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "outside the archive" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "run" / "summary.json").exists()


def _tar_of(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _imagenet_downloads(root: Path) -> Path:
    """ImageNet as it ships, in miniature: ILSVRC2012_img_train.tar (one tar per class, flat JPEGs),
    ILSVRC2012_img_val.tar (flat JPEGs) and LOC_val_solution.csv beside them."""
    root.mkdir()
    class_tars = {}
    for label, cls in enumerate(CLASSES):
        inner = _tar_of(root / f"{cls}.tar", {f"{cls}_{i}.JPEG": _jpeg(100 * label + i) for i in (3, 1, 2)})
        class_tars[f"{cls}.tar"] = inner.read_bytes()
        inner.unlink()
    _tar_of(root / "ILSVRC2012_img_train.tar", dict(reversed(class_tars.items())))  # any member order
    _tar_of(root / "ILSVRC2012_img_val.tar", {f"ILSVRC2012_val_{i:08d}.JPEG": _jpeg(2000 + i) for i in range(4)})
    (root / "LOC_val_solution.csv").write_text("ImageId,PredictionString\n" + "".join(
        f"ILSVRC2012_val_{i:08d},{CLASSES[i % 2]} 1 2 3 4\n" for i in range(4)))
    return root


def _extracted(downloads: Path, root: Path) -> Path:
    """What ImageNet's extraction instructions make of the downloads: train/<class>/, the flat val/."""
    with tarfile.open(downloads / "ILSVRC2012_img_train.tar") as outer:
        for member in outer.getmembers():
            with tarfile.open(fileobj=outer.extractfile(member)) as inner:
                inner.extractall(root / "train" / member.name[:-4], filter="data")
    with tarfile.open(downloads / "ILSVRC2012_img_val.tar") as val:
        val.extractall(root / "val", filter="data")
    (root / "LOC_val_solution.csv").write_bytes((downloads / "LOC_val_solution.csv").read_bytes())
    return root


def test_imagenets_downloads_read_in_place_give_the_extracted_folders_records(tmp_path):
    downloads = _imagenet_downloads(tmp_path / "downloads")
    folder = open_source(f"folder:{_extracted(downloads, tmp_path / 'imagenet')}")
    for source in (open_source(f"folder:{downloads}"), open_source(str(downloads / "ILSVRC2012_img_train.tar"))):
        for split in source.splits:
            want, got = folder.records(split), source.records(split)
            assert got.class_names == want.class_names == list(CLASSES)
            assert got.labels.tolist() == want.labels.tolist() and len(got) == len(want) == (6 if split == "train"
                                                                                            else 4)
            assert all(got[i][0] == want[i][0] for i in range(len(want)))  # same bytes, same order
    assert open_source(f"folder:{downloads}").splits == ("train", "val")
    (downloads / "LOC_val_solution.csv").unlink()
    with pytest.raises(DataError, match=r"ILSVRC2012_img_val\.tar holds the flat validation images but .* no "
                                        r"ground truth: add LOC_val_solution\.csv or val\.txt"):
        open_source(f"folder:{downloads}").records("val")


def test_a_tars_listing_is_cached_until_the_tar_changes_and_checked_when_read(tmp_path, monkeypatch):
    import resmlp.data.sources.imagenet_tar as imagenet_tar

    downloads = _imagenet_downloads(tmp_path / "downloads")
    run = tmp_path / "run"
    first = open_source(f"folder:{downloads}", index_cache=run).records("train")
    assert len(list((run / "data_index").glob("tar-*.npz"))) == 1  # the val tar is listed only when read
    real = imagenet_tar._read_listing
    monkeypatch.setattr(imagenet_tar, "_read_listing", lambda tar: pytest.fail(f"{tar} listed again"))
    cached = open_source(f"folder:{downloads}", index_cache=run).records("train")
    assert [cached[i] for i in range(len(cached))] == [first[i] for i in range(len(first))]
    (cache,) = (run / "data_index").glob("tar-*.npz")
    with np.load(cache) as saved:
        arrays = {name: saved[name] for name in saved.files}
    arrays["data_offsets"] = arrays["data_offsets"] + (downloads / "ILSVRC2012_img_train.tar").stat().st_size
    np.savez(cache, **arrays)  # members past the tar's end: ignored, listed again
    monkeypatch.setattr(imagenet_tar, "_read_listing", real)
    again = open_source(f"folder:{downloads}", index_cache=run).records("train")
    assert [again[i] for i in range(len(again))] == [first[i] for i in range(len(first))]
    os.utime(downloads / "ILSVRC2012_img_train.tar", ns=(0, 0))
    listed = []
    monkeypatch.setattr(imagenet_tar, "_read_listing", lambda tar: listed.append(tar) or real(tar))
    open_source(f"folder:{downloads}", index_cache=run).records("train")
    assert listed == [str(downloads / "ILSVRC2012_img_train.tar")]


def _good() -> dict[str, bytes]:
    return {f"train/{c}/{i}.JPEG": _jpeg(0) for c in CLASSES for i in range(2)}


def test_sparse_members_are_refused_by_name(tmp_path):
    good = _good()
    sparse = tarfile.TarInfo(f"train/{CLASSES[0]}/holes.JPEG")
    sparse.type, sparse.size = tarfile.GNUTYPE_SPARSE, 0
    with tarfile.open(_members(tmp_path / "sparse.tar", good), "a", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(sparse)
    with pytest.raises(DataError, match=r"member train/n01440764/holes\.JPEG is a GNU sparse file"):
        open_source(f"folder:{tmp_path / 'sparse.tar'}")
    mapped = b"1\n0\n5\n".ljust(512, b"\0") + b"hello"  # pax sparse 1.0: a map, then the fragments
    pax = tarfile.TarInfo(f"train/{CLASSES[1]}/holes.JPEG")
    pax.size = len(mapped)
    pax.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.realsize": "5"}
    with tarfile.open(_members(tmp_path / "pax.tar", good), "a", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(pax, io.BytesIO(mapped))
    with pytest.raises(DataError, match=r"member train/n01443537/holes\.JPEG is a GNU sparse file"):
        open_source(f"folder:{tmp_path / 'pax.tar'}")


def test_a_name_60000_folders_deep_is_refused_before_it_is_split(tmp_path):
    import time

    good, image = _good(), _jpeg(0)
    deep = "train/" + "a/" * 60_000 + "x.JPEG"
    with tarfile.open(_members(tmp_path / "deep.tar", good), "a", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(deep)
        info.size = len(image)
        tar.addfile(info, io.BytesIO(image))
    started = time.perf_counter()  # unbounded, its 60,000 parent folders are 3.6 G characters
    with pytest.raises(DataError, match=r"has a name of 120,012 characters and 60,002 components"):
        open_source(f"folder:{tmp_path / 'deep.tar'}")
    assert time.perf_counter() - started < 2


def test_a_linked_class_folder_is_refused_and_other_links_ignored(tmp_path):
    good = _good()
    linked = _members(tmp_path / "linked.tar", good, {"train/n09999999": "/etc"})
    with pytest.raises(DataError, match=r"member train/n09999999 .*is a link, device or FIFO, not an image file or "
                                        "folder"):
        open_source(f"folder:{linked}")
    readme = _members(tmp_path / "readme.tar", good, {"README.txt": "train/n01440764/0.JPEG"})
    assert len(open_source(f"folder:{readme}").records("train")) == 4  # a link to no folder is ignored


def test_a_class_tar_that_runs_past_its_member_is_refused(tmp_path):
    inner = _tar_of(tmp_path / "n01.tar", {"a.JPEG": _jpeg(0), "b.JPEG": _jpeg(1)}).read_bytes()
    cut = inner[:1024 + 512]  # a's header and data, b's header: b's data lies in the outer tar's next member
    _tar_of(tmp_path / "ILSVRC2012_img_train.tar", {"n01.tar": cut, "n02.tar": inner})
    with pytest.raises(DataError, match=r"ILSVRC2012_img_train\.tar:n01\.tar is truncated"):
        open_source(f"folder:{tmp_path / 'ILSVRC2012_img_train.tar'}")


def test_the_val_download_alone_names_the_folder_to_give(tmp_path):
    downloads = _imagenet_downloads(tmp_path / "downloads")
    with pytest.raises(DataError, match=r"ILSVRC2012_img_val\.tar is ImageNet's validation download .*folder:.*"
                                        r"downloads$"):
        open_source(f"folder:{downloads / 'ILSVRC2012_img_val.tar'}")


def test_ground_truth_inside_a_tar_is_checked_as_a_folders_is(tmp_path):
    truth = "\ufeffILSVRC2012_val_00000001.JPEG 1\nILSVRC2012_val_00000001.JPEG 0\n".encode()
    tar = _members(tmp_path / "raw.tar", {**_good(), "val/ILSVRC2012_val_00000001.JPEG": _jpeg(1), "val.txt": truth})
    with pytest.raises(DataError, match=r"raw\.tar:val\.txt, line 2: ILSVRC2012_val_00000001\.JPEG is labelled "
                                        r"n01440764 here but n01443537 on an earlier line"):
        open_source(f"folder:{tar}").records("val")

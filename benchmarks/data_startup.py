"""Start-up cost of an image folder at ImageNet's scale: ours (resmlp.data folder source) vs timm's
(timm.data.create_dataset -> ImageDataset) vs DeiT's (torchvision ImageFolder), side by side in one run.

Generates CLASSES x IMAGES tiny JPEGs (the issue's size: 1000 x 130 = 130k files, 1/10 of ImageNet-1k), then,
each tool in a fresh process, in turn and repeated (the median is reported):
- listing: seconds to build the training split's dataset, and the os.stat / os.lstat calls it made;
- first batch: seconds from the listing's start to the first batch of a DataLoader with 2 workers (listing,
  workers' start, the first 64 images read and transformed with the same eval transform; imports apart);
- memory: the process's peak RSS, and the private memory each DataLoader worker gains by touching every
  file name of the dataset once (the copy-on-access of Python objects after fork), from /proc smaps_rollup.
The 1.28 M column scales listing time and worker memory linearly with the file count (the stat calls of all
three tools are per class or fixed, not per file).

    python benchmarks/data_startup.py --classes 1000 --images 130 --out benchmarks/results/data_startup.json

With --tar, the start-up of ImageNet's own training download instead: a replica of ILSVRC2012_img_train.tar
(one tar per class inside one tar, CLASSES x IMAGES tiny JPEGs) read in place by `folder:DIR`, each start in a
fresh process: the first start (every header of every class tar read, the listing written to the run's
data_index/) and a cached start (the listing read back, the tar's size and mtime checked). The tar is in the
page cache in both (it was just written); a first start from a cold disk reads the headers from the disk too.

    python benchmarks/data_startup.py --tar --classes 1000 --images 130 --out benchmarks/results/tar_startup.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from resmlp.fileio import write_json

TOOLS = ("ours", "timm", "torchvision")
IMAGENET_FILES = 1_281_167

CHILD = r"""
import json, os, resource, sys, time
tool, root, touch = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
stats = {"n": 0}
for name in ("stat", "lstat"):
    real = getattr(os, name)
    def counted(*a, _real=real, **k):
        stats["n"] += 1
        return _real(*a, **k)
    setattr(os, name, counted)
start = time.perf_counter()
if tool == "ours":
    from resmlp.data.per_image.decoded import decoded
    from resmlp.data.sources import open_source
    make = lambda tf: decoded(open_source("folder:" + root).records("train"), 3, tf)
    names = lambda ds: (ds.records.names[i] for i in range(len(ds)))
elif tool == "timm":
    from timm.data import create_dataset
    make = lambda tf: create_dataset("", root=os.path.join(root, "train"), split="train", transform=tf)
    names = lambda ds: (ds.reader.samples[i][0] for i in range(len(ds)))
else:
    from torchvision.datasets import ImageFolder
    make = lambda tf: ImageFolder(os.path.join(root, "train"), transform=tf)
    names = lambda ds: (ds.samples[i][0] for i in range(len(ds)))
import_done = time.perf_counter()
import torch
from torchvision import transforms
tf = transforms.Compose([transforms.Resize(32), transforms.CenterCrop(32), transforms.ToTensor()])
listing_start = time.perf_counter()
stats["n"] = 0
dataset = make(tf)
listing = time.perf_counter() - listing_start
stat_calls = stats["n"]
def private_kb():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("Private_Dirty", "Private_Clean")))
worker_mb = None
if touch:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a forked worker touching every name once, as a DataLoader worker's sampler would over an epoch
        before = private_kb()
        count = sum(1 for _ in names(dataset))  # each name read once and dropped
        os.write(w, json.dumps([before, private_kb(), count]).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    before, after, _ = json.loads(os.read(r, 1 << 16))
    worker_mb = (after - before) / 1024
def collate(batch):
    return [b for b in batch if b is not None]
loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2, collate_fn=collate)
first = next(iter(loader))
first_batch = time.perf_counter() - listing_start
print(json.dumps({"files": len(dataset), "listing_s": listing, "stat_calls": stat_calls, "first_batch_s": first_batch,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_private_mb": worker_mb, "import_s": import_done - start, "batch": len(first)}))
"""


TAR_CHILD = r"""
import json, sys, time
root, cache = sys.argv[1], sys.argv[2]
start = time.perf_counter()
from resmlp.data.sources import open_source
imported = time.perf_counter()
records = open_source("folder:" + root, index_cache=cache).records("train")
print(json.dumps({"files": len(records), "listing_s": time.perf_counter() - imported, "import_s": imported - start}))
"""


def make_train_tar(root: Path, classes: int, images: int) -> Path:
    """ILSVRC2012_img_train.tar's layout: `n<class>.tar` members, each a tar of IMAGES copies of one tiny JPEG."""
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    jpeg = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(jpeg, "JPEG")
    path = root / "ILSVRC2012_img_train.tar"
    with tarfile.open(path, "x") as outer:  # "x": a fresh file, never through a planted link
        for c in range(classes):
            inner = io.BytesIO()
            with tarfile.TarFile(fileobj=inner, mode="w") as class_tar:  # in memory: no path written
                for i in range(images):
                    _add(class_tar, f"n{c:08d}_{i}.JPEG", jpeg.getvalue())
            _add(outer, f"n{c:08d}.tar", inner.getvalue())
    return path


def _add(tar: Any, name: str, data: bytes) -> None:
    import io
    import tarfile

    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def measure_tar(root: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", TAR_CHILD, str(root), str(cache)], env=env, capture_output=True,
                          text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"tar listing failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def tar_report(root: Path, repeats: int) -> dict:
    """Median first-start and cached-start listing seconds of the training tar under `root`, fresh processes."""
    first, cached = [], []
    for repeat in range(repeats):
        cache = root / f"run-{repeat}"
        shutil.rmtree(cache, ignore_errors=True)
        first.append(measure_tar(root, cache))
        cached.append(measure_tar(root, cache))
    files = first[0]["files"]
    first_s = statistics.median(r["listing_s"] for r in first)
    cached_s = statistics.median(r["listing_s"] for r in cached)
    scale = IMAGENET_FILES / files
    print("| start | listing (s) | at 1.28 M files (s) |\n|---|---|---|")
    for name, seconds in (("first", first_s), ("cached", cached_s)):
        print(f"| {name} | {seconds:.2f} | {seconds * scale:.1f} |")
    return {"files": files, "repeats": repeats, "first_start_s": first_s, "cached_start_s": cached_s,
            "speedup": first_s / cached_s, "tar_bytes": (root / "ILSVRC2012_img_train.tar").stat().st_size,
            "host": host(), "runs": {"first": first, "cached": cached}}


def make_folder(root: Path, classes: int, images: int) -> None:
    """CLASSES x IMAGES copies of one tiny JPEG (the listing, not decoding, is measured), plus a val split."""
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    sample = root / "sample.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(sample)
    data = sample.read_bytes()
    for split, count in (("train", images), ("val", 1)):
        for c in range(classes):
            folder = root / split / f"n{c:08d}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                with open(folder / f"n{c:08d}_{i}.JPEG", "xb") as f:  # a fresh file: never through a planted link
                    f.write(data)


def measure(tool: str, root: Path, touch: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, tool, str(root), "1" if touch else "0"], env=env,
                          capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{tool} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def host() -> dict:
    import torch

    from resmlp.hostinfo import host_info

    return {**host_info("fp32"), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def table(results: dict, files: int) -> str:
    scale = IMAGENET_FILES / files
    rows = ["| tool | listing (s) | os.stat calls | first batch (s) | peak RSS (MB) | worker private MB after touching "
            "every name | at 1.28 M files: listing (s), stat calls, worker MB |", "|---|---|---|---|---|---|---|"]
    for tool, r in results.items():
        worker = r["worker_private_mb"]
        rows.append(f"| {tool} | {r['listing_s']:.2f} | {r['stat_calls']:,} | {r['first_batch_s']:.2f} | "
                    f"{r['peak_rss_mb']:.0f} | {worker:.1f} | {r['listing_s'] * scale:.1f}, {worker * scale:.0f} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--images", type=int, default=130, help="training images per class")
    p.add_argument("--repeats", type=int, default=3, help="runs of each tool, alternated (the median is reported)")
    p.add_argument("--folder", help="generate (or reuse) the folder here (default: a temporary one)")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--tar", action="store_true", help="measure ILSVRC2012_img_train.tar's listing, first vs cached")
    args = p.parse_args()
    if args.tar:
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(args.folder or scratch)
            if not (root / "ILSVRC2012_img_train.tar").is_file():
                started = time.perf_counter()
                make_train_tar(root, args.classes, args.images)
                print(f"generated a tar of {args.classes} class tars, {args.classes * args.images} images, in "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
            report = {"classes": args.classes, "images_per_class": args.images, **tar_report(root, args.repeats)}
        if args.out:
            write_json(args.out, report)
        return
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.folder or scratch)
        if not (root / "train").is_dir():
            started = time.perf_counter()
            make_folder(root, args.classes, args.images)
            print(f"generated {args.classes * args.images} files in {time.perf_counter() - started:.0f} s", flush=True)
        runs = {tool: [] for tool in TOOLS}
        for repeat in range(args.repeats):
            for tool in TOOLS:
                runs[tool].append(measure(tool, root, touch=repeat == 0))
        results = {tool: {key: (statistics.median(r[key] for r in rs) if key.endswith("_s") else rs[0][key])
                          for key in rs[0]} for tool, rs in runs.items()}
    files = results["ours"]["files"]
    report = {"classes": args.classes, "images_per_class": args.images, "files": files, "repeats": args.repeats,
              "host": host(), "results": results,
              "listing_ratio_vs_timm": results["ours"]["listing_s"] / results["timm"]["listing_s"],
              "listing_ratio_vs_torchvision": results["ours"]["listing_s"] / results["torchvision"]["listing_s"]}
    print(table(results, files))
    print(f"listing: ours / timm {report['listing_ratio_vs_timm']:.2f}, ours / torchvision "
          f"{report['listing_ratio_vs_torchvision']:.2f}")
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()

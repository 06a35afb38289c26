"""Start-up of ImageNet-21k read in place (`imagenet21k:PATH`, resmlp.data.sources.imagenet21k): the first start
(every header of every class tar read, the listing written to the run's data_index/) and a cached start (the
listing read back after checking the tar's size and modification time, or each class tar's), each in a fresh
process, median of --repeats.

The replica has ImageNet-21k's shape at a few images per class: CLASSES (21,841: fall11_whole.tar's synsets)
class tars `nXXXXXXXX.tar` of IMAGES copies of one tiny JPEG each, as
- `--form download`: one fall11_whole.tar holding the class tars (the download as it ships), or
- `--form class-tars`: a folder of the class tars (the download extracted once).
The listing's cost grows with the members (headers) and the classes, not with the bytes of the images. The files
were just written, so they are in the page cache; a cold disk adds the reads of the headers.

    python benchmarks/in21k_listing.py --classes 21841 --images 4 --form download --out benchmarks/results/in21k.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

FALL11_CLASSES = 21_841
FALL11_IMAGES = 14_197_122

CHILD = r"""
import json, sys, time
path, cache = sys.argv[1], sys.argv[2]
start = time.perf_counter()
from resmlp.data.sources import open_source
imported = time.perf_counter()
records = open_source("imagenet21k:" + path, index_cache=cache).records("train")
listed = time.perf_counter()
import resource
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"images": len(records), "classes": len(records.class_names), "listing_s": listed - imported,
                  "import_s": imported - start, "peak_rss_mb": peak}))
"""


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def class_tar(wnid: str, jpeg: bytes, images: int) -> bytes:
    inner = io.BytesIO()
    with tarfile.TarFile(fileobj=inner, mode="w") as tar:  # in memory: no path written
        for i in range(images):
            _member(tar, f"{wnid}_{i}.JPEG", jpeg)
    return inner.getvalue()


def make_replica(root: Path, classes: int, images: int, form: str) -> Path:
    """The replica under `root` (see the module doc); the path `imagenet21k:` names."""
    import numpy as np
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(buffer, "JPEG")
    jpeg = buffer.getvalue()
    wnids = [f"n{c:08d}" for c in range(classes)]
    if form == "download":
        path = root / "fall11_whole.tar"
        with tarfile.open(path, "x") as outer:  # "x": a fresh file, never through a planted link
            for wnid in wnids:
                _member(outer, f"{wnid}.tar", class_tar(wnid, jpeg, images))
        return path
    path = root / "fall11_whole"
    path.mkdir()
    for wnid in wnids:
        with open(path / f"{wnid}.tar", "xb") as f:
            f.write(class_tar(wnid, jpeg, images))
    return path


def measure(path: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(cache)], env=env, capture_output=True,
                          text=True, timeout=4 * 3600)
    if done.returncode != 0:
        raise SystemExit(f"listing failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(path: Path, repeats: int, scratch: Path) -> dict:
    first, cached = [], []
    for repeat in range(repeats):
        cache = scratch / f"run-{repeat}"
        shutil.rmtree(cache, ignore_errors=True)
        first.append(measure(path, cache))
        cached.append(measure(path, cache))
    first_s = statistics.median(r["listing_s"] for r in first)
    cached_s = statistics.median(r["listing_s"] for r in cached)
    images = first[0]["images"]
    print(f"| start | listing (s) | peak RSS (MB) |\n|---|---|---|\n"
          f"| first | {first_s:.2f} | {statistics.median(r['peak_rss_mb'] for r in first):.0f} |\n"
          f"| cached | {cached_s:.2f} | {statistics.median(r['peak_rss_mb'] for r in cached):.0f} |")
    print(f"{first[0]['classes']:,} classes, {images:,} images; at fall11's {FALL11_IMAGES:,} images the per-member "
          f"part scales by {FALL11_IMAGES / images:.0f}x")
    return {"classes": first[0]["classes"], "images": images, "repeats": repeats, "first_start_s": first_s,
            "cached_start_s": cached_s, "speedup": first_s / cached_s if cached_s else None,
            "bytes": path.stat().st_size if path.is_file() else None, "runs": {"first": first, "cached": cached}}


def host() -> dict:
    import torch

    from resmlp.hostinfo import host_info

    return {**host_info("fp32"), "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=int, default=FALL11_CLASSES)
    p.add_argument("--images", type=int, default=4, help="images per class tar")
    p.add_argument("--form", choices=("download", "class-tars"), default="download")
    p.add_argument("--repeats", type=int, default=3, help="first + cached starts (the median is reported)")
    p.add_argument("--folder", help="generate (or reuse) the replica here (default: a temporary folder)")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.folder or scratch)
        path = root / ("fall11_whole.tar" if args.form == "download" else "fall11_whole")
        if not path.exists():
            started = time.perf_counter()
            make_replica(root, args.classes, args.images, args.form)
            print(f"generated {args.classes:,} class tars of {args.images} images ({args.form}) in "
                  f"{time.perf_counter() - started:.0f} s", flush=True)
        result = {"form": args.form, "images_per_class": args.images, **report(path, args.repeats, Path(scratch)),
                  "host": host()}
    if args.out:
        from resmlp.fileio import write_json

        write_json(args.out, result)


if __name__ == "__main__":
    main()

"""Shards streamed from servers on loopback against the same shards read locally, and the first start on
shards with timm's _info.json: ours (resmlp's wds: source) against timm's reader (timm.data.create_dataset
"wds/").

Generates IMAGES JPEGs (IMAGE_SIZE px, CLASSES classes; noise smoothed to ImageNet-like file sizes) written as
shards of SHARD_RECORDS by `resmlp data shards`, then, repeated and alternated (the median is reported):
- streaming: images/s and MB/s of one pass over the training shards (one process, no workers; the records
  read, not decoded) from the local folder, from Python's HTTP server with range requests on 127.0.0.1 and
  from moto's S3 server on 127.0.0.1 (tests/remote_servers.py; both servers are Python, so the loopback
  figures bound the client's overhead from above, not a real store's speed);
- first start: seconds from opening the source to the first 64 images decoded, each tool in a fresh process
  (imports apart), on a copy of the train shards with timm's _info.json (shard_lengths and num_classes) and
  no index.json: what item 5 of issue 54 compares (goal: ours <= 1.2x timm's).

    python benchmarks/remote_streaming.py --images 10000 --out benchmarks/results/remote_streaming.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from resmlp.fileio import write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # remote_servers: the test suite's loopback servers

FIRST_START = {
    "resmlp": """
import io, sys, time
from PIL import Image
from resmlp.data.records import StreamPlan
from resmlp.data.sources import open_source
start = time.perf_counter()
records = open_source("wds:" + sys.argv[1]).records("train")
for n, (_, payload, _) in enumerate(records.samples(StreamPlan(seed=0, num_workers=0, batch_size=64))):
    Image.open(io.BytesIO(payload)).convert("RGB").load()
    if n == 63:
        break
print(time.perf_counter() - start)
""",
    "timm": """
import sys, time
from timm.data import create_dataset
start = time.perf_counter()
dataset = create_dataset("wds/bench", root=sys.argv[1], split="train", is_training=True, batch_size=64)
for n, (image, _) in enumerate(dataset):
    image.load()
    if n == 63:
        break
print(time.perf_counter() - start)
""",
}


def make_shards(root: Path, images: int, classes: int, size: int, shard_records: int) -> Path:
    """IMAGES JPEGs in a class folder, then shards with index.json; returns the shard folder."""
    import numpy as np
    from PIL import Image, ImageFilter

    from resmlp.cli import main

    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / "folder" / "train" / f"c{i % classes:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        noise = Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8))
        noise.filter(ImageFilter.GaussianBlur(1.5)).save(folder / f"{i}.JPEG", quality=90)
    args = ["data", "shards", f"folder:{root / 'folder'}", str(root / "shards"), "--shard-records",
            str(shard_records), "--val-size", "0"]
    if main(args) != 0:
        raise SystemExit("resmlp data shards failed")
    return root / "shards"


def timm_copy(shards: Path, out: Path, classes: int) -> Path:
    """The train shards with timm's _info.json (and no index.json)."""
    out.mkdir()
    train = json.loads((shards / "index.json").read_text())["splits"]["train"]
    for shard in train:
        shutil.copy(shards / shard["name"], out)
    write_json(out / "_info.json", {"name": "bench", "num_classes": classes, "splits": {"train": {
        "name": "train", "num_samples": sum(s["samples"] for s in train), "filenames": [s["name"] for s in train],
        "shard_lengths": [s["samples"] for s in train]}}})
    return out


def stream_pass(spec: str, options: object) -> tuple[float, int, int]:
    """(seconds, records, bytes) of one pass over the train split of `spec`."""
    from resmlp.data.records import StreamPlan
    from resmlp.data.sources import open_source

    start = time.perf_counter()
    records = open_source(spec, remote=options).records("train")
    count = size = 0
    for _, payload, _ in records.samples(StreamPlan(seed=0, num_workers=0, batch_size=1)):
        count, size = count + 1, size + len(payload)
    return time.perf_counter() - start, count, size


def streaming(shards: Path, repeats: int) -> dict:
    from remote_servers import http_server, s3_server, upload

    from resmlp.data.sources.remote import RemoteOptions

    results: dict[str, list] = {"local": [], "http": [], "s3": []}
    with http_server(shards) as url, s3_server() as endpoint:
        upload(endpoint, "bench", shards, "wds")
        specs = {"local": (f"wds:{shards}", None), "http": (f"wds:{url}/", RemoteOptions()),
                 "s3": ("wds:s3://bench/wds", RemoteOptions(endpoint_url=endpoint))}
        for _ in range(repeats):
            for name, (spec, options) in specs.items():
                results[name].append(stream_pass(spec, options))
    report = {}
    for name, runs in results.items():
        seconds = statistics.median(r[0] for r in runs)
        report[name] = {"seconds": seconds, "images": runs[0][1], "images_per_s": runs[0][1] / seconds,
                        "mb_per_s": runs[0][2] / seconds / 1e6, "runs_s": [r[0] for r in runs]}
    return report


def first_start(folder: Path, repeats: int) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    runs: dict[str, list[float]] = {tool: [] for tool in FIRST_START}
    for _ in range(repeats):
        for tool, code in FIRST_START.items():
            done = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"{tool}'s first start failed:\n{done.stderr[-2000:]}")
            runs[tool].append(float(done.stdout.strip().splitlines()[-1]))
    report = {tool: {"seconds": statistics.median(r), "runs_s": r} for tool, r in runs.items()}
    report["ratio"] = report["resmlp"]["seconds"] / report["timm"]["seconds"]
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=10000)
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--shard-records", type=int, default=500)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
    from resmlp.fileio import write_json

    with tempfile.TemporaryDirectory(prefix="resmlp-remote-bench-") as tmp:
        shards = make_shards(Path(tmp), args.images, args.classes, args.image_size, args.shard_records)
        report = {"host": {"machine": platform.machine(), "processor": platform.processor(),
                           "cpus": os.cpu_count(), "python": platform.python_version()},
                  "config": vars(args), "streaming": streaming(shards, args.repeats),
                  "first_start": first_start(timm_copy(shards, Path(tmp) / "timm", args.classes), args.repeats)}
    print("| read from | images/s | MB/s |\n|---|---|---|")
    for name, row in report["streaming"].items():
        print(f"| {name} | {row['images_per_s']:.0f} | {row['mb_per_s']:.1f} |")
    first = report["first_start"]
    print(f"first 64 images with _info.json: resmlp {first['resmlp']['seconds']:.2f} s, timm "
          f"{first['timm']['seconds']:.2f} s ({first['ratio']:.2f}x)")
    if args.out:
        write_json(args.out, report)


if __name__ == "__main__":
    main()

"""Data sources: where images come from, as raw records, before any decoding or augmentation.

One grammar names a source (`data.source` in a recipe, `--data` on the command line), as models are named:

    folder:DIR        DIR/{train,val,test}/<class>/<image> (and ImageNet's own layouts,
                      resmlp.data.sources.imagenet)
    folder:FILE.tar   an uncompressed tar of such a folder, or ImageNet's ILSVRC2012_img_train.tar (a tar of
                      class tars), read in place (resmlp.data.sources.imagenet_tar)
    folder:DIR        DIR holding ILSVRC2012_img_train.tar, ILSVRC2012_img_val.tar and LOC_val_solution.csv
                      (or val.txt) as downloaded: read in place too
    wds:PATTERN       WebDataset tar shards (resmlp.data.sources.wds); `{split}` in PATTERN names the split;
                      PATTERN may be an s3://, gs://, http(s):// URL (resmlp.data.sources.wds_remote)
    hf:DIR            a Hugging Face dataset saved with `datasets` (save_to_disk) or parquet files
                      (resmlp.data.sources.hf); or a URL of parquet files, streamed (resmlp.data.sources.hf_remote)
    fashion-mnist[:DIR], cifar10:DIR, cifar100:DIR, synthetic
    imagenetv2:DIR    ImageNet-V2 as released (class folders 0..999), an evaluation set
                      (resmlp.data.sources.imagenet_v2)
    imagenet21k:PATH  fall11_whole.tar / winter21_whole.tar, or its extracted folder, read in place
                      (resmlp.data.sources.imagenet21k)
    flowers102:DIR, stanford-cars:DIR, inat2018:DIR, inat2019:DIR
                      the paper's Table 4 transfer sets in their released layouts (resmlp.data.sources.flowers102,
                      .stanford_cars, .inaturalist)

A `Source` (resmlp.data.records) hands out, per split, raw records `(payload, label)`: the image as stored,
nothing decoded. Which split trains, validates and tests is decided in one place:
resmlp.data.splits.decide_splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from resmlp.data.records import Source, SourceSpec
from resmlp.data.sources.remote import is_url
from resmlp.errors import ConfigError

# the paper's other datasets (ImageNet-V2, ImageNet-21k, Table 4's transfer sets), each a folder as released
PAPER_KINDS = ("imagenetv2", "imagenet21k", "flowers102", "stanford-cars", "inat2018", "inat2019")
KINDS = ("folder", "wds", "hf", "fashion-mnist", "cifar10", "cifar100", "synthetic", *PAPER_KINDS)
# kinds whose argument is required (folder:DIR); the others take an optional one (fashion-mnist[:DIR])
NEEDS_ARGUMENT = ("folder", "wds", "hf", "cifar10", "cifar100", *PAPER_KINDS)


def parse_source(text: str) -> SourceSpec:
    """`KIND[:ARG]` as in the module doc; a bare existing folder is `folder:DIR` (what --data DIR meant), a bare
    existing `.tar` file `folder:FILE.tar`."""
    kind, sep, arg = text.partition(":")
    if kind in KINDS:
        if kind in NEEDS_ARGUMENT and not arg:
            raise ConfigError(f"data source {text!r}: {kind} needs its location, e.g. {kind}:{_EXAMPLES[kind]}")
        return SourceSpec(kind, arg or None)
    if Path(text).is_dir() or (text.endswith(".tar") and Path(text).is_file()):
        return SourceSpec("folder", text)
    kinds = ", ".join(k + ":…" if k in NEEDS_ARGUMENT else k for k in KINDS)
    raise ConfigError(f"data source {text!r} is not one of {kinds} (e.g. folder:/data/imagenet, "
                      "wds:/data/shards/{split}-{000000..000146}.tar, hf:/data/imagenet-hf), nor an existing folder")


_EXAMPLES = {"folder": "/data/imagenet", "wds": "/data/shards/{split}-{000000..000146}.tar",
             "hf": "/data/imagenet-hf", "cifar10": "/data/cifar", "cifar100": "/data/cifar",
             "imagenetv2": "/data/imagenetv2-matched-frequency-format-val", "imagenet21k": "/data/fall11_whole.tar",
             "flowers102": "/data/flowers-102", "stanford-cars": "/data/stanford_cars", "inat2018": "/data/inat2018",
             "inat2019": "/data/inat2019"}


def spec_from_config(source: str | None, kind: str, folder: str | None) -> SourceSpec:
    """The run's source: data.source when set, else the older data.kind + data.dir spelled in the grammar."""
    if source:
        return parse_source(source)
    if kind not in KINDS:
        raise ConfigError(f"data.kind: {kind!r} is not one of {', '.join(KINDS)}; name the data with "
                          "data.source (--data), e.g. folder:/data/imagenet")
    return parse_source(kind if folder is None else f"{kind}:{folder}")


def open_source(spec: SourceSpec | str, **options: Any) -> Source:
    """The source `spec` names. options: in_chans-independent knobs of some kinds (synthetic_size,
    synthetic_classes, img_size, seed for synthetic; class_map for folders; index_cache for folders; remote:
    resmlp.data.sources.remote.RemoteOptions for URLs)."""
    spec = parse_source(spec) if isinstance(spec, str) else spec
    if spec.kind == "folder":  # a tar of the folder, or ImageNet's downloads in a folder
        from resmlp.data.sources.imagenet_tar import reads_in_place, tar_source

        if reads_in_place(Path(spec.arg)):
            return tar_source(spec, class_map=options.get("class_map"), index_cache=options.get("index_cache"))
    if spec.kind == "folder":
        from resmlp.data.sources.imagenet import folder_source

        return folder_source(spec, class_map=options.get("class_map"), index_cache=options.get("index_cache"))
    if spec.kind in ("wds", "hf") and is_url(spec.arg):
        return _remote_source(spec, options)
    if spec.kind == "wds":
        from resmlp.data.sources.wds import wds_source

        return wds_source(spec, length=options.get("length"), class_map=options.get("class_map"),
                          index_cache=options.get("index_cache"))
    if spec.kind == "hf":
        from resmlp.data.sources.hf import hf_source

        return hf_source(spec, streaming=bool(options.get("streaming")), class_map=options.get("class_map"))
    if spec.kind in PAPER_KINDS:
        return _paper_source(spec, options)
    return _array_source(spec, options)


def _paper_source(spec: SourceSpec, options: dict[str, Any]) -> Source:
    """ImageNet-V2, ImageNet-21k and the transfer sets, each read by its own module."""
    if spec.kind == "imagenetv2":
        from resmlp.data.sources.imagenet_v2 import imagenet_v2_source

        return imagenet_v2_source(spec)
    if spec.kind == "imagenet21k":
        from resmlp.data.sources.imagenet21k import imagenet21k_source

        return imagenet21k_source(spec, class_map=options.get("class_map"), index_cache=options.get("index_cache"))
    if spec.kind == "flowers102":
        from resmlp.data.sources.flowers102 import flowers102_source

        return flowers102_source(spec)
    if spec.kind == "stanford-cars":
        from resmlp.data.sources.stanford_cars import stanford_cars_source

        return stanford_cars_source(spec, index_cache=options.get("index_cache"))
    from resmlp.data.sources.inaturalist import inaturalist_source

    return inaturalist_source(spec, int(spec.kind.removeprefix("inat")))


def _remote_source(spec: SourceSpec, options: dict[str, Any]) -> Source:
    """wds: and hf: URLs (resmlp.data.sources.wds_remote, hf_remote), read with options["remote"]."""
    from resmlp.data.records import optional_module
    from resmlp.data.sources.remote import RemoteOptions

    remote = options.get("remote") or RemoteOptions()
    if spec.kind == "wds":
        from resmlp.data.sources.wds_remote import remote_wds_source

        optional_module("webdataset")
        return remote_wds_source(spec, options.get("length"), options.get("class_map"), remote)
    from resmlp.data.sources.hf_remote import remote_hf_source

    return remote_hf_source(spec, options.get("class_map"), remote)


def _array_source(spec: SourceSpec, options: dict[str, Any]) -> Source:
    """Fashion-MNIST, CIFAR and synthetic: arrays read (or made) when a split is first asked for."""
    if spec.kind == "fashion-mnist":
        from resmlp.data.sources.fashion_mnist import fashion_mnist_records

        return Source(spec, {s: (lambda s=s: fashion_mnist_records(s, spec.arg)) for s in ("train", "test")},
                      "fashion-mnist")
    if spec.kind in ("cifar10", "cifar100"):
        from resmlp.data.sources.cifar import cifar_records

        return Source(spec, {s: (lambda s=s: cifar_records(spec.kind, s, spec.arg)) for s in ("train", "test")},
                      spec.kind)
    from resmlp.data.sources.synthetic import synthetic_records

    train_n, val_n = options.get("synthetic_size", (256, 64))
    made = {s: (lambda s=s, n=n: synthetic_records(s, n, options.get("synthetic_classes", 4),
                                                   options.get("img_size", 28), options.get("seed", 0)))
            for s, n in (("train", train_n), ("val", val_n), ("test", val_n))}
    return Source(spec, made, "synthetic")

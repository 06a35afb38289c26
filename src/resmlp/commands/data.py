"""`resmlp data shards`: write WebDataset shards (with their index) from any data source."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="data tools: write WebDataset shards from any source",
                       description="Data tools. `resmlp data shards SRC OUT` writes SRC's splits as WebDataset tar "
                                   "shards with an index, for `--data wds:OUT`.")
    tools = p.add_subparsers(dest="tool", required=True, metavar="TOOL")
    s = tools.add_parser("shards", help="write SRC's splits as shuffled WebDataset shards with an index.json",
                         description="Write every split of SRC (folder:DIR, hf:DIR, fashion-mnist, cifar10:DIR...) as "
                                     "OUT/<split>-NNNNNN.tar shards, shuffled (seeded), plus OUT/index.json. "
                                     "A killed run started again resumes after its last whole shard.")
    s.add_argument("source", metavar="SRC", help="the data source: folder:DIR, hf:DIR, fashion-mnist, cifar10:DIR...")
    s.add_argument("out", metavar="OUT", help="folder for the shards and index.json")
    s.add_argument("--shard-size", default="1GB", help="bytes per shard, e.g. 1GB, 256MB (default 1GB)")
    s.add_argument("--shard-records", type=int, metavar="N",
                   help="at most N records a shard: equal counts keep every worker busy to the epoch's end")
    s.add_argument("--val-size", type=int, default=0, metavar="N",
                   help="a source without a val split (Fashion-MNIST, CIFAR, a folder without val/): carve N records "
                        "from train into val shards, as a training run carves them (default 0: the splits as they are)")
    s.add_argument("--seed", type=int, default=0, help="seed of the record order (default 0)")
    s.add_argument("--class-map", help="a folder source's class map (one class per line)")
    s.set_defaults(run=run_shards)


def run_shards(args: argparse.Namespace) -> int:
    from resmlp.command_files import note_folder_inputs
    from resmlp.data.shards import parse_size, write_shards
    from resmlp.data.sources import open_source

    size = parse_size(args.shard_size)
    for named in (args.source, args.source.partition(":")[2]):  # shards written over the source's would replace it
        note_folder_inputs(named)
    source = open_source(args.source, class_map=args.class_map)
    index = write_shards(source, args.out, size, args.seed, args.shard_records, args.val_size)
    shards = sum(len(v) for v in index["splits"].values())
    records = sum(s["samples"] for v in index["splits"].values() for s in v)
    print(f"wrote {records} records in {shards} shard(s) to {args.out} ({index['skipped_unreadable']} unreadable "
          f"skipped); train with --data wds:{args.out}")
    return 0

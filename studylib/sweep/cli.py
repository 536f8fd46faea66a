"""``studylib sweep SPEC.yaml [--address local|auto|ray://HOST:PORT] [--dry-run] [--resume]``."""

from __future__ import annotations

import argparse
import json


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", help="the sweep's YAML file (profile, chapters, grid or cells, resources, retries)")
    p.add_argument("--address", default=None,
                   help="local (default: start a Ray cluster on this machine's cores), auto (join the cluster "
                        "this machine is part of) or ray://HOST:PORT (a remote cluster through Ray Client)")
    p.add_argument("--dry-run", action="store_true", help="check every cell with reproduce's dry run; Ray is not started")
    p.add_argument("--resume", action="store_true",
                   help="skip cells whose results are up to date (same commit, parameters and model hash)")
    p.add_argument("--cell-timeout", type=float, default=None, help="seconds a notebook cell may run")
    p.add_argument("--json", action="store_true", help="print the sweep record as JSON")


def run(args: argparse.Namespace) -> int:
    from studylib.errors import StudylibError
    from studylib.sweep.run import check, run_sweep
    from studylib.sweep.spec import load_spec

    spec = load_spec(args.spec)
    if args.dry_run:
        bad = check(spec)
        if bad:
            raise StudylibError("\n".join(bad))
        cells = spec.expand()
        print(f"sweep {spec.name}: {len(cells)} cells pass the dry run; results would go to {spec.out_dir()}")
        for c in cells:
            print(f"  {c.name}")
        return 0
    summary = run_sweep(spec, address=args.address, resume=args.resume, cell_timeout=args.cell_timeout)
    if args.json:
        print(json.dumps(summary, default=str))
    else:
        counts: dict[str, int] = {}
        for c in summary["cells"]:
            counts[c["status"]] = counts.get(c["status"], 0) + 1
        print(f"sweep {spec.name}: " + ", ".join(f"{n} {s}" for s, n in counts.items())
              + f" in {summary['seconds']:.0f} s; {spec.out_dir()}")
    return 1 if any(c["status"] == "failed" for c in summary["cells"]) else 0

"""The int8 linear kernel's own time against the bytes it reads: one weight larger than the last-level cache,
called directly (no model, no Python step around it), at a few row counts, on every int8 path this CPU has.

A one-row call that streams W bytes in t seconds reads W / t; set beside `studylib bench probe`'s bandwidth it
says whether the kernel is held by memory or by its own work. ``--candidate FILE`` builds another version of
``int8_linear.c`` (a copy of ``studylib/models/csrc`` with the change, so its headers come along) with the
same flags and times it interleaved with the shipped one, call by call in alternating order, and checks that
it computes the same bits (every path must: the integer sums are exact and the combine is element-wise).

    python benchmarks/int8_kernel_bytes.py [--n 16384] [--k 8192] [--fmt q4_1] [--rows 1,2,8,16]
        [--calls 12] [--candidate /tmp/csrc/int8_linear.c] [--paths avx2,...] [--amx-min-rows 1]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from pathlib import Path

_ARGS = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]


def build(source: Path, path: str):
    """``source`` built as int8 path ``path`` with the flags the shipped kernel uses."""
    from studylib.models import int8_linear as I
    from studylib.models.build import compile_kernel

    fam = I._FAMILY
    flags = ["-O3", *fam.flags[path], f"-D{fam.define}={fam.paths[::-1].index(path)}", "-ffp-contract=off",
             "-fopenmp", "-shared", "-fPIC", "-lm"]
    so = ctypes.CDLL(str(compile_kernel(source, flags, deps=tuple(sorted(source.parent.glob("*.h"))))))
    so.i8_linear.argtypes, so.i8_linear.restype = _ARGS, ctypes.c_int
    return so


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--k", type=int, default=8192)
    p.add_argument("--fmt", default="q4_1", choices=["q4_0", "q4_1", "q8_0"])
    p.add_argument("--rows", default="1,2,8,16")
    p.add_argument("--calls", type=int, default=12)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--paths", default="", help="int8 paths, comma-separated (default: every one this CPU has but scalar)")
    p.add_argument("--candidate", default=None, help="another int8_linear.c to time beside the shipped one")
    p.add_argument("--amx-min-rows", type=int, default=None,
                   help="the fewest rows for the amx builds' tiles (1: tiles at every row count; default: the build's)")
    args = p.parse_args(argv)
    if args.k % 32 or args.n < 1 or args.calls < 3 or (args.amx_min_rows is not None and args.amx_min_rows < 1):
        print("int8_kernel_bytes: --k must be a multiple of 32, --n >= 1, --calls >= 3 and --amx-min-rows >= 1",
              file=sys.stderr)
        return 2
    if args.candidate and not Path(args.candidate).is_file():
        print(f"int8_kernel_bytes: no file {args.candidate}; give a copy of studylib/models/csrc/int8_linear.c",
              file=sys.stderr)
        return 2

    import torch

    from studylib.models import int8_linear as I
    from studylib.models.quant import quantize

    torch.set_num_threads(args.threads)
    paths = [x for x in args.paths.split(",") if x] or [x for x in I.available() if x != "scalar"]
    shipped = I._FAMILY.source
    qt = quantize(torch.randn(args.n, args.k) * 0.02, args.fmt)
    wp = I.pack(qt)
    code = I.CODES[args.fmt]
    print(f"{args.fmt} {args.n}x{args.k}: {wp.numel() / 1e6:.1f} MB packed, {args.threads} threads")
    for path in paths:
        arms = {"shipped": build(shipped, path)}
        if args.candidate:
            arms["candidate"] = build(Path(args.candidate), path)
        for so in arms.values():  # a build without the switch (an older candidate) keeps its own rule
            if args.amx_min_rows is not None and path == "amx" and hasattr(so, "i8_set_amx_min_rows"):
                so.i8_set_amx_min_rows(args.amx_min_rows)
        for m in (int(r) for r in args.rows.split(",")):
            x = torch.randn(m, args.k)
            times: dict[str, list[float]] = {a: [] for a in arms}
            outs = {}
            for call in range(args.calls):
                order = list(arms) if call % 2 == 0 else list(arms)[::-1]
                for a in order:
                    y = torch.empty(m, args.n)
                    t = time.perf_counter()
                    if arms[a].i8_linear(code, x.data_ptr(), args.k, wp.data_ptr(), None, y.data_ptr(), m, args.k,
                                         args.n, args.threads):
                        raise SystemExit(f"i8_linear failed ({a}, {path})")
                    times[a].append(time.perf_counter() - t)
                    outs[a] = y
            cells = []
            for a, v in times.items():
                med = statistics.median(v[2:])  # the first two calls warm the caches and the thread pool
                cells.append(f"{a} {med * 1e3:.3f} ms = {wp.numel() / med / 1e9:.1f} GB/s, "
                             f"{m * args.n * args.k / med / 1e9:.0f} G multiply-adds/s")
            same = "" if len(outs) < 2 else f"; same bits: {torch.equal(outs['shipped'], outs['candidate'])}"
            print(f"{path:>10} {m:>3} rows: " + " | ".join(cells) + same)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

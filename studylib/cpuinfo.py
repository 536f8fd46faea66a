"""The CPU's instruction-set flags, read once from /proc/cpuinfo (torch-free, so provenance can use it).

Kernels choose their build from these at run time (``models.cpu_linear``, ``models.quant``,
``attention.quest``); reports record them (``bench.provenance.cpu_isa``)."""

from __future__ import annotations

import functools
from pathlib import Path


def parse_flags(cpuinfo: str) -> frozenset[str]:
    """The first ``flags`` line of /proc/cpuinfo text, as a set (empty where there is none, e.g. ARM)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """This machine's flags (empty if /proc/cpuinfo cannot be read)."""
    try:
        return parse_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return frozenset()

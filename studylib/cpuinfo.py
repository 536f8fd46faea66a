"""The CPU's instruction-set flags, read once from /proc/cpuinfo (torch-free, so provenance can use it).

Kernels choose their build from these at run time (``models.cpu_linear``, ``models.quant``,
``attention.quest``); reports record them (``bench.provenance.cpu_isa``)."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from pathlib import Path

# The one-word labels of a CPU's best bf16/wide-vector ISA, best first (``bench.provenance.cpu_isa``).
ISA_LABELS = ("amx_bf16", "avx512_bf16", "avx512", "avx2", "baseline")


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


def isa_label(flags: Iterable[str]) -> str:
    """The best of ``ISA_LABELS`` that ``flags`` (/proc/cpuinfo names) have: amx_bf16 (AMX tiles with bf16)
    > avx512_bf16 > avx512 (avx512f) > avx2 > baseline."""
    have = set(flags)
    if {"amx_bf16", "amx_tile"} <= have:
        return "amx_bf16"
    if "avx512_bf16" in have:
        return "avx512_bf16"
    if "avx512f" in have:
        return "avx512"
    if "avx2" in have:
        return "avx2"
    return "baseline"


def parse_cache_size(text: str) -> int:
    """Bytes of a sysfs cache ``size`` entry ("491520K", "32M", "1024"); 0 where it cannot be read."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    try:
        return int(text.rstrip("KMG")) * scale
    except ValueError:
        return 0


@functools.lru_cache(maxsize=1)
def last_level_cache_bytes(root: str = "/sys/devices/system/cpu") -> int:
    """Bytes of last-level cache on the whole machine, from sysfs: the highest cache level's size summed
    over its distinct instances (an AMD EPYC has one L3 per core complex, all of which a threaded read
    uses); 0 where it cannot be read."""
    found: dict[int, dict[str, int]] = {}  # level -> {shared cpu list: size}
    for d in Path(root).glob("cpu[0-9]*/cache/index*"):
        try:
            level = int((d / "level").read_text())
            shared = (d / "shared_cpu_list").read_text().strip()
            size = parse_cache_size((d / "size").read_text())
        except (OSError, ValueError):
            continue
        found.setdefault(level, {})[shared] = size
    return sum(found[max(found)].values()) if found else 0

"""Every engine, arithmetic and ISA path computes what it computed when the goldens were recorded
(``tests/engine_goldens.py``): the logits' exact bytes of a prefill, a k-row step and a decode row, and the
greedy tokens. A kernel that is moved, split or rebuilt must keep its bits."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import engine_goldens as g  # noqa: E402

from studylib.cpuinfo import cpu_flags  # noqa: E402

GOLDENS = g.load()
CASES = [c for c in g.cases() if g.key(c) in GOLDENS]


def test_every_case_has_a_golden():
    """The goldens cover every case the grid names (recorded on a machine that runs them all)."""
    missing = [g.key(c) for c in g.cases() if g.key(c) not in GOLDENS]
    assert not missing, f"no golden for {missing[:5]}; record them with `python tests/engine_goldens.py --write`"


@pytest.mark.parametrize("case", CASES, ids=[g.key(c) for c in CASES])
def test_engine_computes_its_golden_bits(case):
    if not g.runnable(case, cpu_flags()):
        pytest.skip("this CPU lacks the path")
    assert g.fingerprint(case) == GOLDENS[g.key(case)]


def test_int8_and_bf16_bits_do_not_depend_on_their_isa_path():
    """The integer sums are exact and the combine is element-wise in block order, so every int8 path gives
    one set of bits (and every bf16 path one set), for each build of the rest of the step."""
    groups = defaultdict(set)
    for c in CASES:
        fam = {"int8": "STUDYLIB_INT8_ISA", "bf16": "STUDYLIB_BF16_ISA"}.get(c["act"])
        if fam is None:
            continue
        rest = tuple(sorted((k, v) for k, v in c["env"].items() if k != fam))
        groups[(c["model"], c["weights"], c["act"], rest)].add(tuple(sorted(GOLDENS[g.key(c)].items())))
    assert groups and all(len(v) == 1 for v in groups.values()), \
        [k for k, v in groups.items() if len(v) != 1]

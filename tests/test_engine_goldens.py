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
THIS_CLASS = g.cpu_class()
RECORDED = {k for rec in GOLDENS.values() for k in rec}
CASES = [c for c in g.cases() if g.key(c) in RECORDED]


def test_every_case_has_a_golden():
    """The goldens cover every case the grid names (recorded on machines that, together, run them all)."""
    missing = [g.key(c) for c in g.cases() if g.key(c) not in RECORDED]
    assert not missing, f"no golden for {missing[:5]}; record them with `python tests/engine_goldens.py --write`"


@pytest.mark.parametrize("case", CASES, ids=[g.key(c) for c in CASES])
def test_engine_computes_its_golden_bits(case):
    if not g.runnable(case, cpu_flags()):
        pytest.skip("this CPU lacks the path")
    want = g.expected(GOLDENS, g.key(case), THIS_CLASS)
    if not want:  # the recorded classes agree on nothing, tokens included: nothing to hold this class to
        pytest.skip(f"no part of {g.key(case)} is shared by the recorded CPU classes; record {THIS_CLASS}")
    got = g.fingerprint(case)
    assert {part: got[part] for part in want} == want


def test_a_cpu_class_without_a_record_is_held_to_what_the_recorded_classes_agree_on():
    recs = {"a": {"k": {"prefill": "1", "tokens": "t"}}, "b": {"k": {"prefill": "2", "tokens": "t"}},
            "c": {"j": {"prefill": "9", "tokens": "u"}}}
    assert g.expected(recs, "k", "a") == {"prefill": "1", "tokens": "t"}  # its own record, whole
    assert g.expected(recs, "k", "new") == {"tokens": "t"}  # the logits moved between a and b; tokens did not
    assert g.expected(recs, "j", "new") == {"tokens": "u"}  # one class alone vouches for its tokens only
    assert g.expected({"a": {"k": {"prefill": "1"}}, "b": {"k": {"prefill": "1"}}}, "k", "new") == {"prefill": "1"}
    info = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: avx2\n"
    assert g.cpu_class(info, "AVX2") == "AuthenticAMD, torch AVX2"


def test_int8_and_bf16_bits_do_not_depend_on_their_isa_path():
    """The integer sums are exact and the combine is element-wise in block order, so every int8 path gives
    one set of bits (and every bf16 path one set), for each build of the rest of the step, on each CPU class."""
    groups = defaultdict(set)
    for cls, rec in GOLDENS.items():
        for c in CASES:
            fam = {"int8": "STUDYLIB_INT8_ISA", "bf16": "STUDYLIB_BF16_ISA"}.get(c["act"])
            if fam is None or g.key(c) not in rec:
                continue
            rest = tuple(sorted((k, v) for k, v in c["env"].items() if k != fam))
            groups[(cls, c["model"], c["weights"], c["act"], rest)].add(tuple(sorted(rec[g.key(c)].items())))
    assert groups and all(len(v) == 1 for v in groups.values()), \
        [k for k, v in groups.items() if len(v) != 1]

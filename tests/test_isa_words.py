"""ISA words agree with provenance: what a rendered page says this machine has (AMX, AVX-512, ...) must be
what the flags recorded with its numbers say (``studylib.workbook.isa_words``)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from studylib.workbook.isa_words import (
    bf16_units,
    isa_claims,
    isa_phrase,
    mismatches,
    page_mismatches,
    visible_text,
)

REPORTS = Path(__file__).resolve().parents[1] / "reports"

AMX = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"]
AVX512_BF16 = ["avx2", "avx512f", "avx512_bf16", "avx512_vnni"]
AVX512 = ["avx2", "avx512f"]
AVX2 = ["avx2"]
NONE: list[str] = []
MACHINES = {"amx": AMX, "avx512_bf16": AVX512_BF16, "avx512": AVX512, "avx2": AVX2, "baseline": NONE}


def page(body: str) -> str:
    return f"<html><head><style>p::after {{content: 'AMX here'}}</style></head><body>{body}</body></html>"


# ---------------------------------------------------------------------------------------------- the checker


AMX_HERE = page("<p><code>gguf+bf16prefill</code> multiplies in bf16 on the CPU's bf16 units (AMX here): "
                "decode stays exact.</p>")


def test_amx_here_fails_without_amx():
    bad = page_mismatches(AMX_HERE, [AVX512_BF16])
    assert len(bad) == 1 and "has AMX" in bad[0] and "AMX here" in bad[0]


def test_amx_here_passes_with_amx():
    assert page_mismatches(AMX_HERE, [AMX]) == []


def test_front_page_rule_every_machine_must_agree():
    assert page_mismatches(AMX_HERE, [AMX, AMX]) == []
    assert len(page_mismatches(AMX_HERE, [AMX, AVX512_BF16])) == 1  # one chapter ran without AMX


@pytest.mark.parametrize("text, claims", [
    ("bf16 units (AMX here).", [("AMX", True)]),
    ("bf16 units (no AMX here).", [("AMX", False)]),
    ("AVX-512 is available here.", [("AVX-512", True)]),
    ("the kernel uses AVX512_BF16 on this machine.", [("AVX512_BF16", True)]),
    ("this CPU has AVX2, AVX-512 and AVX512_BF16, no AMX.",
     [("AVX2", True), ("AVX-512", True), ("AVX512_BF16", True), ("AMX", False)]),
    ("This machine's CPU has neither AMX nor AVX512_BF16.", [("AMX", False), ("AVX512_BF16", False)]),
    ("this CPU has no AMX but AVX512_VNNI.", [("AMX", False), ("AVX512_VNNI", True)]),
    ("On this CPU, AMX tiles do the bf16 GEMM.", [("AMX", True)]),
    ("AMD EPYC (ISA avx512_bf16) · commit 1a8aa2a2f005", [("ISA avx512_bf16", True)]),
    # not claims about this machine
    ("Force the AVX2 build of the kernel on an AVX-512 machine.", []),
    ("The kernel is compiled twice, for AVX-512 and for AVX2.", []),
    ("bf16 runs in the BLAS GEMM (AMX or AVX512_BF16 where the CPU has them).", []),
    ("Check whether this CPU has AMX before you try it.", []),
    ("If this machine has AVX-512, the wider build runs.", []),
    ("on a CPU without fast bf16 units the ridge point moves left.", []),
    ("a decode step on this machine is bound by reading the weights.", []),
])
def test_claims_found_in_prose(text, claims):
    assert [(c.feature, c.has) for c in isa_claims(text)] == claims


def test_scripts_styles_and_attributes_are_not_read():
    html = page("<script>const note = 'AMX here';</script><img alt='x' data-note='AMX here'>"
                "<p title='AMX here'>Nothing about the CPU.</p>")
    assert "AMX" not in visible_text(html)
    assert page_mismatches(html, [NONE]) == []


def test_table_cells_are_separate_clauses():
    html = page("<table><tr><td>this machine</td><td>34 GB/s</td></tr><tr><td>A100 with AVX-512</td></tr></table>")
    assert isa_claims(visible_text(html)) == []


def test_isa_label_must_be_the_machines():
    html = page("<p>Run: AMD EPYC (ISA amx_bf16) · commit 1a8aa2a2f005.</p>")
    assert page_mismatches(html, [AMX]) == []
    assert len(page_mismatches(html, [AVX512_BF16])) == 1
    assert page_mismatches(html, [AVX512_BF16, AMX]) == []  # the front page names each machine it ran on


# ---------------------------------------------------------------------------------------------- the writers


@pytest.mark.parametrize("name", MACHINES)
@pytest.mark.parametrize("writer", [isa_phrase, bf16_units])
def test_phrases_agree_with_their_flags_and_only_with_theirs(name, writer):
    flags = MACHINES[name]
    text = f"{writer(flags)}."
    assert isa_claims(text), text  # the phrase says something the checker reads
    assert mismatches(text, [flags]) == [], text
    for other, other_flags in MACHINES.items():
        said = {(c.feature, c.has) for c in isa_claims(text)}
        if all(c.holds(other_flags) == c.holds(flags) for c in isa_claims(text)):
            continue  # the other machine does not differ in anything this phrase names
        assert mismatches(text, [other_flags]), (text, other, said)


def test_isa_phrase_words():
    assert isa_phrase(AVX512_BF16) == "this CPU has AVX2, AVX-512, AVX512_BF16 and AVX512_VNNI, no AMX"
    assert isa_phrase(AMX) == "this CPU has AVX2, AVX-512, AVX512_BF16, AVX512_VNNI and AMX"
    assert isa_phrase(NONE) == "this CPU has none of AVX2, AVX-512, AVX512_BF16, AVX512_VNNI or AMX"
    assert bf16_units(AVX512_BF16) == "this CPU has AVX512_BF16 but no AMX"


def test_chapter_8_formats_text_says_what_the_flags_say():
    from studylib.experiments.ch08_compression import formats_text

    for name, flags in MACHINES.items():
        text = formats_text(flags)
        assert "AMX here" not in text
        assert mismatches(text, [flags]) == [], name
    assert mismatches(formats_text(AMX), [AVX512_BF16])
    assert mismatches(formats_text(AVX512_BF16), [AMX])


# ---------------------------------------------------------------------------------------------- the pages

SECTION = re.compile(r"""<section class=['"]chapter['"] id=['"]ch(\d\d)['"]""")


def _flags(prov: dict) -> list[str] | None:
    isa = prov.get("isa")
    return list(isa["flags"]) if isinstance(isa, dict) and isinstance(isa.get("flags"), list) else None


def _chapter_flags(folder: Path) -> dict[int, list[str]]:
    out = {}
    for f in sorted(folder.glob("ch[0-9][0-9].json")):
        flags = _flags(json.loads(f.read_text(encoding="utf-8")).get("provenance") or {})
        if flags is not None:
            out[int(f.stem[2:])] = flags
    return out


def _pages() -> list:
    pages = sorted(p for p in REPORTS.glob("*/*.html") if re.fullmatch(r"index|book|ch\d\d", p.stem))
    if not pages:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no rendered pages under reports/*/"))]
    out = []
    for p in pages:
        out.append(pytest.param(p, id=f"{p.parent.name}/{p.name}"))
    return out


def _parts(path: Path, html: str, chapters: dict[int, list[str]]) -> list[tuple[str, str, list]]:
    """(label, html, flag sets) to check: a chapter page against its JSON, the front page against every
    chapter, the book chapter by chapter (its front matter against every chapter)."""
    if path.stem.startswith("ch"):
        ch = int(path.stem[2:])
        return [(path.name, html, [chapters[ch]])] if ch in chapters else []
    if path.stem == "book":
        cuts = [(m.start(), int(m.group(1))) for m in SECTION.finditer(html)]
        bounds = [0, *[c for c, _ in cuts], len(html)]
        parts = [("front matter", html[:bounds[1]], list(chapters.values()))]
        for (start, ch), end in zip(cuts, bounds[2:], strict=True):
            if ch in chapters:
                parts.append((f"chapter {ch}", html[start:end], [chapters[ch]]))
        return parts
    return [(path.name, html, list(chapters.values()))]


@pytest.mark.parametrize("path", _pages())
def test_rendered_page_isa_words_agree_with_provenance(path):
    chapters = _chapter_flags(path.parent)
    if not chapters:
        pytest.skip(f"no chapter JSON with ISA flags beside {path}")
    parts = _parts(path, path.read_text(encoding="utf-8"), chapters)
    if not parts:
        pytest.skip(f"{path.name} has no JSON with ISA flags")
    bad = [f"{label}: {m}" for label, html, sets in parts if sets for m in page_mismatches(html, sets)]
    assert not bad, "\n".join(bad)

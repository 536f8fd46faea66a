"""ISA words in prose: what a page may say about the CPU it ran on, said from that CPU's flags, and a checker.

A sentence that tells the reader what *this* machine has ("AMX here", "this CPU has AVX512_BF16 but no
AMX") must be formatted from the run's flags (``bench.provenance.cpu_isa``: ``isa.flags`` in a
chapter's JSON), never typed in: the same notebook renders on machines with and without AMX.
``isa_phrase`` and ``bf16_units`` write such clauses; ``isa_claims`` finds them in a page's visible text
and ``mismatches`` checks them against flags (``tests/test_isa_words.py`` runs it on every rendered page).

Names: the /proc/cpuinfo flags (``amx_bf16``, ``avx512_bf16``, ...) are what provenance stores; the words
on a page are the vendors' (AMX, AVX-512, AVX512_BF16, AVX512_VNNI, AVX2) or "native bf16"/"bf16 units"
(either AMX-BF16 or AVX512_BF16).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser

from studylib.cpuinfo import ISA_LABELS, isa_label

# A word a page uses -> the flags any one of which makes "this CPU has it" true.
FEATURES: dict[str, frozenset[str]] = {
    "AMX_BF16": frozenset({"amx_bf16"}),
    "AMX": frozenset({"amx_tile", "amx_bf16"}),
    "AVX512_BF16": frozenset({"avx512_bf16"}),
    "AVX512_VNNI": frozenset({"avx512_vnni"}),
    "AVX-512": frozenset({"avx512f"}),
    "AVX2": frozenset({"avx2"}),
    "native bf16": frozenset({"amx_bf16", "avx512_bf16"}),
}
# Longest spelling first: "avx512_bf16" is AVX512_BF16, not AVX-512 followed by something.
_SPELLINGS = (
    ("AMX_BF16", r"amx[-_ ]bf16"),
    ("AMX", r"amx(?:[-_ ](?:tiles?|int8))?"),
    ("AVX512_BF16", r"avx[-_ ]?512[-_ ]?bf16"),
    ("AVX512_VNNI", r"(?:avx[-_ ]?512[-_ ]?)?vnni"),
    ("AVX-512", r"avx[-_ ]?512f?"),
    ("AVX2", r"avx2"),
    ("native bf16", r"(?:native|hardware) bf16|bf16 (?:units?|hardware|instructions)"),
)
_GROUP = {f"f{i}": name for i, (name, _) in enumerate(_SPELLINGS)}
WORD = re.compile("|".join(rf"(?P<f{i}>\b(?:{rx})\b)" for i, (_, rx) in enumerate(_SPELLINGS)), re.I)
# "this machine", "this CPU's": the subject of a sentence about the machine the page ran on.
THIS = re.compile(r"\b(?:this|the present) (?:machine|cpu|processor|host|computer|server|box)(?:'s)?\b", re.I)
# "F here", "F is available here", "F on this machine"
HERE_AFTER = re.compile(r"\s*(?:(?:is|are) (?:present |available |used )?)?(?:here\b|(?:on|in) this "
                        r"(?:machine|cpu|processor|host)\b)", re.I)
NEGATION = re.compile(r"\b(?:no|not|without|lacks?|lacking|neither|nor|none)\b|n't\b", re.I)
RESET = re.compile(r"\b(?:but|yet|only|while)\b", re.I)
CONDITIONAL = re.compile(r"\b(?:if|whether|when|unless|where|wherever)\s+$", re.I)
NEGATED_BEFORE = re.compile(r"\b(?:no|not|without|lacks?|lacking|neither|nor)\s+(?:\w+\s+){0,2}$", re.I)
# "ISA avx512_bf16": provenance's label of the machine (front page, settings line, provenance table).
LABEL = re.compile(r"\bISA (" + "|".join(ISA_LABELS) + r")\b")
CLAUSE_END = re.compile(r"[.;:!?](?=\s|$)|\n")
WINDOW = 160  # characters after "this CPU" that its clause may run to


# ---------------------------------------------------------------------------------------------- writing


def _names(flags: Iterable[str]) -> tuple[list[str], list[str]]:
    have = set(flags)
    words = [("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX512_BF16", "avx512_bf16"),
             ("AVX512_VNNI", "avx512_vnni"), ("AMX", "amx_tile")]
    return [w for w, f in words if f in have], [w for w, f in words if f not in have]


def _and(words: Sequence[str], conj: str = "and") -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + f" {conj} {words[-1]}"


def isa_phrase(flags: Iterable[str]) -> str:
    """"this CPU has AVX2, AVX-512, AVX512_BF16 and AVX512_VNNI, no AMX" from ``flags`` (cpuinfo names,
    e.g. provenance's ``isa.flags``); the wide-vector and matrix extensions the kernels choose by."""
    has, lacks = _names(flags)
    if not has:
        return f"this CPU has none of {_and(lacks, 'or')}"
    return f"this CPU has {_and(has)}" + (f", no {_and(lacks, 'or')}" if lacks else "")


def bf16_units(flags: Iterable[str]) -> str:
    """What multiplies bf16 on this CPU, as a clause: AMX, AVX512_BF16 without AMX, or neither (then
    a bf16 GEMM is emulated and slow). For a sentence about a bf16 code path (``--weights
    FORMAT+bf16prefill``, ``--dtype bfloat16``)."""
    have = set(flags)
    if {"amx_bf16", "amx_tile"} <= have:
        return "this CPU has AMX"
    if "avx512_bf16" in have:
        return "this CPU has AVX512_BF16 but no AMX"
    return "this CPU has neither AMX nor AVX512_BF16, so bf16 arithmetic is emulated and slow"


# ---------------------------------------------------------------------------------------------- reading


class _Text(HTMLParser):
    SKIP = {"script", "style", "template", "noscript"}
    BLOCK = {"p", "div", "section", "article", "header", "footer", "main", "nav", "aside", "table", "tr", "td",
             "th", "thead", "tbody", "caption", "ul", "ol", "li", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5",
             "h6", "pre", "blockquote", "br", "hr", "figure", "figcaption", "details", "summary", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)


def visible_text(page: str) -> str:
    """The text a reader sees in an HTML page: no tags, scripts, styles or attributes (so no inline
    images); block elements (paragraphs, table cells, list items) end a line."""
    parser = _Text()
    parser.feed(page)
    parser.close()
    text = html.unescape("".join(parser.parts)).replace("\xa0", " ")
    text = re.sub(r"[^\S\n]+", " ", text)
    return re.sub(r" *\n[\n ]*", "\n", text).strip()


@dataclass(frozen=True)
class Claim:
    """One thing a page says about its machine: ``feature`` (a ``FEATURES`` key, or "ISA <label>") is
    there (``has``) or is not; ``text``: the words that say it."""

    feature: str
    has: bool
    text: str

    def holds(self, flags: Iterable[str]) -> bool:
        have = set(flags)
        if self.feature.startswith("ISA "):
            return (isa_label(have) == self.feature[4:]) == self.has
        return bool(FEATURES[self.feature] & have) == self.has


def _feature(m: re.Match) -> str:
    return _GROUP[m.lastgroup]


def _context(text: str, start: int, end: int) -> str:
    lo = max(text.rfind("\n", 0, start), start - 100)
    hi = text.find("\n", end)
    return text[max(lo, 0):hi if hi >= 0 else len(text)].strip()[:300]


def isa_claims(text: str) -> list[Claim]:
    """The claims about this machine's ISA in ``text`` (a page's visible text):

    - "ISA avx512_bf16": provenance's label of the machine (``cpu_isa``);
    - "AMX here", "(no AMX here)", "AVX-512 on this machine";
    - "this CPU has AVX2 and AVX512_BF16, no AMX", "this machine's AMX ...", "this CPU has neither AMX
      nor AVX512_BF16": every ISA word in the clause after "this CPU/machine", negated after no / not /
      without / neither / nor until a "but".

    Not claims: ISA words with no "here"/"this machine" (a kernel "compiled for AVX-512 and AVX2", "an
    AVX-512 machine", "where the CPU has them"), and a "this CPU" under if / whether / when."""
    claims: list[Claim] = []
    taken: set[int] = set()
    for m in LABEL.finditer(text):
        claims.append(Claim(f"ISA {m.group(1)}", True, _context(text, m.start(), m.end())))
        taken.add(m.start(1))
    for m in THIS.finditer(text):
        if CONDITIONAL.search(text[max(0, m.start() - 12):m.start()]):
            continue
        stop = CLAUSE_END.search(text, m.end())
        end = min(stop.start() if stop else len(text), m.end() + WINDOW)
        has, at = True, m.end()
        for w in WORD.finditer(text, m.end(), end):
            gap = text[at:w.start()]
            if NEGATION.search(gap):
                has = False
            elif RESET.search(gap):
                has = True
            at = w.end()
            if w.start() not in taken:
                taken.add(w.start())
                claims.append(Claim(_feature(w), has, _context(text, m.start(), end)))
    for w in WORD.finditer(text):
        if w.start() in taken or not HERE_AFTER.match(text, w.end()):
            continue
        has = not NEGATED_BEFORE.search(text[max(0, w.start() - 40):w.start()])
        claims.append(Claim(_feature(w), has, _context(text, w.start(), w.end())))
    return claims


def mismatches(text: str, flag_sets: Sequence[Iterable[str]]) -> list[str]:
    """The claims in ``text`` that the machines' flags contradict, one line each (empty: all agree).

    ``flag_sets``: the flags of every machine the page reports on (one for a chapter; each chapter's for
    the front page). A feature said to be there must be on every one of them, one said to be missing on
    none; an "ISA <label>" must be the label of one of them (the front page names each machine)."""
    sets = [frozenset(f) for f in flag_sets]
    out = []
    for c in isa_claims(text):
        if c.feature.startswith("ISA "):
            ok = any(c.holds(s) for s in sets)
        else:
            ok = all(c.holds(s) for s in sets)
        if not ok:
            state = "has" if c.has else "lacks"
            flags = " / ".join(",".join(sorted(s)) or "(none)" for s in sets)
            out.append(f"says this machine {state} {c.feature}, but its flags are {flags}: {c.text!r}")
    return out


def page_mismatches(page_html: str, flag_sets: Sequence[Iterable[str]]) -> list[str]:
    """``mismatches`` on an HTML page's visible text."""
    return mismatches(visible_text(page_html), flag_sets)


__all__ = ["FEATURES", "Claim", "bf16_units", "isa_claims", "isa_phrase", "mismatches", "page_mismatches",
           "visible_text"]

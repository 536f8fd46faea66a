"""Decisions declared before the run: what decides each claim in each chapter, and when that was fixed.

``notebooks/params/decisions.yaml`` holds one declaration per claim and chapter (key ``C6@6``): the
decisive configuration(s), every row that may take part (a regular expression on the row's metric),
its bar, direction, unit and minimum n, which rows hold by construction, and for "holds under
conditions" the full list of conditions. A chapter cannot save a row that its declaration does not
name, nor a bar, direction, unit or n other than the declared ones (``stamp``).

Pre-registration is read from git: a declaration is registered in the last commit that changed its
entry (``registered_in``). The code that measures is registered too (``studylib.code_registration``):
a result whose modules, kernels or parameters differ from the chapter's registered fingerprint, or
that predates it, is exploratory. A result is *confirmatory* only if that commit is the result's own commit
or an ancestor of it: the declaration existed, unchanged, when the code that produced the result was
committed. Otherwise (the declaration changed after the result, the result came from a dirty tree, or
the result predates declarations) the decision is **exploratory** and cannot read "holds" or "holds
under conditions" (``apply_registration``, called whenever chapter JSON is loaded).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from studylib.code_registration import check_result
from studylib.errors import StudylibError
from studylib.git_history import UNCOMMITTED, git, is_ancestor, last_changed
from studylib.verdict import (
    CLAIMS,
    CONDITIONAL,
    DECISION,
    DIRECTIONS,
    HOLDS,
    INCONCLUSIVE,
    MIN_UNITS,
    Verdict,
    corrected_confidence,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
DECLARATIONS = REPO_ROOT / "notebooks" / "params" / "decisions.yaml"


BAR_SOURCES = {"essay": "the essay's number", "study": "the study's choice"}


@dataclass(frozen=True)
class DeclaredRow:
    """One row a chapter may produce for a claim: matched by ``match`` (a regular expression searched in
    the row's metric). ``bar``/``direction``/``unit``/``min_n`` must equal the row's own when given."""

    match: str
    bar: float | None = None
    direction: str | None = None
    unit: str | None = None
    min_n: int | None = None
    by_construction: bool = False
    source: str | None = None  # where the bar comes from: "essay" (the source document's number) or "study"

    def matches(self, v: Verdict) -> bool:
        return re.search(self.match, v.metric) is not None


@dataclass(frozen=True)
class Declaration:
    key: str
    claim: str
    chapter: int
    decides: str
    rule: str  # "parts" (all must hold) or "conditions" (alternatives: any may hold)
    rows: tuple[DeclaredRow, ...]
    configurations: tuple[str, ...] = ()
    conditions: tuple[str, ...] = ()
    notes: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def tried(self) -> int:
        """How many conditions compete for this decision (the multiplicity correction's k): every declared
        configuration under every declared condition (workload), since any one clearing its bar would
        carry a part."""
        return max(1, len(self.configurations)) * max(1, len(self.conditions))

    def row(self, metric_match: str) -> DeclaredRow:
        """The declared row whose pattern is ``metric_match`` (chapters read their bars from here)."""
        for r in self.rows:
            if r.match == metric_match:
                return r
        raise StudylibError(f"{self.key} declares no row {metric_match!r}; add it to {DECLARATIONS.name} first.")


def _declaration(key: str, d: Mapping[str, Any], path: Path) -> Declaration:
    problems = []
    claim, _, chapter = key.partition("@")
    if claim not in CLAIMS or not chapter.isdigit():
        problems.append(f"key {key!r} is not CLAIM@CHAPTER with a known claim (e.g. C6@6)")
    rule = d.get("rule", "parts")
    if rule not in ("parts", "conditions"):
        problems.append(f"{key}: rule must be 'parts' or 'conditions', not {rule!r}")
    rows = []
    for i, r in enumerate(d.get("rows") or []):
        unknown = set(r) - {f.name for f in dataclasses.fields(DeclaredRow)}
        if unknown:
            problems.append(f"{key}: row {i} has unknown keys {sorted(unknown)}")
            continue
        if r.get("direction") is not None and r["direction"] not in DIRECTIONS:
            problems.append(f"{key}: row {i} direction must be one of {DIRECTIONS}")
        if r.get("unit") is not None and r["unit"] not in MIN_UNITS:
            problems.append(f"{key}: row {i} unit must be one of {sorted(MIN_UNITS)}")
        if r.get("unit") is not None and int(r.get("min_n") or 0) < MIN_UNITS.get(r["unit"], 0):
            problems.append(f"{key}: row {i} min_n must be at least {MIN_UNITS.get(r['unit'])} {r['unit']}")
        if r.get("bar") is not None and r.get("source") not in BAR_SOURCES:
            problems.append(f"{key}: row {i} has a bar; say where it comes from with source: essay (the source "
                            "document's number) or source: study (the study's own choice)")
        if r.get("bar") is None and r.get("source") is not None:
            problems.append(f"{key}: row {i} names a source but has no bar")
        try:
            re.compile(r["match"])
        except (KeyError, re.error) as exc:
            problems.append(f"{key}: row {i} needs a valid 'match' regular expression ({exc})")
            continue
        rows.append(DeclaredRow(**r))
    if not rows:
        problems.append(f"{key}: declares no rows")
    if problems:
        raise StudylibError(f"{path}: " + "; ".join(problems))
    return Declaration(key=key, claim=claim, chapter=int(chapter), decides=str(d.get("decides", "")), rule=rule,
                       rows=tuple(rows), configurations=tuple(str(c) for c in d.get("configurations") or ()),
                       conditions=tuple(str(c) for c in d.get("conditions") or ()), notes=str(d.get("notes", "")),
                       raw=dict(d))


def parse(text: str, path: Path = DECLARATIONS) -> dict[str, Declaration]:
    data = yaml.safe_load(text) or {}
    if not isinstance(data, Mapping):
        raise StudylibError(f"{path}: expected a mapping of CLAIM@CHAPTER to declarations.")
    out, problems = {}, []
    for k, v in data.items():
        try:
            out[str(k)] = _declaration(str(k), v or {}, path)
        except StudylibError as exc:
            problems.append(str(exc).removeprefix(f"{path}: "))
    if problems:
        raise StudylibError(f"{path}: " + "; ".join(problems))
    return out


def load(path: str | Path | None = None) -> dict[str, Declaration]:
    path = Path(path) if path else DECLARATIONS
    try:
        return _parsed(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise StudylibError(f"cannot read the declarations {path} ({exc}).") from None


@functools.lru_cache(maxsize=8)
def _parsed(text: str, path: str) -> dict[str, Declaration]:
    # keyed by the text itself: reading the file is cheap, parsing its YAML is not (pages ask once per row)
    return parse(text, Path(path))


def declared(claim: str, chapter: int, path: str | Path | None = None) -> Declaration:
    key = f"{claim}@{int(chapter)}"
    decls = load(path)
    if key not in decls:
        raise StudylibError(f"{key} is not declared; add it to {DECLARATIONS.name} (and commit) before the run.")
    return decls[key]


def family_tried(claim: str, path: str | Path | None = None) -> int:
    """How many conditions compete for ``claim`` across the whole study: the sum of every chapter's declared
    ``tried``. A claim decided in several chapters (C3 in chapters 2 and 3, C8 in 5 and 7) holds at study
    level where any chapter's condition clears, so all of them are one family."""
    return sum(d.tried for d in load(path).values() if d.claim == claim)


def level(claim: str, chapter: int, path: str | Path | None = None) -> tuple[float, int]:
    """The level every deciding CI of ``claim`` in ``chapter`` is taken at, and the family size it corrects
    for: Bonferroni over ``family_tried`` (the one helper every chapter asks)."""
    declared(claim, chapter, path)  # an undeclared chapter has no level: the error names the fix
    k = family_tried(claim, path)
    return corrected_confidence(k), k


def bar_origin(v: Verdict, path: str | Path | None = None) -> str | None:
    """Where row ``v``'s bar comes from, in words ("the essay's number", "the study's choice"), from the
    declaration of its claim and chapter; None where nothing declares it (a synthetic or foreign row)."""
    try:
        decl = declared(v.id, v.chapter, path)
    except StudylibError:
        return None
    row = next((r for r in decl.rows if r.matches(v)), None)
    if row is None or not row.source or row.bar is None or v.threshold is None or abs(row.bar - v.threshold) > 1e-12:
        return None  # a bar other than the declared one has no declared origin
    return BAR_SOURCES.get(row.source)


def exploratory(row: Verdict, why: str) -> Verdict:
    """``row`` marked exploratory with the reason; a positive verdict is shown as inconclusive."""
    verdict = INCONCLUSIVE if row.verdict in (HOLDS, CONDITIONAL) else row.verdict
    note = f"exploratory: {why}" + (f" (it read '{row.verdict}')" if verdict != row.verdict else "")
    return dataclasses.replace(row, exploratory=True, verdict=verdict,
                               conditions="; ".join(s for s in (row.conditions, note) if s))


def undeclared(claim: str, chapter: int, configurations: Sequence[str], path: str | Path | None = None) -> list[str]:
    """The configurations of a run that its declaration does not name (a smoke run's small settings, or
    a configuration added after a result was seen): a decision over them is exploratory."""
    named = set(declared(claim, chapter, path).configurations)
    return [c for c in configurations if c not in named]


# ------------------------------------------------------------------------------ checking a chapter's rows

def stamp(verdicts: Sequence[Verdict], chapter: int, path: str | Path | None = None) -> list[Verdict]:
    """Check every row against its declaration and record ``registered_in`` on every row.

    Raises ``StudylibError`` naming each row that no declaration names, or whose bar, direction, unit or
    n differs from the declared one, or that holds by construction without being declared so (or the
    other way round): a result may only be judged the way it was declared."""
    decls = load(path)
    problems, out = [], []
    commits = registrations(path)
    for v in verdicts:
        key = f"{v.id}@{int(chapter)}"
        d = decls.get(key)
        if d is None:
            problems.append(f"{key} is not declared")
            out.append(v)
            continue
        if v.role == DECISION and v.direction == "check" and v.threshold is None and v.unit is None:
            # a decision combined from its parts (decide_parts / decide_conditions): the parts are checked
            out.append(dataclasses.replace(v, registered_in=commits.get(key, UNCOMMITTED)))
            continue
        hits = [r for r in d.rows if r.matches(v)]
        if not hits:
            problems.append(f"{key}: row {v.metric!r} matches no declared row")
        else:
            r = hits[0]
            if r.bar is not None and (v.threshold is None or abs(v.threshold - r.bar) > 1e-12):
                problems.append(f"{key}: row {v.metric!r} judged at bar {v.threshold}, declared {r.bar}")
            if r.direction is not None and v.direction != r.direction:
                problems.append(f"{key}: row {v.metric!r} direction {v.direction}, declared {r.direction}")
            if r.unit is not None and v.unit not in (None, r.unit) and v.n is not None:
                problems.append(f"{key}: row {v.metric!r} counts {v.unit}, declared {r.unit}")
            if r.by_construction != v.by_construction:
                problems.append(f"{key}: row {v.metric!r} by_construction={v.by_construction}, declared "
                                f"{r.by_construction}")
            family = family_tried(v.id, path)
            if v.tried is not None and v.tried != family:
                problems.append(f"{key}: row {v.metric!r} corrected for {v.tried} configurations, declared "
                                f"{family} across the study's chapters")
        out.append(dataclasses.replace(v, registered_in=commits.get(key, UNCOMMITTED)))
    if problems:
        raise StudylibError("rows not judged as declared in " + str(Path(path or DECLARATIONS).name) + ": "
                            + "; ".join(problems))
    return out


# ------------------------------------------------------------------------------ registration from git

def registrations(path: str | Path | None = None) -> dict[str, str]:
    """Per declaration key, the commit where its entry last changed; ``"uncommitted"`` when the working
    copy's entry differs from HEAD's (or the file is not committed at all)."""
    p = Path(path or DECLARATIONS).resolve()
    head = git("rev-parse", "HEAD", cwd=p.parent)[1].strip()
    return dict(_registrations(str(p), p.read_text(encoding="utf-8"), head))


def _deciding(raw: Any) -> Any:
    """What of an entry decides a verdict: everything but its prose (``notes``) and where each bar comes
    from (a row's ``source``). Writing those down later changes no decision, so it re-registers nothing."""
    if not isinstance(raw, Mapping):
        return raw
    out = {k: v for k, v in raw.items() if k != "notes"}
    if isinstance(out.get("rows"), list):
        out["rows"] = [{k: v for k, v in r.items() if k != "source"} if isinstance(r, Mapping) else r
                       for r in out["rows"]]
    return out


@functools.lru_cache(maxsize=8)
def _registrations(path: str, text: str, head: str) -> tuple[tuple[str, str], ...]:
    # ``head`` is part of the cache key only: a new commit can change which commit registered an entry.
    p = Path(path)
    current = {k: _deciding(v.raw) for k, v in parse(text, p).items()}

    def committed(old: str) -> dict[str, Any]:
        return {k: _deciding(v or {}) for k, v in (yaml.safe_load(old) or {}).items()}

    return tuple(sorted(last_changed(p, current, committed).items()))


def apply_registration(data: dict[str, Any], path: str | Path | None = None) -> dict[str, Any]:
    """Mark a loaded chapter's decision rows exploratory where the result does not follow its declaration.

    ``data`` is a chapter record whose ``verdicts`` are ``Verdict`` objects. Records without provenance
    (synthetic ones in tests) are left alone. A decision that is exploratory and read "holds" or "holds
    under conditions" is shown as inconclusive, the note saying why and what it read."""
    prov = data.get("provenance") or {}
    result = str(prov.get("git_commit") or "")
    if not result or not data.get("verdicts"):
        return data
    try:
        commits = registrations(path)
    except (OSError, StudylibError):
        commits = {}
    dirty = bool(prov.get("git_dirty")) or result.endswith("+dirty")
    result = result.removesuffix("+dirty")
    out = []
    # the code registration (studylib.code_registration) is checked where the declarations file is the
    # repository's own: a synthetic declarations file in a test has no code registered beside it
    check_code = path is None or Path(path).resolve() == DECLARATIONS.resolve()
    code_why = None
    for v in data["verdicts"]:
        if v.role != DECISION:
            out.append(v)
            continue
        key = f"{v.id}@{v.chapter}"
        reg = commits.get(key)
        why = ""
        if data.get("declared") is False:
            why = "saved without checking its declaration"
        elif reg is None:
            why = f"no declaration {key}"
        elif dirty:
            why = "the result came from a tree with uncommitted changes"
        elif reg == UNCOMMITTED:
            why = "its declaration has uncommitted changes"
        elif v.registered_in is None:
            why = f"the result (commit {result[:12]}) predates its declaration (commit {reg[:12]})"
        else:
            anc = is_ancestor(reg, result, Path(path or DECLARATIONS).resolve().parent)
            if anc is False:
                why = (f"its declaration changed in commit {reg[:12]}, after the result's commit {result[:12]}; "
                       "rerun the chapter")
        if not why and check_code:
            if code_why is None:
                code_why = check_result(data)
            why = code_why
        if why:
            v = dataclasses.replace(exploratory(v, why), registered_in=reg)
        out.append(v)
    data["verdicts"] = out
    return data

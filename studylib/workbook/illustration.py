"""Sub-analyses too small to conclude from: shown as illustrations, never as evidence.

The study's rule: a sub-analysis below ``studylib.claims.MIN_UNITS`` independent units (10 prompts,
requests or documents; 5 whole runs) is labelled "illustration (n = ...)", shows no CI, and no
sentence concludes from it. Consecutive steps or timings inside one run are not units: ``n`` counts
prompts, requests, documents (a needle trial is one document), or whole runs.

- ``is_illustration(n, unit)``: whether ``n`` units are too few.
- ``illustration(df, n, unit)``: the summary frame without its CI columns and with a caption on
  ``df.attrs`` that ``studylib.workbook.tables.to_html`` prints under the table; at or above the minimum
  the frame comes back untouched.
- ``title(text, n, unit)``: a figure title with "(illustration, n = ...)" appended when it is one.
- ``sentence(n, unit)``: what prose says instead of a conclusion.
- ``aim_row(...)``: a performance-target row, judged from its CI only when n reaches the minimum.
"""

from __future__ import annotations

import re
from typing import Any

from studylib.claims import MIN_UNITS
from studylib.workbook.tables import CAPTION_KEY

NOT_JUDGED = "not judged: an illustration on too few units to conclude (the table gives n)"
ILLUSTRATION_KEY = "illustration"  # df.attrs[ILLUSTRATION_KEY] = {"n": ..., "unit": ...}
# Units named for what they are in a chapter, counted against the minimum of the unit they are.
ALIASES = {"trials": "documents", "haystacks": "documents", "articles": "documents", "runs": "whole runs",
           "repeats": "whole runs"}
_CI_NAMES = {"lo", "hi", "low", "high", "ci", "ci_low", "ci_high"}
_CI_SUFFIXES = ("_lo", "_hi", "_low", "_high", "_ci")
_CI_WORDS = re.compile(r"\b(95% )?ci\b", re.IGNORECASE)


def min_units(unit: str) -> int:
    """The fewest units of ``unit`` a conclusion may rest on (``MIN_UNITS``, through ``ALIASES``)."""
    key = ALIASES.get(unit, unit)
    if key not in MIN_UNITS:
        raise ValueError(f"unknown unit {unit!r}; one of {sorted(MIN_UNITS) + sorted(ALIASES)}")
    return MIN_UNITS[key]


def is_illustration(n: int, unit: str = "prompts") -> bool:
    """True when ``n`` independent ``unit`` are too few to conclude from."""
    return int(n) < min_units(unit)


def units(n: int, unit: str = "prompts", per: str = "") -> str:
    """"1 prompt", "2 prompts", "2 trials per cell": ``unit`` is named in the plural; one unit drops the s."""
    n = int(n)
    return f"{n} {unit[:-1] if n == 1 and unit.endswith('s') else unit}" + (f" per {per}" if per else "")


def caption(n: int, unit: str = "prompts", per: str = "") -> str:
    return f"Illustration (n = {units(n, unit, per)}): too few to conclude; no CI is shown"


def sentence(n: int, unit: str = "prompts", per: str = "") -> str:
    """The clause prose uses in place of a conclusion: "an illustration on n = 2 prompts; too few to conclude"."""
    return f"an illustration on n = {units(n, unit, per)}; too few to conclude"


def title(text: str, n: int, unit: str = "prompts", per: str = "") -> str:
    """A figure title, with "(illustration, n = ...)" appended below the minimum."""
    return f"{text} (illustration, n = {units(n, unit, per)})" if is_illustration(n, unit) else text


def title_for(text: str, df: Any) -> str:
    """``title`` with the n recorded on ``df`` by ``illustration`` (``text`` unchanged when none is)."""
    info = getattr(df, "attrs", {}).get(ILLUSTRATION_KEY)
    return title(text, info["n"], info["unit"], info.get("per", "")) if info else text


def ci_columns(columns: Any) -> list:
    """The columns of a summary that carry a confidence interval: ``*_lo``/``*_hi``, ``*_low``/``*_high``, ``*_ci``,
    bare ``lo``/``hi``/``ci``, and headers that name a CI ("speedup [95% CI]")."""
    out = []
    for c in columns:
        name = str(c).lower()
        if name in _CI_NAMES or name.endswith(_CI_SUFFIXES) or _CI_WORDS.search(name):
            out.append(c)
    return out


def illustration(df: Any, n: int, unit: str = "prompts", per: str = "") -> Any:
    """``df`` as an illustration when ``n`` ``unit`` are too few: a copy without its CI columns, carrying
    the caption (``df.attrs``, printed under the table) and ``{"n", "unit", "per"}`` for ``title_for``
    (``per``: what each n is counted in, e.g. "cell"). At or above the minimum, ``df`` itself is returned
    unchanged."""
    if not is_illustration(n, unit):
        return df
    out = df.drop(columns=ci_columns(df.columns))
    out.attrs[CAPTION_KEY] = caption(n, unit, per)
    out.attrs[ILLUSTRATION_KEY] = {"n": int(n), "unit": unit, "per": per}
    return out


def carry(source: Any, target: Any) -> Any:
    """Copy ``source``'s illustration label (caption and n) onto a frame derived from it (a pivot drops it)."""
    for key in (CAPTION_KEY, ILLUSTRATION_KEY):
        if key in getattr(source, "attrs", {}):
            target.attrs[key] = source.attrs[key]
    return target


def aim_row(aim: str, measured: float, lo: float | None, hi: float | None, bar: float, n: int | None,
            strict: bool = False, unit: str = "prompts") -> dict:
    """A performance-target row: with ``n`` at the minimum (or unknown), "met" when the CI's low end ``lo`` is at
    or above ``bar`` (above it when ``strict``), the CI in its cell; below the minimum an illustration: the CI
    cell names n and "met" stays empty (``NOT_JUDGED`` says why)."""
    if n is not None and is_illustration(n, unit):
        return {"aim": aim, "measured": measured, "ci": f"illustration (n = {units(n, unit)})", "met": None}
    low = float("nan") if lo is None else float(lo)
    high = float("nan") if hi is None else float(hi)
    return {"aim": aim, "measured": measured, "ci": f"[{low:.2f}, {high:.2f}]",
            "met": bool(low > bar if strict else low >= bar)}

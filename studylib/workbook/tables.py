"""One formatting layer for every table a reader sees.

Chapters compute with plain pandas frames (code names, floats, NaN, CI columns side by side); this
module turns one into what a reader wants: readable headers with units, no 0..N index, three
significant figures, "not measured" for NaN/None, yes/no for booleans, a value and its CI in one cell
as ``1.61 (1.00-3.95, n=10)``, and nothing cut with "...". ``install()`` (called by
``studylib.plots.setup()``, so by every chapter) makes it the HTML form of every DataFrame a notebook
displays; ``readable(df)`` is the same for explicit use. The frames themselves, and what chapters save
to JSON, are untouched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from studylib.workbook.page_check import BLOCK_FORMAT, SNAKE

NOT_MEASURED = "not measured"
_UNITS = (("_tok_s", "tok/s"), ("_req_s", "req/s"), ("_gbs", "GB/s"), ("_gflops", "GFLOP/s"), ("_mib", "MiB"),
          ("_mb", "MB"), ("_gb", "GB"), ("_ms", "ms"), ("_us", "µs"), ("_s", "s"), ("_pct", "%"), ("_x", "x"),
          ("_nats", "nats"))
_CI_SUFFIXES = (("_low", "_high"), ("_lo", "_hi"), ("_ci_low", "_ci_high"))
_N_COLUMNS = ("n", "prompts", "requests", "documents", "whole runs", "repeats")
_DROP = {"estimate"}  # Estimate objects: their numbers are in the neighbouring columns already
_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end", "e2el": "end-to-end latency",
          "kv": "KV", "ar": "AR", "ci": "CI", "ppl": "perplexity", "kl": "KL", "p50": "p50", "p99": "p99",
          "slo": "SLO", "hf": "HF", "gguf": "GGUF", "isa": "ISA", "tok": "tokens", "req": "requests",
          "tv": "TV", "chi2": "χ²", "mdc": "minimum detectable change", "top1": "top-1", "topk": "top-k",
          "tau": "τ", "kib": "KiB", "mib": "MiB", "gbs": "GB/s", "llama": "llama", "cpp": "cpp",
          "flops": "FLOPs", "gpu": "GPU", "cpu": "CPU", "rel": "relative", "acc": "accuracy",
          "leviathan": "(Leviathan et al.)", "mc": "(Monte Carlo)"}
# Names whose suffix is not a unit (``tokens_s`` is a rate, not seconds of tokens)
WHOLE_NAMES = {"tokens_s": "Tokens/s", "tok_s": "Tokens/s", "mc_error": "Monte Carlo error"}
# Symbols the chapters define (v(k), c, n): kept lower-case at the start of a header.
_SYMBOLS = {"v", "c", "n", "k", "τ", "α", "γ", "χ²"}


def plural(n: int | float, word: str, many: str | None = None) -> str:
    """``1 layer``, ``2 layers``, ``1 repeat``: a count with its noun in the right number."""
    one = isinstance(n, int | float) and float(n) == 1.0
    return f"{n:g} {word if one else (many or word + 's')}" if isinstance(n, float) else \
        f"{n} {word if one else (many or word + 's')}"


def span(lo: float, hi: float, fmt: str = ".0%") -> str:
    """A range as a reader writes it: "92%-97%", or one value when both ends print the same ("100%")."""
    a, b = format(lo, fmt), format(hi, fmt)
    return a if a == b else f"{a}-{b}"


# Identifiers a table cell may hold (a workload, an arm, a quantity's key) and the words a reader knows them
# by; any other snake_case identifier reads with spaces for underscores. Block formats (q4_1) stay.
_IDENTIFIERS = {"few_shot": "few-shot", "multi_turn": "multi-turn", "tree_of_thought": "tree of thought",
                "system_prompt": "system prompt", "no_sharing": "no sharing", "dense_perop": "dense (per-op path)",
                "kv_int8": "int8 KV", "prompt_tokens": "prompt tokens", "max_new_tokens": "output budget (tokens)",
                "throughput_gain": "throughput gain", "attention_speedup": "attention speed-up",
                "llama_cpp_batch": "llama.cpp batch", "v_k": "v(k)"}


def _tokens(text: str) -> list[str]:
    """The words of a snake_case (or kebab-case) name, each as a reader knows it ("ttft" -> "TTFT")."""
    return [_WORDS.get(w.lower(), w) for w in text.replace("-", "_").split("_") if w]


def words(text: str) -> str:
    """A snake_case identifier as a reader's words ("few_shot" -> "few-shot", "dense_perop" -> "dense (per-op
    path)", "ttft_p99_s" -> "TTFT p99 s"); anything else, block formats included, as it is."""
    if not SNAKE.match(text) or BLOCK_FORMAT.match(text):
        return text
    return _IDENTIFIERS.get(text) or " ".join(_tokens(text))


def model_words(name: Any) -> str:
    """A model as a reader knows it: ``random:smollm2-1.7b`` -> "random weights at smollm2-1.7b's shapes" (a
    speed study's stand-in), any other name as it is."""
    text = str(name)
    return f"random weights at {text.removeprefix('random:')}'s shapes" if text.startswith("random:") else text


def key_words(key: Any) -> str:
    """A key inside a sentence: its header's words, lower-case unless an acronym leads ("tokens per second",
    "TTFT p99 (s)")."""
    return _lower_first(header(key))


def _lower_first(text: str) -> str:
    """"Tokens per second" -> "tokens per second" inside a sentence; "TTFT p99" and "KV budget" keep theirs."""
    return text[:1].lower() + text[1:] if len(text) > 1 and text[1].islower() else text


def header(name: Any) -> str:
    """``throughput_tok_s`` -> "throughput (tok/s)", ``ttft_p99_s`` -> "TTFT p99 (s)"; a pivoted column
    ``quantity:arm`` (``tokens_s:dense_perop``, ``speedup:q8_0``) -> "Tokens/s, dense (per-op path)", the arm
    in a reader's words and a block format kept whole."""
    text = str(name)
    quantity, sep, arm = text.partition(":")
    if sep and quantity and arm:
        return f"{header(quantity)}, {words(arm)}"
    if text in WHOLE_NAMES:
        return WHOLE_NAMES[text]
    unit = ""
    if text.endswith("_per_s") and len(text) > 6:  # requests_per_s: a rate, not a time ("Requests per (s)")
        text = text[:-6] + "_per_second"
    else:
        for suffix, u in _UNITS:
            if text.endswith(suffix) and len(text) > len(suffix):
                text, unit = text[: -len(suffix)], u
                break
    toks = _tokens(text)
    out = " ".join(toks)
    if toks and toks[0] not in _SYMBOLS:
        out = out[:1].upper() + out[1:] if out and out[0].islower() else out
    return f"{out} ({unit})" if unit else out


def number(x: float, digits: int = 3) -> str:
    """Three significant figures, never scientific notation for the magnitudes the study prints."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return NOT_MEASURED
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == 0:
        return "0"
    if float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}" if abs(x) >= 10_000 else str(int(x))
    mag = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - mag)
    if decimals > 8:
        return f"{x:.{digits - 1}e}"
    text = f"{x:.{decimals}f}"
    if abs(x) >= 10_000:
        return f"{float(text):,.0f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def cell(v: Any) -> str:
    if v is None:
        return NOT_MEASURED
    if isinstance(v, str) and not v.strip():
        return "–"  # an empty value (no layers skipped, no test failed), not a missing measurement
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):
        return number(v)
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return cell(v.item())
        except (TypeError, ValueError):
            pass
    if isinstance(v, Mapping):  # {"tokens_per_s": 104.9} -> "tokens per second: 105"
        return ", ".join(f"{key_words(k)}: {cell(x)}" for k, x in v.items())
    if isinstance(v, list | tuple):
        return ", ".join(cell(x) for x in v)
    return words(v) if isinstance(v, str) else str(v)


def _ci_columns(columns: list[str]) -> list[tuple[str, str, str]]:
    """(value, low, high) column triples present in ``columns``."""
    found = []
    for c in columns:
        for lo_s, hi_s in _CI_SUFFIXES:
            lo, hi = f"{c}{lo_s}", f"{c}{hi_s}"
            if lo in columns and hi in columns:
                found.append((c, lo, hi))
                break
    return found


def readable(df: Any):
    """A frame of strings for the eye (see the module docstring); index dropped unless it carries labels."""
    import pandas as pd

    from studylib.claims import ci_level

    if not isinstance(df, pd.DataFrame):
        return df
    frame = df.copy()
    # An unnamed integer index is positions left by a filter or a sort, not data: drop it, never print it
    # as an "index" column. A named or non-integer index carries labels and becomes the first column.
    if isinstance(frame.index, pd.RangeIndex) or (frame.index.name is None and frame.index.nlevels == 1
                                                   and pd.api.types.is_integer_dtype(frame.index)):
        frame = frame.reset_index(drop=True)
    else:
        if frame.index.nlevels == 1 and frame.index.name is None and "" not in frame.columns:
            frame.index.name = ""  # row labels with no name (a transposed table's): a blank header, not "index"
        frame = frame.reset_index()
    # A pivot's two-level headers ('ms', 'dense') read as "ms dense", never as a printed tuple.
    frame.columns = [" ".join(str(x) for x in c if str(x)) if isinstance(c, tuple) else str(c) for c in frame.columns]
    frame = frame[[c for c in frame.columns if c not in _DROP]]
    # A CI's level: 95% unless the frame says otherwise. A "confidence" column with one value (a
    # Bonferroni-corrected level, 0.9938) names it in the CI headers and goes; with several, it stays a
    # column and the headers say "CI" without a level.
    level = "95% CI"
    if "confidence" in frame.columns and pd.api.types.is_numeric_dtype(frame["confidence"]):
        levels = frame["confidence"].dropna().unique()
        if len(levels) == 1:
            level = f"{ci_level(float(levels[0]))} CI"
            frame = frame.drop(columns=["confidence"])
        elif len(levels) > 1:
            level = "CI"
    columns = list(frame.columns)
    n_cols = [c for c in columns if c in _N_COLUMNS and pd.api.types.is_integer_dtype(frame[c])]
    n_col = n_cols[0] if len(n_cols) == 1 else None
    out = pd.DataFrame(index=frame.index)
    merged: set[str] = set()
    triples = {v: (lo, hi) for v, lo, hi in _ci_columns(columns)}
    for c in columns:
        if c in merged:
            continue
        if c in triples:
            lo, hi = triples[c]
            merged |= {lo, hi}
            out[header(c) + f" ({level}" + (", n)" if n_col else ")")] = [
                _with_ci(v, a, b, frame[n_col].iloc[i] if n_col else None)
                for i, (v, a, b) in enumerate(zip(frame[c], frame[lo], frame[hi], strict=True))]
        else:
            out[header(c)] = [cell(v) for v in frame[c]]
    return out.reset_index(drop=True)


def _with_ci(v: Any, lo: Any, hi: Any, n: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return NOT_MEASURED
    text = cell(v)
    if lo is None or hi is None or any(isinstance(x, float) and math.isnan(x) for x in (lo, hi)):
        return text
    inner = f"{cell(lo)}-{cell(hi)}" + (f", n={cell(n)}" if n is not None else "")
    return f"{text} ({inner})"


WHY_KEY = "not_measured_because"
CAPTION_KEY = "caption"  # df.attrs[CAPTION_KEY]: a line ``to_html`` prints under the table (an illustration's label)


def why_not_measured(df: Any, **reasons: str):
    """Record, on ``df`` itself, why a column has empty cells: ``why_not_measured(df, alpha="plain decoding
    drafts nothing, so there is no acceptance rate")``. ``to_html`` prints each reason under the table for the
    columns that really have an empty cell, so a reader never meets a bare "not measured". Returns ``df``."""
    df.attrs[WHY_KEY] = {**df.attrs.get(WHY_KEY, {}), **reasons}
    return df


def _empty(v: Any) -> bool:
    import pandas as pd

    if v is None:
        return True
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):  # a list, dict or array in a cell is a value
        return False


def notes(df: Any) -> list[str]:
    """"Not measured" explained: one line per reason recorded with ``why_not_measured`` for the columns of
    ``df`` that have an empty cell, naming those columns, in column order."""
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        return []
    reasons = df.attrs.get(WHY_KEY) or {}
    grouped: dict[str, list[str]] = {}  # columns that share a reason are named together, once
    for c in df.columns:
        if str(c) in reasons and any(_empty(v) for v in df[c]):
            grouped.setdefault(reasons[str(c)], []).append(header(c))
    return [f"{', '.join(cols)}: {why}" for why, cols in grouped.items()]


class ReadableTable:
    """A frame shown through ``to_html`` (notebooks display it, the book keeps its HTML)."""

    def __init__(self, df: Any):
        self.df = df

    def _repr_html_(self) -> str:
        return to_html(self.df)

    def to_html(self) -> str:
        return to_html(self.df)

    def __repr__(self) -> str:
        return readable(self.df).to_string(index=False)


def to_html(df: Any) -> str:
    """The readable frame as a compact HTML table that scrolls rather than overflows, never truncated, with
    its caption (``df.attrs[CAPTION_KEY]``) and why any "not measured" cell is empty written under it
    (``why_not_measured``)."""
    import html as _html

    table = readable(df).to_html(index=False, escape=True, border=0, classes="studylib-table", na_rep=NOT_MEASURED)
    why = notes(df)
    foot = ("<p class='studylib-table-note' style='font-size:0.85em;margin-top:0.3em'><i>Not measured</i>: "
            + "; ".join(_html.escape(w) for w in why) + ".</p>") if why else ""
    cap = getattr(df, "attrs", {}).get(CAPTION_KEY)
    if cap:
        stop = "" if cap.rstrip().endswith((".", "!", "?")) else "."  # a caption that ends its sentence
        foot = (f"<p class='studylib-table-note' style='font-size:0.85em;margin-top:0.3em'><i>{_html.escape(cap)}"
                f"</i>{stop}</p>") + foot
    return f"<div style='max-width:100%;overflow-x:auto'>{table}</div>{foot}"


def install() -> bool:
    """Make ``to_html`` the HTML form of every DataFrame this IPython kernel displays (True if installed);
    plain-text output stays pandas' own. Also lifts pandas' column and width limits, so no cell is cut."""
    import pandas as pd

    pd.set_option("display.max_columns", None)
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.width", None)
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, to_html)
    return True


def _parse_value(text: str) -> Any:
    t = text.strip()
    if t in ("NaN", "nan", "None", "<NA>", "NaT"):
        return None  # how pandas prints a missing value; an empty string was a value (nothing to list)
    if t in ("True", "False"):
        return t == "True"
    try:
        return int(t) if t.lstrip("-").isdigit() else float(t)
    except ValueError:
        return t


def frame_from_html(markup: str):
    """The DataFrame behind pandas' own ``to_html`` markup (one table, one header row, optionally a named
    index), or None when the markup is anything else. Lets the book put an already executed notebook's
    tables through ``readable`` without running the chapter again."""
    import pandas as pd
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(markup, "html.parser")
    tables = soup.find_all("table")
    if len(tables) != 1 or "dataframe" not in (tables[0].get("class") or []):
        return None
    table = tables[0]
    head = table.find("thead")
    head_rows = head.find_all("tr") if head else []
    if not head_rows or len(head_rows) > 2:
        return None
    names = [th.get_text() for th in head_rows[0].find_all("th")]
    index_name = ""
    if len(head_rows) == 2:  # a named index: its name alone on a second header row
        second = [th.get_text() for th in head_rows[1].find_all("th")]
        if any(x.strip() for x in second[1:]):
            return None  # a MultiIndex header: leave it as it is
        index_name = second[0] if second else ""
    rows, index = [], []
    for tr in table.find("tbody").find_all("tr") if table.find("tbody") else []:
        ths, tds = tr.find_all("th"), tr.find_all("td")
        if len(ths) > 1:
            return None  # a MultiIndex row
        index.append(ths[0].get_text() if ths else "")
        rows.append([_parse_value(td.get_text()) for td in tds])
    has_index = bool(names) and names[0].strip() == "" and len(names) == (len(rows[0]) + 1 if rows else len(names))
    columns = names[1:] if has_index else names
    if any(len(r) != len(columns) for r in rows) or len(set(columns)) != len(columns):
        return None
    df = pd.DataFrame(rows, columns=columns)
    if has_index and (index_name or index != [str(i) for i in range(len(index))]):
        df.insert(0, index_name or "index", [_parse_value(i) for i in index])
    return df


def param_value(v: Any) -> str:
    """A parameter as the command line takes it, not as JSON: ``smollm2-135m`` (no quotes), ``8, 16, 32`` for a
    list, ``ch01: 6, ch02: 6`` for a mapping, ``none`` for null."""
    if v is None:
        return "none"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, Mapping):
        return ", ".join(f"{k}: {param_value(x)}" for k, x in v.items()) or "(empty)"
    if isinstance(v, list | tuple):
        return ", ".join(f"[{param_value(x)}]" if isinstance(x, list | tuple | Mapping) else param_value(x)
                         for x in v) or "(empty)"
    return str(v)

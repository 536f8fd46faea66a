"""What a chapter notebook calls at its top (``show_provenance``) and at its end (``save_chapter``)."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from studylib.claims import Verdict, check_one_decision, verdict_table, verdict_text
from studylib.workbook.paths import atomic_write
from studylib.workbook.tables import param_value


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where rich HTML display works), False in a terminal or a test."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and hasattr(shell, "kernel")


def to_jsonable(obj: Any) -> Any:
    """Convert measurements (Estimates, dataclasses, numpy, pandas, paths) to plain JSON values.

    NaN and infinities become None: JSON has no spelling for them and readers choke on ``NaN``.
    """
    if obj is None or isinstance(obj, bool | str | int):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        try:
            d = obj.to_dict(orient="records")  # pandas DataFrame
        except TypeError:
            d = obj.to_dict()
        return to_jsonable(d)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):  # numpy arrays and scalars, torch tensors
        return to_jsonable(obj.tolist())
    if hasattr(obj, "item"):
        return to_jsonable(obj.item())
    if isinstance(obj, Sequence | set | frozenset):
        return [to_jsonable(v) for v in obj]
    return str(obj)


_DECLARED = object()


def save_chapter(chapter: int, title: str, verdicts: Sequence[Verdict], measurements: Mapping[str, Any],
                 out_dir: str | Path, params: Mapping[str, Any] | None = None, display: bool = True,
                 declarations: Any = _DECLARED) -> Path:
    """Write ``<out_dir>/chNN.json`` (verdicts, measurements, params, provenance) atomically and show
    the verdict table. Returns the path written.

    Every row is checked against its declaration (``studylib.decisions.stamp``: the repository's
    ``notebooks/params/decisions.yaml`` unless ``declarations`` names another file) and records the
    commit that registered it. ``declarations=None`` skips the check for synthetic records; such a
    record says ``"declared": false`` and its decisions load as exploratory."""
    from studylib import decisions
    from studylib.bench import provenance
    from studylib.code_registration import fingerprint, run_params

    verdicts = list(verdicts)
    for v in verdicts:
        if not isinstance(v, Verdict):
            raise TypeError(f"verdicts must be studylib.claims.Verdict objects from a judge_* rule, got {type(v)}")
        if v.chapter != chapter:
            raise ValueError(f"verdict {v.id} says chapter {v.chapter} but is being saved in chapter {chapter}")
    check_one_decision(verdicts)
    declared = declarations is not None
    if declared:
        verdicts = decisions.stamp(verdicts, chapter, None if declarations is _DECLARED else declarations)
    record = {
        "chapter": int(chapter),
        "title": title,
        "declared": declared,
        "written": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "verdicts": [v.to_dict() for v in verdicts],
        "measurements": to_jsonable(measurements),
        "params": to_jsonable(dict(params or {})),
        "provenance": to_jsonable(provenance(**dict(params or {}))),
        # what defines the metrics, hashed (studylib.code_registration): the runner's parameters when it
        # ran the chapter, none when the notebook was run by hand (such a result cannot match a registration)
        "code_fingerprint": fingerprint(int(chapter), run_params()),
    }
    path = Path(out_dir) / f"ch{int(chapter):02d}.json"
    atomic_write(path, json.dumps(record, indent=1, ensure_ascii=False, allow_nan=False))
    if display:
        _show(verdict_table(verdicts), verdict_text(verdicts))
    return path


def provenance_rows(prov: Mapping[str, Any], moment: str = "started") -> list[tuple[str, str]]:
    """The provenance as labelled rows. ``moment``: when ``prov`` was taken, "started" (the table a
    chapter shows first) or "saved" (the record ``save_chapter`` writes when the results are in): the
    two tables of one page differ in time and load, and each says which it is."""
    from studylib.bench.provenance import commit_label

    when = "when it started" if moment == "started" else "when its results were saved"
    # which build of each kernel family this machine chose (forced by its STUDYLIB_* switch, else by the
    # CPU's flags), named for what it computes
    kernels = ", ".join(f"{what} {prov[key]}" for key, what in (
        ("cpu_linear", "fp32 linear"), ("quant_kernel", "4-bit blocks x fp32"), ("int8_kernel", "int8 dot products"),
        ("int8_amx", "int8 AMX"), ("bf16_kernel", "bf16 dot products"), ("invariant_kernels", "batch-invariant"),
        ("quest_kernel", "Quest page scores")) if prov.get(key))

    v = prov.get("versions", {})
    libs = ", ".join(f"{k} {v[k]}" for k in ("studylib", "torch", "transformers", "triton") if v.get(k))
    rows = [("measured" if moment == "started" else "saved", str(prov.get("date"))), ("git commit", commit_label(prov)),
            ("hardware", f"{prov.get('cpu')} ({prov.get('cpu_count')} cores, torch threads "
                         f"{prov.get('torch_threads')})" + (f"; ISA {prov['isa']['label']}" if prov.get("isa") else "")
                         + (f"; GPU {prov['gpu']}" if prov.get("gpu") else "")
                         + (f"; load average {prov['load_average_1min']:g} {when}"
                            if isinstance(prov.get("load_average_1min"), int | float) else "")),
            ("software", f"Python {prov.get('python')}; {libs}"
                         + (f"; kernels: {kernels}" if kernels else ""))]
    params = prov.get("params") or {}
    if params:
        # as the command line takes them (arms=dense, bf16), never a Python list's repr
        rows.append(("parameters", "; ".join(f"{k}={param_value(val)}" for k, val in params.items())))
    return rows


def show_provenance(**params: Any) -> None:
    """Display who/what/where measured this chapter (a compact table in a notebook, text elsewhere).

    Returns nothing so that a notebook cell ending with it shows the table only; ``save_chapter``
    stores the full record (``studylib.bench.provenance()``) in the chapter's JSON."""
    from studylib.bench import provenance

    prov = provenance(**params)
    rows = provenance_rows(prov)
    html = "<table class='provenance' style='font-size:0.85em'>" + "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{k}</th><td style='text-align:left'>{_esc(v)}</td></tr>"
        for k, v in rows) + "</table>"
    _show_html(html, "\n".join(f"{k:>11}: {v}" for k, v in rows))


def _esc(s: str) -> str:
    import html

    return html.escape(s)


def _show(styler: Any, text: str) -> None:
    if in_notebook():
        from IPython.display import display

        display(styler)
    else:
        print(text)


def _show_html(html: str, text: str) -> None:
    if in_notebook():
        from IPython.display import HTML, display

        display(HTML(html))
    else:
        print(text)

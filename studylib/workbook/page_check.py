"""Text defects of a rendered page a reader would trip over, found by reading the HTML the book wrote.

The classes (each was on a committed page once):
- a parameter name in a sentence where its value belongs ("at least ``speed_bar`` times as fast"), or
  markdown backticks that were never rendered;
- a table header in snake_case (``step_ms_low``), a pandas index printed as a column ("index"), or a
  MultiIndex header printed as a tuple ("('rows', '')");
- a cell that reads "nan", "None", "<NA>" or "NaT" instead of saying what is missing, and a sentence that
  prints one ("0.66x [nan, nan]");
- a Python literal in a sentence ("every row should read ``True``") where the page's tables print yes/no;
- words a reader cannot know: a path in the repository ("tests/test_serving.py") or the library's own
  names for things ("ch07_stack.plan_stack", "judge_c1") where the page should say what they do;
- an image without a description (nbconvert's "No description has been provided for this image"), and a
  code cell's source on the page (the page shows what the cell printed and drew; the notebook holds it);
- raw data where words belong: a ``key=value`` pair with a snake_case key ("tokens_per_s=104.9"), a dict
  literal ("{request_id: num_tokens}"), the name of one of the study's files ("vllm_cpu.json",
  "decisions.yaml"), a path into the source document ("seeds/000"), a table cell that is one snake_case
  identifier ("dense_perop", "few_shot"), and pandas' ``describe()`` table ("50%", "prompt_tokens").

Code is allowed to be code: code cells, ``<pre>`` blocks, the appendix's table of every parameter and
the settings line are not read. :func:`page_defects` returns one line per defect; ``studylib book``
prints them and the tests fail on any in the committed study.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from html.parser import HTMLParser

# snake_case: lower-case words joined by underscores ("step_ms_low", "kv_int8", "top1_1"); a block format's
# name ("q4_1", "q8_0", "q4_k_m") is a name a reader is taught, not a variable.
SNAKE = re.compile(r"^[a-z][a-z0-9]*(?:_[a-z0-9]+)+$")
BLOCK_FORMAT = re.compile(r"^i?q[1-8](?:_[a-z0-9]{1,3}){1,2}$")  # q4_1, q8_0, q4_k_m, iq4_nl; not q95_ms
BACKTICKS = re.compile(r"`[^`\s][^`]*`")
# A path inside the repository, written anywhere in the prose.
REPO_PATH = re.compile(r"(?<![\w/.])(?:(?:studylib|tests|notebooks|benchmarks|reports|data|docs)/[\w./-]*\w"
                       r"|seeds/\d[\w./-]*)")  # seeds/000: the source document's file
# Raw data in the text: a snake_case key given a value (not a web address's query), a dict literal, a data
# file's name (the study's results and settings: .json, .yaml, .ipynb).
KEY_VALUE = re.compile(r"(?<![\w.?&/=])[a-z][a-z0-9]*(?:_[a-z0-9]+)+=[^\s,;)\]]")
DICT_LITERAL = re.compile(r"\{\s*['\"]?[A-Za-z_]\w*['\"]?\s*:")
DATA_FILE = re.compile(r"(?<![\w/.-])[\w-]+\.(?:json|jsonl|ya?ml|ipynb)\b")
# pandas' describe() printed as it is: a percentile header beside its summary statistics
DESCRIBE_HEADERS = {"25%", "50%", "75%"}
DESCRIBE_STATS = {"count", "mean", "std", "min", "max"}
# Code that is one of the library's identifiers: a snake_case name or a dotted path (``judge_c1``,
# ``kvcache.dense_bridge.PrefixStore``, ``decisions.yaml``). Names other projects publish and readers of
# the field know (``torch.compile``) and block formats (``q4_1``) are words, not leaks.
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*(?:\(\))?$")
KNOWN_NAMES = re.compile(r"^(?:torch|np|numpy|transformers|vllm|llama_cpp|triton|ray|pandas|papermill)\.")
MISSING = {"nan", "NaN", "None", "<NA>", "NaT", "null"}
# a missing number printed into a sentence ("0.66x [nan, nan]"), where a table cell would say "not measured"
NAN_IN_TEXT = re.compile(r"(?<![\w-])(?:nan|NaN)(?![\w-])")
LITERALS = {"True", "False", "None"}
# Elements whose whole content is code or the run's raw settings, never prose.
_SKIP_TAGS = {"script", "style", "pre", "svg"}
_SKIP_CLASSES = {"highlight", "input", "input_area", "kv", "appendix", "settings", "rendered-from", "studylib-code"}
_VOID = {"br", "img", "hr", "meta", "link", "input", "col", "wbr", "source", "area", "base", "embed", "param",
         "track"}


class _Reader(HTMLParser):
    def __init__(self, params: set[str]) -> None:
        super().__init__(convert_charrefs=True)
        self.params = params
        self.stack: list[tuple[str, bool]] = []  # (tag, whether it starts a skipped region)
        self.skip = 0
        self.cell: list[str] | None = None  # text of the open <th>/<td>
        self.cell_tag = ""
        self.code: list[str] | None = None
        self.defects: list[str] = []
        self.names: list[str] = []  # identifiers in code spans of the prose
        self.literals: list[str] = []  # Python literals in code spans of the prose
        self.vocabulary: set[str] = set()  # words the page's table cells use
        self.headers: set[str] | None = None  # the open table's header texts

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in _VOID:
            return
        classes = set((dict(attrs).get("class") or "").split())
        skips = tag in _SKIP_TAGS or bool(classes & _SKIP_CLASSES)
        self.stack.append((tag, skips))
        self.skip += skips
        if self.skip:
            return
        if tag == "table":
            self.headers = set()
        if tag in ("th", "td", "tr") and self.cell is not None:
            self._close(self.cell_tag)  # a cell HTML left open ends where the next one starts
        if tag in ("th", "td"):
            self.cell, self.cell_tag = [], tag
        elif tag == "code":
            self.code = []

    def handle_endtag(self, tag: str) -> None:
        if tag in _VOID:
            return
        # Close up to the matching open tag (HTML in the wild omits some end tags); a stray end tag is ignored.
        if all(t != tag for t, _ in self.stack):
            return
        while self.stack:
            open_tag, skips = self.stack.pop()
            self.skip -= skips
            if not self.skip and not skips:
                self._close(open_tag)
            if open_tag == tag:
                break

    def _close(self, tag: str) -> None:
        if tag == "table" and self.headers is not None:
            pct = sorted(self.headers & DESCRIBE_HEADERS)
            if pct and self.headers & DESCRIBE_STATS:
                self.defects.append(f"a table is pandas' describe() as printed (a column {pct[0]!r}); name its "
                                    "rows and columns (median, not 50%)")
            self.headers = None
        if tag == "code" and self.code is not None:
            text = "".join(self.code).strip()
            if text in LITERALS:
                self.literals.append(text)
            elif text in self.params:
                self.defects.append(f"the parameter name {text!r} stands in a sentence; write its value or say "
                                    "what it means")
            elif (IDENTIFIER.match(text) and ("_" in text or "." in text) and not BLOCK_FORMAT.match(text)
                  and not KNOWN_NAMES.match(text)):
                # judged at the end: a name the page's own tables use (an arm, a format) is its vocabulary
                self.names.append(text)
            self.code = None
        elif tag in ("th", "td") and self.cell is not None and tag == self.cell_tag:
            text = " ".join("".join(self.cell).split())
            self.vocabulary.update(re.split(r"[\s,;()/+]+", text))
            if text in MISSING:
                self.defects.append(f"a table cell reads {text!r}; say what is missing (a dash, 'not measured')")
            if tag == "td" and SNAKE.match(text) and not BLOCK_FORMAT.match(text):
                self.defects.append(f"a table cell reads {text!r}, an identifier; give it words")
            if tag == "th" and self.headers is not None:
                self.headers.add(text.lower())
            if tag == "th":
                if SNAKE.match(text) and not BLOCK_FORMAT.match(text):
                    self.defects.append(f"a table header reads {text!r} (snake_case); give it words")
                elif text.lower() == "index":
                    self.defects.append("a table prints its index as a column named 'index'")
                elif text.startswith("(") and "'," in text:
                    self.defects.append(f"a table header is a printed tuple {text!r}; flatten it")
            self.cell = None

    def handle_data(self, data: str) -> None:
        if self.skip:
            return
        if self.cell is not None:
            self.cell.append(data)
        if self.code is not None:
            self.code.append(data)
        elif BACKTICKS.search(data):
            self.defects.append(f"unrendered backticks in {BACKTICKS.search(data).group(0)!r}")
        for m in REPO_PATH.finditer(data):
            self.defects.append(f"a repository path {m.group(0)!r} stands in the text; say what is there")
        # raw data stays raw in a sentence whether or not it is set as code ("(`{request_id: num_tokens}`)")
        for m in KEY_VALUE.finditer(data):
            self.defects.append(f"a raw key=value pair {m.group(0)!r}… stands in the text; say it in words")
        for m in DICT_LITERAL.finditer(data):
            self.defects.append(f"a dict literal {m.group(0)!r}… stands in the text; say what it maps")
        if self.cell is None and self.code is None and (nan := NAN_IN_TEXT.search(data)):
            at = nan.start()
            self.defects.append(f"a missing number reads 'nan' in the text (…{data[max(0, at - 30):at + 8].strip()}…); "
                                "say what is missing or leave the interval out")
        if self.code is None:  # a file name in a code span is judged with the other code (as a name)
            for m in DATA_FILE.finditer(data):
                self.defects.append(f"a file name {m.group(0)!r} stands in the text; say what it holds")


def page_defects(html: str, params: Iterable[str] = ()) -> list[str]:
    """Every text defect of one rendered page, once each, in reading order. ``params``: the parameter
    names of the chapter(s) the page shows (a name in a sentence is a template leak)."""
    reader = _Reader({p for p in params if p})
    reader.feed(html)
    reader.close()
    reader.defects += [f"the library's name {n!r} stands in a sentence; say what it does" for n in reader.names
                       if n not in reader.vocabulary]
    reader.defects += [f"the Python literal {v!r} stands in a sentence; say it as the page's tables do "
                       "(yes / no / not measured)" for v in reader.literals if v not in reader.vocabulary]
    missing = len(re.findall(r"<img(?![^>]*\balt=)[^>]*>", html)) + html.count(NO_ALT)
    if missing:
        reader.defects.append(f"{missing} image(s) without a description (alt text); give each its caption")
    if re.search(r"class=\"[^\"]*jp-InputArea", html):
        reader.defects.append("a code cell's source is shown; the page shows what it printed and drew")
    return list(dict.fromkeys(reader.defects))


NO_ALT = "No description has been provided for this image"  # nbconvert's placeholder


def book_defects(out) -> dict[str, list[str]]:
    """Every page of a report folder (chapters, front page, sweep pages) -> its defects (pages with none are
    left out). A chapter page is read with its own parameter names; the others with every chapter's
    (``assemble.book_defects`` adds the instrument card's)."""
    import json
    from pathlib import Path

    out = Path(out)
    params: dict[str, set[str]] = {}
    for j in sorted(out.glob("ch[0-9][0-9].json")):
        try:
            params[j.stem] = set(json.loads(j.read_text(encoding="utf-8")).get("params") or {})
        except (OSError, ValueError):
            params[j.stem] = set()
    every = set().union(*params.values()) if params else set()
    pages = sorted(out.glob("ch[0-9][0-9].html")) + [out / "index.html"] + sorted(out.glob("sweeps/*/index.html"))
    found = {}
    for page in pages:
        if page.exists():
            d = page_defects(page.read_text(encoding="utf-8"), params.get(page.stem, every))
            if d:
                found[str(page.relative_to(out))] = d
    return found

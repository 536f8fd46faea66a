"""Chinese glyphs on every page, on any machine: a subset of a CJK font, embedded in the HTML.

A reader without a CJK font sees the source document's quotes as empty boxes. The pages therefore
carry their own font: WenQuanYi Micro Hei (Debian's ``fonts-wqy-microhei``, Apache-2.0), cut down to
the characters the study actually prints (the claims' quotes and any Chinese in the notebooks) and
stored as ``assets/cjk-subset.woff`` beside its licence. Regenerate it after adding Chinese text::

    apt-get download fonts-wqy-microhei && dpkg-deb -x fonts-wqy-microhei_*.deb fontpkg
    python -m studylib.workbook.fonts --source fontpkg/usr/share/fonts/truetype/wqy/wqy-microhei.ttc

``tests/test_book.py`` fails when a page would print a character the subset lacks.
"""

from __future__ import annotations

import argparse
import base64
import functools
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ASSETS = Path(__file__).parent / "assets"
FONT_FILE = ASSETS / "cjk-subset.woff"
FONT_FAMILY = "studylib-cjk"
# CJK ideographs, CJK and full-width punctuation, and the curly quotes and ellipsis the quotes use.
_CJK = re.compile(r"[\u2e80-\u2fff\u3000-\u303f\u3400-\u9fff\uf900-\ufaff\uff00-\uffef]")
_EXTRA = "“”‘’—…·"


def cjk_chars(text: str) -> set[str]:
    """The characters of ``text`` that need the CJK font."""
    return set(_CJK.findall(text))


def project_chars(root: Path | None = None) -> set[str]:
    """Every CJK character in the library's sources and the chapter notebooks (what the pages print)."""
    root = root or Path(__file__).resolve().parents[2]
    files = [*(root / "studylib").rglob("*.py"), *(root / "notebooks").glob("*.ipynb")]
    out: set[str] = set()
    for f in files:
        out |= cjk_chars(f.read_text(encoding="utf-8", errors="replace"))
    return out


@functools.cache
def covered_chars() -> frozenset[str]:
    """The characters the committed subset can draw (empty when the asset is missing)."""
    if not FONT_FILE.exists():
        return frozenset()
    from fontTools.ttLib import TTFont

    font = TTFont(str(FONT_FILE))
    return frozenset(chr(cp) for cp in font.getBestCmap())


@functools.cache
def font_face_css() -> str:
    """An ``@font-face`` rule with the subset inlined (pages open from the file system, no server)."""
    if not FONT_FILE.exists():
        return ""
    data = base64.b64encode(FONT_FILE.read_bytes()).decode("ascii")
    return (f"@font-face {{ font-family: '{FONT_FAMILY}'; font-display: block; "
            f"src: url(data:font/woff;base64,{data}) format('woff'); }}\n")


def build_subset(source: Path, chars: Iterable[str], out: Path = FONT_FILE) -> Path:
    """Cut ``source`` (a .ttf or the first face of a .ttc) down to ``chars`` and write it as WOFF."""
    from fontTools import subset
    from fontTools.ttLib import TTFont

    font = TTFont(str(source), fontNumber=0)
    options = subset.Options()
    options.flavor = "woff"  # zlib: needs no brotli module, and every browser reads it
    options.layout_features = ["*"]
    options.name_IDs = ["*"]
    options.notdef_outline = True
    sub = subset.Subsetter(options)
    sub.populate(text="".join(sorted(set(chars))))
    sub.subset(font)
    out.parent.mkdir(parents=True, exist_ok=True)
    font.flavor = "woff"
    font.save(str(out))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m studylib.workbook.fonts", description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="wqy-microhei.ttc (or another CJK .ttf/.ttc)")
    args = p.parse_args(argv)
    src = Path(args.source)
    if not src.exists():
        print(f"studylib: font {src} not found; extract Debian's fonts-wqy-microhei first (see this module's "
              "docstring).", file=sys.stderr)
        return 2
    chars = project_chars() | set(_EXTRA)
    out = build_subset(src, chars)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB, {len(chars)} characters)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``studylib`` command. Each subcommand lives in its own module exposing
``add_arguments(parser)`` and ``run(args) -> int``; this file only dispatches and turns
``StudylibError`` into one clear line on stderr with a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "generate": ("studylib.generate_cli", "generate text with a decoding method"),
    "bench": ("studylib.bench.cli", "run a benchmark (ar: studylib vs HF generate vs roofline)"),
    "reproduce": ("studylib.workbook.cli", "execute the chapter notebooks and render reports"),
    "book": ("studylib.workbook.book_cli", "re-render the study's pages from a run's executed notebooks"),
    "register": ("studylib.workbook.register_cli", "record the hashes of the code and parameters each chapter measures with"),
    "claims": ("studylib.claims_cli", "print the study's verdict table from the chapter JSON files"),
    "data": ("studylib.data_cli", "fetch and inspect data sets"),
    "train-draft": ("studylib.drafting.cli", "distil a small draft model from the target"),
    "draft-corpus": ("studylib.drafting.corpus", "build the draft head's corpus: the target's answers and features"),
    "bench-serve": ("studylib.serving.cli", "serving benchmark: scheduler x prefix cache x arrival rate"),
    "sweep": ("studylib.sweep.cli", "run a grid of chapter runs as Ray tasks (local cluster by default)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="studylib", description="A reproducible study of fast LLM inference.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError:
            p.set_defaults(_missing=module)
            continue
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from studylib.errors import StudylibError

    args = build_parser().parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"studylib: error: '{args.command}' is not available in this checkout.", file=sys.stderr)
        return 2
    try:
        return int(args._run(args) or 0)
    except StudylibError as err:
        print(f"studylib: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("studylib: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

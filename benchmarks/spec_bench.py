"""Speculative decoding benchmark: the chapter-2 performance aims, with every ratio measured in one run.

Aims (issue 4): prompt lookup >= 2x our AR decoder on XSum; the distilled draft >= 1.5x our AR on chat;
both faster than the HF peer configured the same way. Results are reported, never asserted:

    python benchmarks/spec_bench.py --out reports/cpu --n-chat 1 --n-xsum 4 --max-new-tokens 64

Writes ``<out>/spec_bench.json`` (provenance, per-prompt rows, summaries, aims) and prints the tables.
The distilled draft must be in the cache (``studylib train-draft``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from studylib.bench.provenance import provenance  # noqa: E402
from studylib.experiments import ch02_peers as peers  # noqa: E402
from studylib.experiments import ch02_speculative as ch02  # noqa: E402
from studylib.models import load_model  # noqa: E402
from studylib.workbook.chapter import to_jsonable  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--n-chat", type=int, default=1, help="held-out chat prompts per category")
    p.add_argument("--n-xsum", type=int, default=4)
    p.add_argument("--n-code", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--pld-gamma", type=int, default=8)
    p.add_argument("--ngram", type=int, default=3)
    p.add_argument("--hf-prompts", type=int, default=4, help="prompts (from the end of the list) for the HF peers")
    p.add_argument("--out", default="reports/cpu")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    lm, tok = load_model(args.model, args.device, args.dtype)
    runner = ch02.Runner(lm, tok)
    prompts = ch02.load_prompts(tok, args.n_chat, args.n_xsum, args.n_code)
    sps, pld = f"sps:distilled@{args.gamma}", f"pld@{args.pld_gamma},{args.ngram}"
    df = ch02.run_methods(runner, prompts, [sps, f"sps:distilled:full@{args.gamma}", pld], args.max_new_tokens)
    by_workload = ch02.summarise(df, "workload")
    hf = peers.hf_peers(runner, prompts[-args.hf_prompts:], _draft_path(lm), args.gamma, args.ngram,
                        args.max_new_tokens, args.pld_gamma)
    hf_summary = peers.hf_peer_summary(hf, args.gamma, args.ngram, args.pld_gamma)
    aims = ch02.performance_aim(by_workload, pld, sps, hf_summary)
    record = {"provenance": provenance(**vars(args)), "runs": df, "by_workload": by_workload, "hf_peers": hf,
              "hf_summary": hf_summary, "aims": aims}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec_bench.json").write_text(json.dumps(to_jsonable(record), indent=1))
    print(ch02.specbench_table(df).to_string(index=False))
    print(hf_summary.round(3).to_string(index=False))
    print(aims.to_string(index=False))
    return 0


def _draft_path(lm) -> str:
    from studylib.decoding.draft_files import distilled_dir

    return str(distilled_dir(lm.config.name))


if __name__ == "__main__":
    sys.exit(main())

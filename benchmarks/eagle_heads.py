"""Which EAGLE head ships as ``eagle``, and whether with FR-Spec's reduced vocabulary: measured side by side.

Each recipe's head (``eagle1``, ``eagle3``: shipped in studylib/assets/drafts, or trained with
``studylib train-draft --kind eagle --preset shipped --recipe R``) decodes our chat prompts outside chapter 2's
held-out third (none of them is in the draft corpus) on chapter 2's engine (``--weights gguf --act int8``), greedily, with the arms in a
rotating order per prompt against AR: its reduced vocabulary and the whole LM head (``:full``). Reported per
arm: tokens per target forward (tau), the speed-up over AR (median, bootstrap CI over prompts), acceptance
per depth, and identity with AR (it must be 1).

The rule, declared here before any run: the shipped default (``eagle``) is the arm with the highest median
speed-up over AR; FR-Spec's reduced vocabulary stays the default projection of that head if its arm is at
least as fast as the same head's ``:full`` arm (median), else the head ships with ``head_vocab`` 0.

    python benchmarks/eagle_heads.py [--prompts N] [--max-new 64] [--tree 5,4,16] [--out reports/bench/eagle_heads]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=0, help="chat prompts (0: all 36 outside chapter 2's held-out third)")
    p.add_argument("--max-new", type=int, default=64)
    p.add_argument("--tree", default="5,4,16")
    p.add_argument("--heads", default="eagle1,eagle3")
    p.add_argument("--out", default="reports/bench/eagle_heads")
    p.add_argument("--ship", default=None,
                   help="the shipped heads' folder: write the decision there (the default pointer; FR-Spec kept or "
                        "the reduced vocabulary dropped from the winner)")
    args = p.parse_args(argv)

    import torch

    from studylib.bench.provenance import provenance
    from studylib.data import load_workload
    from studylib.decoding.eagle import HEAD_FILE, head_path
    from studylib.experiments.ch02_speculative import Prompt, Runner, run_methods, summarise
    from studylib.models import load_model
    from studylib.prompts import encode

    torch.set_num_threads(2)
    model, tok = load_model("smollm2-135m", "cpu", "float32", weights="gguf", act="int8")
    heads = [h for h in args.heads.split(",") if (head_path(h, model.config.name) / HEAD_FILE).exists()]
    if not heads:
        print("no EAGLE head to compare; train them with `studylib train-draft --kind eagle --preset shipped "
              "--recipe eagle3` (and eagle1)", file=sys.stderr)
        return 2
    from studylib.drafting.data import is_heldout

    # Not chapter 2's prompts (its held-out third): the default is chosen on the others, so chapter 2's
    # headline is not measured on the prompts that picked it.
    recs = [r for r in load_workload("chat") if not is_heldout(r.id)][: args.prompts or None]
    prompts = [Prompt(r.id, "chat", r.category, encode(tok, r)) for r in recs]
    specs = ["ar", *[f"{h}{v}@{args.tree}" for h in heads for v in ("", ":full")]]
    df = run_methods(Runner(model, tok), prompts, specs, args.max_new)
    summary = summarise(df, by="all")
    rows = summary.to_dict("records")
    arms = summary[summary.method != "ar"].set_index("method")
    best = str(arms.speedup.idxmax())
    head = best.split("@")[0].split(":")[0]
    reduced, full = f"{head}@{args.tree}", f"{head}:full@{args.tree}"
    keep_fr = bool(arms.loc[reduced, "speedup"] >= arms.loc[full, "speedup"]) if full in arms.index else True
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"summary": rows, "default_head": head, "fr_spec": keep_fr, "best_arm": best,
              "prompts": len(prompts), "max_new": args.max_new, "tree": args.tree,
              "provenance": provenance(model="smollm2-135m", weights="gguf", act="int8")}
    (out / "eagle_heads.json").write_text(json.dumps(result, indent=1, default=str))
    df.to_csv(out / "runs.csv", index=False)
    lines = ["| arm | prompts | speed-up over AR [95% CI] | tokens per target forward | identical to AR |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['prompts']} | {r['speedup']:.2f} [{r['speedup_lo']:.2f}, {r['speedup_hi']:.2f}] "
                     f"| {r['tokens_per_step']:.2f} | {r['exact_match']:.2f} |")
    lines.append(f"\nDefault by the declared rule: `{head}` (best arm `{best}`), FR-Spec vocabulary "
                 f"{'kept' if keep_fr else 'dropped'}.")
    (out / "eagle_heads.md").write_text("\n".join(lines) + "\n")
    if args.ship:
        ship(Path(args.ship), model.config.name, head, keep_fr, result)
    print("\n".join(lines))
    return 0


def ship(folder: Path, target: str, head: str, keep_fr: bool, result: dict) -> None:
    """Record the measured decision beside the shipped heads: ``<target>-eagle.default`` names the default
    head; without FR-Spec the winner's reduced vocabulary is emptied (it then projects on the whole LM head)."""
    from studylib.decoding.draft_files import slug as _slug
    from studylib.decoding.eagle import META_FILE, VOCAB_FILE

    slug = _slug(target)
    (folder / f"{slug}-eagle.default").write_text(head + "\n")
    d = folder / f"{slug}-{head}"
    meta = json.loads((d / META_FILE).read_text())
    meta["decision"] = {"default": True, "fr_spec": keep_fr, "by": "benchmarks/eagle_heads.py",
                        "summary": result["summary"], "prompts": result["prompts"]}
    if not keep_fr:
        (d / VOCAB_FILE).write_text("[]")
        meta["head_vocab"] = 0
    (d / META_FILE).write_text(json.dumps(meta, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())

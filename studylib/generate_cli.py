"""``studylib generate``: one JSON object per prompt, with the shared result record's fields."""

from __future__ import annotations

import argparse
import json
import sys

# Which generic flags each method takes, under the keyword its decoder expects.
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {
    "ar": ("attention",),
    "speculative": ("draft", "gamma", "tree"),
    "prompt-lookup": ("gamma", "ngram"),
    "jacobi": ("block", "max_iters", "init"),
    "lookahead": ("window", "ngram", "guesses"),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="model name, path or HF id (default: smollm2-135m)")
    p.add_argument("--method", default="ar", help="decoding method: " + ", ".join(METHOD_OPTIONS))
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--dtype", default=None, help="float32 (CPU default) | bfloat16 | float16 (CUDA only)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--weights", default="dense",
                   help="dense (default) | gguf (the embedded model's own Q4_1/Q8_0 blocks) | q8_0 | q4_0 | q4_1 | awq4")
    p.add_argument("--act", default="fp32", help="fp32 (default: the exact model) | int8 (x rounded to int8 per 32-block, integer dot products) | bf16 (x rounded to bf16, bf16 dot products); int8 and bf16 need block-format --weights")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text")
    src.add_argument("--prompts", help="JSONL file: id plus prompt or messages per line")
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to --prompt text")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt")
    g = p.add_argument_group("method options")
    g.add_argument("--draft", help="speculative: draft model name/path, 'distilled', self:LAYERS, or 'eagle' "
                   "(the head `studylib train-draft --kind eagle` made; 'eagle:full' keeps the whole LM head)")
    g.add_argument("--tree", default=None, help="speculative with --draft eagle: token tree DEPTH,TOPK,NODES "
                   "(e.g. 5,4,16; default: the head's own)")
    g.add_argument("--gamma", default=None, help="speculative/prompt-lookup: draft length, or 'adaptive'")
    g.add_argument("--ngram", type=int, default=None, help="prompt-lookup: max match n-gram; lookahead: N")
    g.add_argument("--block", type=int, default=None, help="jacobi: block size")
    g.add_argument("--max-iters", type=int, default=None, help="jacobi: iteration cap per block")
    g.add_argument("--init", default=None, help="jacobi: initial guess (pad | random | prompt)")
    g.add_argument("--window", type=int, default=None, help="lookahead: window W")
    g.add_argument("--guesses", type=int, default=None, help="lookahead: verification candidates G")
    g.add_argument("--attention", default=None, help="ar: dense | window:W | sinks:S,W | blocksparse:... | quest:budget=B (see README, Attention patterns)")


def _options(args: argparse.Namespace) -> dict:
    from studylib.errors import StudylibError

    allowed = METHOD_OPTIONS.get(args.method)
    if allowed is None:
        raise StudylibError(f"unknown method {args.method!r}; choose one of {sorted(METHOD_OPTIONS)}.")
    given = {k: getattr(args, k) for k in ("draft", "gamma", "tree", "ngram", "block", "max_iters", "init",
                                          "window", "guesses", "attention") if getattr(args, k) is not None}
    extra = sorted(set(given) - set(allowed))
    if extra:
        flags = ", ".join("--" + e.replace("_", "-") for e in extra)
        raise StudylibError(f"{flags} does not apply to --method {args.method}; it takes {list(allowed) or 'no options'}.")
    if "gamma" in given and given["gamma"] != "adaptive":
        try:
            given["gamma"] = int(given["gamma"])
        except ValueError:
            raise StudylibError(f"--gamma must be an integer or 'adaptive', got {given['gamma']!r}.") from None
    if "tree" in given:  # a malformed tree fails here, before the model loads
        from studylib.decoding.eagle import TreeSpec

        TreeSpec.parse(given["tree"])
        if str(given.get("draft", "")).split(":")[0] != "eagle":
            raise StudylibError("--tree needs --draft eagle (a token tree is drafted by the EAGLE head).")
        if "gamma" in given:
            raise StudylibError("give --tree or --gamma for an EAGLE draft, not both.")
    if str(given.get("draft", "")).split(":")[0] == "eagle" and given.get("gamma") == "adaptive":
        raise StudylibError("--gamma adaptive is for model drafts; an EAGLE draft takes --gamma K or --tree D,K,N.")
    if "attention" in given:  # a misspelt pattern fails here, before the model loads
        from studylib.attention import Pattern

        Pattern.parse(given["attention"])
    return given


def run(args: argparse.Namespace) -> int:
    from studylib.decoding import decode, get_decoder
    from studylib.models import load_model
    from studylib.prompts import PromptRecord, encode, read_prompts
    from studylib.sampling import SamplingParams

    options = _options(args)
    get_decoder(args.method)  # fail on an unknown method before the model loads
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed)
    records = read_prompts(args.prompts) if args.prompts else [PromptRecord("prompt", prompt=args.prompt)]
    model, tok = load_model(args.model, args.device, args.dtype, weights=args.weights, act=args.act)
    if args.method == "speculative" and "draft" in options:
        if str(options["draft"]).split(":")[0] == "eagle":
            from studylib.decoding.eagle import resolve_eagle

            options["draft"] = resolve_eagle(options["draft"], model)
        else:
            from studylib.decoding.speculative import resolve_draft

            options["draft"] = resolve_draft(options["draft"], model)
    for rec in records:
        ids = encode(tok, rec, chat=args.chat)
        res = decode(args.method, model, ids, args.max_new_tokens, sampling, tokenizer=tok, **options)
        if args.json:
            row = {"id": rec.id, "method": args.method, "model": model.config.name, "weights": args.weights, "act": args.act,
                   **res.to_dict()}
            row["random_weights"] = model.config.random_weights
            print(json.dumps(row), flush=True)
        else:
            print(f"[{rec.id}] {res.text}\n  ({res.new_tokens} tokens, {res.wall_s:.2f} s, "
                  f"{res.new_tokens / max(res.wall_s, 1e-9):.1f} tok/s)", file=sys.stdout, flush=True)
    return 0

"""``studylib train-draft``: one command for both drafters, the distilled draft model (``train``) and the
EAGLE head (``eagle_train``, or ``head_train`` with ``--preset shipped``). The dispatch lives here so that
neither trainer imports the other."""

from __future__ import annotations

import argparse

from studylib.drafting import eagle_train, head_train
from studylib.drafting.train import DraftTrainConfig, train_draft
from studylib.errors import StudylibError


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = DraftTrainConfig()
    p.add_argument("--kind", default="distilled", choices=("distilled", "eagle"),
                   help="distilled: a small Llama draft (default); eagle: a feature-level EAGLE head (eagle_train)")
    p.add_argument("--model", default=d.model, help="target model (default smollm2-135m)")
    p.add_argument("--layers", type=int, default=d.layers, help="draft decoder layers (default 4)")
    p.add_argument("--init", default=d.init, help="auto | spaced | first | random: which target layers to start from")
    p.add_argument("--sources", default=",".join(d.sources), help="prompt sources: chat,self")
    p.add_argument("--self-prompts", type=int, default=None,
                   help=f"user turns the target writes itself (default {d.self_prompts}; eagle 16)")
    p.add_argument("--samples", type=int, default=None,
                   help=f"sampled answers per prompt besides greedy (default {d.samples}; eagle 1)")
    p.add_argument("--gen-tokens", type=int, default=None, help=f"answer length (default {d.gen_tokens}; eagle 96)")
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--max-minutes", type=float, default=None,
                   help="hard wall-time cap (default 25 for distilled, 20 for eagle)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--head-vocab", type=int, default=d.head_vocab, help="rows of the fast draft head (0: none)")
    p.add_argument("--save-every", type=int, default=d.save_every)
    p.add_argument("--data-share", type=float, default=d.data_share,
                   help="the largest share of --max-minutes spent generating data (the rest trains)")
    p.add_argument("--train-embeddings", action="store_true", help="train the embedding/LM head too (frozen by default)")
    p.add_argument("--device", default=d.device)
    p.add_argument("--fresh", action="store_true", help="ignore cached data and checkpoint")
    p.add_argument("--out", default=None, help="export directory (default: the cache, found by --draft distilled "
                   "or --draft eagle)")
    eagle_train.add_arguments(p.add_argument_group("eagle (--kind eagle)"))


def run(args: argparse.Namespace) -> int:
    if args.kind == "eagle":
        return _run_eagle(args)
    d = DraftTrainConfig()
    for name in ("max_minutes", "self_prompts", "samples", "gen_tokens"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(d, name))
    cfg = DraftTrainConfig(
        model=args.model, layers=args.layers, init=args.init, sources=tuple(args.sources.split(",")),
        self_prompts=args.self_prompts, samples=args.samples, gen_tokens=args.gen_tokens,
        temperature=args.temperature, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
        max_minutes=args.max_minutes, seed=args.seed, head_vocab=args.head_vocab, save_every=args.save_every,
        data_share=args.data_share, freeze_embeddings=not args.train_embeddings, device=args.device, fresh=args.fresh, out=args.out,
    )
    meta = train_draft(cfg)
    state = "complete" if meta["complete"] else "stopped at the time cap; rerun the same command to resume"
    print(f"draft: {meta['path']} ({meta['params'] / 1e6:.1f}M params, {meta['layers']} layers from target layers "
          f"{meta['init_layers']}), {meta['steps_done']}/{meta['steps_total']} steps, {state}; "
          f"held-out top-1 agreement {meta['val_top1']:.3f}, loss {meta['val_loss']:.3f}")
    return 0


def _run_eagle(args: argparse.Namespace) -> int:
    if getattr(args, "preset", None) == "shipped":
        return head_train.run_preset(args)
    dd = DraftTrainConfig()
    for flag, name, eagle_flag in (("--steps", "steps", "--eagle-steps"), ("--lr", "lr", "--eagle-lr"),
                                   ("--batch-size", "batch_size", "--batch-tokens"),
                                   ("--head-vocab", "head_vocab", "--eagle-head-vocab"),
                                   ("--temperature", "temperature", None), ("--layers", "layers", None)):
        if getattr(args, name) != getattr(dd, name):
            raise StudylibError(f"{flag} is a distilled-draft option; with --kind eagle use "
                                f"{eagle_flag or 'the EAGLE options'} (see `studylib train-draft --help`).")
    return eagle_train.run(args)

"""The "Try this" exercises of every chapter, as data: a question, what to look for, and the change
to the class profile that tests it (the cpu profile's engine at classroom sizes: a chapter in under two
minutes on a 2-core CPU). Commands are generated from the data, so each one runs the chapter with the
profile's own settings plus the change (never the notebook's defaults), each into a folder of its own,
beside one unchanged run of the chapter (``baseline_command``); ``tests/test_exercises.py`` checks every
one as printed (``studylib reproduce --dry-run``: names, types, models, patterns).

The rendered pages take their "Try this" section from here (``studylib.workbook.book``); in Jupyter,
``show_exercises(N)`` prints the same list.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Exercise:
    title: str
    question: str
    look_for: str
    # Each step reruns one chapter with these -p overrides on the cpu profile (a step may name another
    # chapter: chapter 7 reads chapter 5's serving rows). Empty: ``command`` is given instead.
    steps: tuple[tuple[int, Mapping[str, Any]], ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    command: str = ""  # a non-reproduce command (e.g. bench-serve), checked by its own parser
    # The classroom profile: the cpu profile's engine at sizes that keep one chapter under two minutes on a
    # 2-core CPU (notebooks/params/class.yaml), so an exercise is a question a reader can ask in class.
    profile: str = "class"

    def folder(self, chapter: int) -> str:
        """The exercise's own scratch folder, so two exercises never overwrite each other's reports."""
        slug = "".join(c if c.isalnum() else "-" for c in self.title.lower()).strip("-")
        while "--" in slug:
            slug = slug.replace("--", "-")
        return f"/tmp/try{chapter:02d}-{slug}"

    def commands(self, chapter: int) -> list[str]:
        if self.command:
            # a serving benchmark keeps its per-request records in the exercise's own folder too
            if self.command.startswith("studylib bench-serve") and "--records" not in self.command:
                return [f"{self.command} --records {self.folder(chapter)}/requests.jsonl"]
            return [self.command]
        prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items())
        return [prefix + reproduce_command(ch, overrides, self.profile, self.folder(chapter))
                for ch, overrides in self.steps]


def _value(v: Any) -> str:
    """A -p value that ``parse_overrides`` (YAML) reads back as ``v``."""
    import yaml

    text = json.dumps(v) if isinstance(v, list | dict) else str(v)
    if yaml.safe_load(text) != v:
        text = json.dumps(v)
    return text


def reproduce_command(chapter: int, overrides: Mapping[str, Any], profile: str = "cpu", out: str = "/tmp/try") -> str:
    args = ["studylib", "reproduce", "--profile", profile, "--chapters", str(chapter), "--out", out]
    for k, v in overrides.items():
        args += ["-p", f"{k}={_value(v)}"]
    return shlex.join(args)


EXERCISES: dict[int, tuple[Exercise, ...]] = {
    1: (
        Exercise("Halve the bytes", "If decoding is bound by memory traffic, does bfloat16 weights' half-size "
                 "traffic nearly double tokens/s?",
                 "tokens/s at batch 1 against the fp32 run, and where the points sit on the roofline; on a CPU "
                 "without fast bf16 units the ridge point moves left and batch 1 turns compute-bound instead.",
                 steps=((1, {"dtype": "bfloat16"}),)),
        Exercise("Fewer cores", "With one thread the arithmetic rate halves; does the bandwidth of one core too?",
                 "the batch at which the step time starts to grow: it moves left if one core is compute-bound "
                 "sooner.", steps=((1, {"threads": 1}),)),
        Exercise("Long context", "At 2048 tokens of context, how much of each step's traffic is the KV cache?",
                 "the points sliding left on the roofline and the knee of the step-time curve moving.",
                 steps=((1, {"context": 2048}),)),
    ),
    2: (
        Exercise("Longer drafts", "Does a larger draft length γ commit more tokens per step, or waste more "
                 "draft work on rejections?",
                 "where the measured speed-up curve leaves the theory's (1 - α^(γ+1)) / (1 - α) prediction: tokens "
                 "per step keep rising with γ while the speed-up peaks and falls, since every rejected draft token "
                 "still cost a draft forward.",
                 steps=((2, {"gamma": 8, "sweep_gammas": [2, 4, 8, 12]}),)),
        Exercise("Prompt lookup where it should shine", "When the output quotes the input (summaries), how "
                 "far does copying from the prompt go?",
                 "the acceptance and speed-up of pld on XSum against the unchanged run's chat prompts: higher, "
                 "because a summary copies phrases from its article.",
                 steps=((2, {"n_chat": 0, "n_code": 0, "n_xsum": 2, "max_new_tokens": 48}),)),
        Exercise("A cheaper self-draft", "Exiting after 16 of the 30 layers instead of 24 makes the self-draft "
                 "cheaper but less accurate: which wins?", "α, the draft's cost c and the self-draft's speed-up: c and α "
                 "both fall, and the speed-up rises only where c fell faster than α.",
                 steps=((2, {"self_layers": "exit:16"}),)),
        Exercise("The distilled draft", "Why is a small draft model not in the default run? Add it (a stand-in, "
                 "trained on first use for the class profile's two minutes and cached: its cost does not depend on "
                 "its training) and set its cost beside the EAGLE head's.",
                 "the draft table's measured c, one draft forward in target forwards, and what it leaves of the "
                 "speed-up whatever its acceptance: near one target forward here, so even perfect acceptance "
                 "gains little.",
                 steps=((2, {"distilled": True}),)),
    ),
    3: (
        Exercise("The paper's configuration", "Lookahead with W=7, N=5, G=7 and no prompt pool, as its authors "
                 "ran it on GPUs: what does the wider forward cost on a CPU?",
                 "tokens per forward against the wall-clock speed-up: more tokens per step can still be slower.",
                 steps=((3, {"headline": "lookahead:7,5,7", "methods": ["lookahead:7,5,7"]}),)),
        Exercise("A bigger Jacobi block", "Does a random first guess ever converge faster than one copied from "
                 "the prompt?", "new tokens per forward of the two Jacobi arms: the guess copied from the prompt "
                 "converges in fewer forwards than the random one.",
                 steps=((3, {"methods": ["jacobi:16:random", "jacobi:16:prompt"], "headline": "jacobi:16:prompt"}),)),
        Exercise("Fewer threads", "With one thread the cost curve of a wider forward steepens; does the "
                 "break-even compression rise?", "the cost curve and the break-even line: the curve steepens and the "
                 "break-even compression rises.",
                 steps=((3, {"threads": 1}),)),
    ),
    4: (
        Exercise("Page size 1", "Token-granular sharing removes the block-rounding loss; how much was it?",
                 "the measured hit rate against 'optimal (token level)': it reaches it, where 16-token pages fell "
                 "short by the partial page at the end of each shared prefix.", steps=((4, {"block_size": 1}),)),
        Exercise("A tight memory budget", "Below the multi-turn working set, do interleaved chats evict each other?",
                 "the measured hit rate landing on the LRU replay curve.",
                 steps=((4, {"capacity_tokens": 1280, "conversations": 4}),)),
        Exercise("Where TTFT gains end", "Halve the shared system prompt and lengthen the outputs: what happens "
                 "to the end-to-end gain?", "TTFT still drops, while the end-to-end ratio shrinks toward 1.",
                 steps=((4, {"system_tokens": 128, "max_new_tokens": 24}),)),
    ),
    5: (
        Exercise("Less alike requests", "A wider spread of output lengths: which policy suffers most?",
                 "static batching's throughput against continuous batching's: it falls further behind (rows "
                 "finished early sit idle in a static batch until its longest request ends).", steps=((5, {"min_new_tokens": 1, "max_new_tokens": 24}),)),
        Exercise("No shared system prompts", "Without shared prefixes, how much of the gain was the radix cache's?",
                 "continuous+radix falling back onto continuous.", steps=((5, {"system_tokens": 0}),)),
        Exercise("Smaller prefill chunks", "Do 32-token chunks stop long prompts stalling running decodes?",
                 "ITL and TPOT p99 against TTFT: the running decodes' p99 ITL and TPOT fall, and the long prompts' "
                 "TTFT rises.", steps=((5, {"chunk_size": 32}),)),
        Exercise("A tighter SLO", "Halve both latency limits (TPOT and TTFT): how much capacity is left?",
                 "the highest rate each arm sustains: lower, or the search saying what bounds it.",
                 steps=((5, {"slo_tpot_factor": 1.5}),)),
        Exercise("Bursty arrivals", "The same mean rate, in bursts: what happens to p99 TTFT?",
                 "TTFT p99 against Poisson arrivals at the same rate (run it again without --burstiness): higher, "
                 "as bursts queue behind each other.",
                 command="studylib bench-serve --weights gguf --act int8 --scheduler continuous --prefix-cache radix "
                         "--rate 4 --burstiness 0.3 --num-requests 32"),
    ),
    6: (
        Exercise("Without the sinks", "At the same budget, what does dropping the first tokens do?",
                 "the bare window's perplexity against sinks:4,W-4 (the attention-sink effect).",
                 steps=((6, {"n_tokens": 256, "quality_patterns": ["window:48", "sinks:4,44", "sinks:16,32"]}),)),
        Exercise("The needle farther away", "With the needle outside the window, can the sink cache answer?",
                 "window and sinks failing where Quest, at the same budget, still reads the page that holds it.",
                 steps=((6, {"needle_lengths": [1000], "needle_depths": [0.1, 0.5]}),)),
        Exercise("A smaller Quest budget", "Fewer keys, or coarser pages: which costs Quest more quality?",
                 "KL divergence and the perplexity ratio of the two budgets against the unchanged run's: both "
                 "rise as the budget shrinks, and coarser pages spend it less precisely.",
                 steps=((6, {"doc_patterns": ["quest:budget=96,recent=32", "quest:budget=96,page=32,recent=32"]}),)),
    ),
    7: (
        Exercise("Longer outputs", "The prefix cache removes only prefill: does its share of the gain shrink as "
                 "outputs grow?", "the prefix-cache arm's speed-up against the decoders' as outputs lengthen: it shrinks "
                 "toward 1, while a decoder's gain per token stays.",
                 steps=((7, {"max_new_tokens": 24}),)),
        Exercise("A narrower window", "Halve the sparse-attention budget: does quality stay above 99%?",
                 "quality retained falling below the bar, which takes window attention out of every stack.",
                 steps=((7, {"attention": "sinks:4,28"}),)),
        Exercise("Heavier saturation", "Twice the requests in flight: how close does the throughput gain get to "
                 "8-12x?", "chapter 5's saturation gain of continuous + radix over sequential serving, the number "
                 "chapter 7 reads for C7 (this exercise reruns chapter 5 only).",
                 steps=((5, {"n_requests": 12}),)),
    ),
    8: (
        Exercise("Only the lossless arm", "The GGUF blocks against the fp32 model, with twice the prompts: how "
                 "tight does the speed CI get?", "the CI of the gguf speed-up: narrower, by about the square root of "
                 "the growth in prompts.",
                 steps=((8, {"arms": ["dense", "gguf"], "n_prompts": 4}),)),
        Exercise("The other ISA path", "Force the AVX2 build of the kernel on an AVX-512 machine: how much do "
                 "the wider registers buy?", "decode speed against the default run (the provenance names the "
                 "build): slower on an AVX-512 machine, unchanged on an AVX2-only one.",
                 steps=((8, {"arms": ["dense", "gguf", "q4_1"]}),), env={"STUDYLIB_QUANT_ISA": "avx2"}),
    ),
}


def baseline_command(chapter: int, profile: str = "class") -> str:
    """The chapter once, unchanged, in the exercises' profile: what each exercise's report is compared with."""
    return reproduce_command(chapter, {}, profile, f"/tmp/try{chapter:02d}-baseline")


def exercises_markdown(chapter: int) -> str:
    """The chapter's "Try this" section as Markdown (empty if it has none)."""
    items = EXERCISES.get(chapter, ())
    if not items:
        return ""
    lines = ["## Try this", "",
             "The exercises run the class profile: this chapter with the cpu profile's engine at classroom sizes, "
             "under two minutes on a 2-core CPU, too few units for a verdict but enough to see each effect in the "
             "point estimates. Run the chapter once unchanged, then each exercise; each writes into a folder of "
             "its own, so compare its report with the unchanged one.", "",
             "   ```text", f"   {baseline_command(chapter)}", "   ```", ""]
    for i, ex in enumerate(items, 1):
        lines.append(f"{i}. **{ex.title}.** {ex.question} *Look for:* {ex.look_for}")
        lines.append("")
        lines += ["   ```text", *(f"   {c}" for c in ex.commands(chapter)), "   ```", ""]
    return "\n".join(lines)


def show_exercises(chapter: int) -> None:
    """Display the chapter's exercises (Markdown in a notebook, text elsewhere)."""
    from studylib.workbook.chapter import in_notebook

    text = exercises_markdown(chapter)
    if in_notebook():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        print(text)

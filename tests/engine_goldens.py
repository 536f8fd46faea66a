"""Token and logit fingerprints of every engine, arithmetic and ISA path, recorded before the kernels move.

A fingerprint is the SHA-256 of the exact float32 bytes of the logits of three steps (a prompt prefill
of many rows, a k-row step over the cache, and one decode row) and of the greedy tokens that follow. The
kernel library may be rebuilt, split or moved; what it computes may not change, so each case's
fingerprint is recorded here (``tests/goldens/engines.json``) and ``test_engine_goldens`` holds the code
to it. Run ``python tests/engine_goldens.py --write`` to record the cases this CPU runs (a case a CPU
cannot run, such as the AMX path on an AMD machine, is skipped there and kept in the file).

Goldens are kept per CPU class (``cpu_class``: the vendor and the kernels torch dispatches to). Our own C
kernels are built with explicit ISA flags, so a forced path computes the same bits on any CPU that has it;
but the rest of an fp32 step runs torch's kernels (norms, attention, the dense matmuls), which pick their
vector width and summation order by CPU (AVX512 on the Xeon, AVX2 on an AVX2-only EPYC), so those logits
differ in their last bits between classes while the greedy tokens do not. On a class with no record of its
own a case is held to every part that all recorded classes agree on (the tokens at least).

A case is (model, weights, act, switches): the environment switches force each ISA path the way a user
forces it (``STUDYLIB_INT8_ISA=avx2`` ...), so every path this CPU has is fingerprinted."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from pathlib import Path

GOLDENS = Path(__file__).with_name("goldens") / "engines.json"
PROMPT = "The capital of France is Paris. The capital of Spain is Madrid, and the capital of Italy is"
STEP_ROWS = 8  # the k-row step after the prompt: the rows a speculative verify or a small batch brings
NEW_TOKENS = 6

# (family of switches, env variable, its paths best first, the CPU flags each path needs)
_AVX2 = {"avx2", "fma", "f16c"}
_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "f16c", "fma"}
QUANT = ("STUDYLIB_QUANT_ISA", {"avx512": {"avx512f", "f16c", "fma"}, "avx2": _AVX2})
INT8 = ("STUDYLIB_INT8_ISA", {"amx": _AVX512 | {"amx_tile", "amx_int8"}, "avx512vnni": _AVX512,
                              "avxvnni": _AVX2 | {"avx_vnni"}, "avx2": _AVX2, "scalar": set()})
BF16 = ("STUDYLIB_BF16_ISA", {"avx512bf16": {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"} | _AVX2,
                              "avx2": _AVX2, "scalar": set()})
STREAM = ("STUDYLIB_CPU_LINEAR", {"stream": {"avx2", "fma"}, "torch": set()})


def _grid(*families) -> list[dict[str, str]]:
    grid: list[dict[str, str]] = [{}]
    for env, paths in families:
        grid = [{**g, env: p} for g in grid for p in paths]
    return grid


def cases() -> list[dict]:
    """Every case, whether or not this CPU runs it: the study's engines on the embedded model, and every
    block format on the tiny random model (cheap to load, so each format meets every path)."""
    out = []
    real = "smollm2-135m"
    for sw in _grid(STREAM):
        out.append({"model": real, "weights": "dense", "act": "fp32", "env": sw})
    for weights in ("gguf", "gguf+bf16prefill"):
        for sw in _grid(QUANT):
            out.append({"model": real, "weights": weights, "act": "fp32", "env": sw})
    for sw in _grid(QUANT, INT8):
        out.append({"model": real, "weights": "gguf", "act": "int8", "env": sw})
    for sw in _grid(QUANT, BF16):
        out.append({"model": real, "weights": "gguf", "act": "bf16", "env": sw})
    tiny = "tiny-random"
    for weights in ("q8_0", "q4_0", "q4_1", "awq4"):
        for sw in _grid(QUANT):
            out.append({"model": tiny, "weights": weights, "act": "fp32", "env": sw})
        for sw in _grid(QUANT, INT8):
            out.append({"model": tiny, "weights": weights, "act": "int8", "env": sw})
        for sw in _grid(QUANT, BF16):
            out.append({"model": tiny, "weights": weights, "act": "bf16", "env": sw})
    return out


def key(case: dict) -> str:
    sw = ",".join(f"{k.removeprefix('STUDYLIB_').lower()}={v}" for k, v in sorted(case["env"].items()))
    return f"{case['model']}|{case['weights']}|{case['act']}|{sw}"


def runnable(case: dict, flags: frozenset[str]) -> bool:
    for env, paths in (QUANT, INT8, BF16, STREAM):
        if env in case["env"] and not paths[case["env"][env]] <= flags:
            return False
    return True


@contextlib.contextmanager
def switches(env: dict[str, str]):
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _sha(t) -> str:
    import torch

    return hashlib.sha256(t.detach().to(torch.float32).contiguous().cpu().numpy().tobytes()).hexdigest()


def fingerprint(case: dict) -> dict[str, str]:
    """Load the case's engine under its switches and hash what it computes."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's own reductions split by thread count, so its bits depend on it
    try:
        return _fingerprint(case)
    finally:
        torch.set_num_threads(threads)


def _fingerprint(case: dict) -> dict[str, str]:
    import torch

    from studylib.decoding import ar
    from studylib.models import DenseKVCache, load_model

    with switches(case["env"]), torch.inference_mode():
        lm, tok = load_model(case["model"], "cpu", "float32", weights=case["weights"], act=case["act"])
        ids = [int(t) for t in tok.encode(PROMPT)][:48]
        if len(ids) < 16:  # the byte tokenizer of a random model: plenty of rows
            ids = ids + [3 + (7 * i) % 200 for i in range(16)]
        cache = DenseKVCache(lm.config, 1, len(ids) + STEP_ROWS + 1, lm.device, lm.dtype)
        x = torch.tensor(ids, dtype=torch.long)[None]
        prefill = lm(x, cache.begin(x.shape[1]), logits="all").logits
        step_ids = torch.tensor([(ids[i % len(ids)] * 31 + 7) % lm.config.vocab_size for i in range(STEP_ROWS)])[None]
        step = lm(step_ids, cache.begin(STEP_ROWS), logits="all").logits
        one = lm(step_ids[:, :1], cache.begin(1), logits="all").logits
        tokens = ar.generate(lm, ids, NEW_TOKENS).token_ids
    return {"prefill": _sha(prefill), "step": _sha(step), "decode": _sha(one),
            "tokens": hashlib.sha256(json.dumps(list(tokens)).encode()).hexdigest()}


def cpu_class(cpuinfo: str | None = None, capability: str | None = None) -> str:
    """This machine's golden class: its vendor and the kernel family torch dispatches to (e.g.
    "GenuineIntel, torch AVX512", "AuthenticAMD, torch AVX2")."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    vendor = next((line.partition(":")[2].strip() for line in cpuinfo.splitlines()
                   if line.partition(":")[0].strip() == "vendor_id"), "unknown vendor")
    if capability is None:
        import torch

        capability = torch.backends.cpu.get_cpu_capability()
    return f"{vendor}, torch {capability}"


def load() -> dict[str, dict[str, dict[str, str]]]:
    """{CPU class: {case key: fingerprint}}."""
    return json.loads(GOLDENS.read_text()) if GOLDENS.exists() else {}


def expected(goldens: dict, case_key: str, this_class: str) -> dict[str, str]:
    """What a case must compute on ``this_class``: its own record where it has one; otherwise every part
    (prefill, step, decode, tokens) on which all the classes that recorded the case agree, so a new CPU
    class is still held to the bits that no class has shown to move."""
    if case_key in goldens.get(this_class, {}):
        return goldens[this_class][case_key]
    seen = [rec[case_key] for rec in goldens.values() if case_key in rec]
    if not seen:
        return {}
    agreed = {part: v for part, v in seen[0].items() if all(s.get(part) == v for s in seen)}
    # one class alone cannot show which logits are portable: only its tokens are
    return agreed if len(seen) > 1 else {"tokens": seen[0]["tokens"]}


def write() -> int:
    from studylib.cpuinfo import cpu_flags

    flags = cpu_flags()
    goldens = load()
    mine = goldens.setdefault(cpu_class(), {})
    todo = [c for c in cases() if runnable(c, flags)]
    for i, c in enumerate(todo, 1):
        mine[key(c)] = fingerprint(c)
        print(f"{i}/{len(todo)} {key(c)}", file=sys.stderr)
    GOLDENS.parent.mkdir(parents=True, exist_ok=True)
    GOLDENS.write_text(json.dumps(goldens, indent=1, sort_keys=True) + "\n")
    print(f"recorded {len(todo)} cases for {cpu_class()} in {GOLDENS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        print("usage: python tests/engine_goldens.py --write", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(write())

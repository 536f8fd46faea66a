"""The kernel library's registry: every native kernel of the study, what it computes, how to force its
ISA path, and the pure-PyTorch reference it is held to.

One row per kernel (``KERNELS``). ``serves`` names the (weights, activation arithmetic, phase) cells the
kernel computes, so ``kernel_for`` answers "which code computes a linear of this kind" from one table:

- weights: ``dense`` (fp32 / bf16 tensors) or ``blocks`` (gguf, q8_0, q4_0, q4_1, awq4: 32-value blocks);
- act: ``fp32``, ``int8`` or ``bf16`` (``--act``), and ``bf16prefill`` for a block format whose prefill
  alone runs in bf16 (``<format>+bf16prefill``);
- phase: ``decode`` (few rows: a decode step, a verification, a small batch; up to ``DECODE_ROWS``),
  ``prefill`` (more rows), ``step`` (a whole fused decode step), ``serving`` (batch-invariant rows of
  the serving engine), ``attention`` (a decode step's attention over a cache), ``sparse attention``
  (Quest's: over the pages it selects).

A cell no native kernel serves runs PyTorch (``TORCH``: oneDNN / MKL), which the table says too. The
kernels' Python modules build them through ``models.build`` and keep their own entry points; this module
imports none of them until asked for a path, so anything may read the table. Provenance records
``paths()``: the ISA path each kernel runs in this process."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from studylib.errors import StudylibError

TORCH = "torch"  # no native kernel: PyTorch's own (oneDNN / MKL) computes the cell
DECODE_ROWS = 32  # rows up to which a dense linear is a decode-phase one (cpu_linear.STREAM_MAX_ROWS)
BLOCK_DECODE_ROWS = 64  # the same bound for block weights under fp32 (quant.KERNEL_MAX_ROWS)
WEIGHTS = ("dense", "blocks")
ACTS = ("fp32", "int8", "bf16", "bf16prefill")
PHASES = ("decode", "prefill", "step", "serving", "attention", "sparse attention")


@dataclass(frozen=True)
class Kernel:
    name: str
    source: str  # the C source, relative to studylib/
    wrapper: str  # the module that builds it and calls it
    reference: str  # "module:function" of the pure-PyTorch reference it is tested against
    env: str | None  # the environment switch that forces its path
    path_of: str  # "module:function" that names the path this process runs ("stream", "amx", ...)
    serves: tuple[tuple[str, str, str], ...]  # (weights, act, phase) cells it computes
    what: str

    def path(self) -> str:
        """The ISA path (or backend) this kernel runs in this process; "unknown (why)" if it cannot say."""
        module, _, fn = self.path_of.partition(":")
        try:
            return str(getattr(importlib.import_module(module), fn)())
        except Exception as err:  # provenance must never fail a report
            return f"unknown ({err})"

    def reference_fn(self):
        module, _, fn = self.reference.partition(":")
        return getattr(importlib.import_module(module), fn)


KERNELS: tuple[Kernel, ...] = (
    Kernel("stream_linear", "models/csrc/stream_linear.c", "studylib.models.cpu_linear",
           "studylib.models.cpu_linear:reference", "STUDYLIB_CPU_LINEAR", "studylib.models.cpu_linear:backend",
           (("dense", "fp32", "decode"),),
           "fp32/bf16 weights streamed once for every row (row-invariant); past the decode rows MKL's GEMM"),
    Kernel("quant_linear", "models/csrc/quant_linear.c", "studylib.models.quant",
           "studylib.models.quant:reference_linear", "STUDYLIB_QUANT_ISA", "studylib.models.quant:isa",
           (("blocks", "fp32", "decode"), ("blocks", "bf16prefill", "decode")),
           "block weights unpacked to fp32 in registers, fp32 dot products"),
    Kernel("int8_linear", "models/csrc/int8_linear.c", "studylib.models.int8_linear",
           "studylib.models.int8_linear:reference", "STUDYLIB_INT8_ISA", "studylib.models.int8_linear:path",
           (("blocks", "int8", "decode"), ("blocks", "int8", "prefill")),
           "activations quantised to int8 per 32-block, exact integer block sums (AMX / VNNI / AVX2 / scalar)"),
    Kernel("bf16_linear", "models/csrc/bf16_linear.c", "studylib.models.bf16_linear",
           "studylib.models.bf16_linear:reference", "STUDYLIB_BF16_ISA", "studylib.models.bf16_linear:path",
           (("blocks", "bf16", "decode"), ("blocks", "bf16", "prefill")),
           "activations and unpacked weights rounded to bf16, fp32 accumulation"),
    Kernel("decode_layers", "models/csrc/decode_layers.c", "studylib.models.decode_layers",
           "studylib.models.decode_layers:reference", "STUDYLIB_DECODE_LAYERS", "studylib.models.quant:isa",
           (("blocks", "fp32", "step"), ("blocks", "int8", "step"), ("blocks", "bf16", "step"),
            ("dense", "fp32", "step")),
           "every layer of a decode step in one C call: norms, linears (through the act's kernel), RoPE, attention"),
    Kernel("invariant_gemm", "models/csrc/invariant_gemm.c", "studylib.models.invariant",
           "studylib.models.invariant:reference_gemm", "STUDYLIB_INVARIANT_ISA", "studylib.models.invariant:describe",
           (("dense", "fp32", "serving"),),
           "a GEMM whose rows' bits do not depend on the batch (serving equals single-request AR)"),
    Kernel("invariant_attention", "models/csrc/invariant_attention.c", "studylib.models.invariant",
           "studylib.models.invariant:dense_attention_ref", "STUDYLIB_INVARIANT_ISA",
           "studylib.models.invariant:describe", (("dense", "fp32", "attention"),),
           "paged attention with a fixed reduction order per row"),
    Kernel("quest_decode", "attention/csrc/quest_decode.c", "studylib.attention.quest",
           "studylib.attention.quest:quest_attention_ref", "STUDYLIB_QUEST_KERNEL",
           "studylib.attention.quest:kernel_backend", (("dense", "fp32", "sparse attention"),),
           "Quest's page selection and the attention over the chosen pages, one decode step"),
)
BY_NAME = {k.name: k for k in KERNELS}


def kernel(name: str) -> Kernel:
    try:
        return BY_NAME[name]
    except KeyError:
        raise StudylibError(f"no kernel {name!r}; the kernels are {', '.join(BY_NAME)}.") from None


def phase_of(weights: str, rows: int) -> str:
    """``decode`` or ``prefill`` for a linear of ``rows`` rows: where the decode kernels hand over to GEMM."""
    return "decode" if rows <= (DECODE_ROWS if weights == "dense" else BLOCK_DECODE_ROWS) else "prefill"


def kernel_for(weights: str, act: str, phase: str) -> str:
    """The kernel that computes a (weights, act, phase) cell, or ``TORCH`` where PyTorch does. ``weights``
    may be a format name (``gguf``, ``q4_1+bf16prefill``...); it is read as ``dense`` or ``blocks``."""
    w, a = _kind(weights, act)
    if phase not in PHASES:
        raise StudylibError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}.")
    for k in KERNELS:
        if (w, a, phase) in k.serves:
            return k.name
    return TORCH


def _kind(weights: str, act: str) -> tuple[str, str]:
    if act not in ACTS:
        raise StudylibError(f"unknown activation arithmetic {act!r}; one of {', '.join(ACTS)}.")
    if weights == "dense":
        return "dense", act
    if weights in WEIGHTS:
        return weights, act
    base, _, suffix = weights.partition("+")
    if base not in ("gguf", "q8_0", "q4_0", "q4_1", "awq4") or suffix not in ("", "bf16prefill"):
        raise StudylibError(f"unknown weight format {weights!r}; dense, gguf, q8_0, q4_0, q4_1 or awq4, "
                            "optionally +bf16prefill.")
    return "blocks", ("bf16prefill" if suffix and act == "fp32" else act)


def paths() -> dict[str, str]:
    """Every kernel's path in this process, for provenance: {kernel name: path}."""
    return {k.name: k.path() for k in KERNELS}


def table():
    """The registry as a table (one row per kernel and cell it serves), for the README and the pages."""
    import pandas as pd

    return pd.DataFrame([{"kernel": k.name, "weights": w, "act": a, "phase": p, "switch": k.env or "",
                          "reference": k.reference, "source": k.source} for k in KERNELS for (w, a, p) in k.serves])

"""Sparse attention: patterns, backends (torch / triton / cuda) and bounded-memory KV caches.

``Pattern.parse("window:512")`` describes the mask once for every backend; ``attention(q, k, v,
pattern, backend)`` runs it; ``make_cache(spec, ...)`` gives the decoder a KV cache that applies it
(``SinkKVCache`` keeps only the sinks and the recent window, so its memory is constant;
``QuestKVCache`` keeps everything and reads, per decode step, only the pages the query needs).
"""

from studylib.attention.dispatch import BACKENDS, attention, check_qkv
from studylib.attention.patterns import GRAMMAR, BlockSparse, Dense, Pattern, Quest, Sinks, Window

__all__ = [
    "BACKENDS", "GRAMMAR", "BlockSparse", "Dense", "Pattern", "PatternKVCache", "Quest", "QuestKVCache", "SinkKVCache", "Sinks",
    "Window", "attention", "check_qkv", "make_cache",
]


def __getattr__(name: str):
    # The caches pull in the model runtime; import them on first use only.
    if name in ("SinkKVCache", "PatternKVCache", "make_cache"):
        from studylib.attention import caches

        return getattr(caches, name)
    if name == "QuestKVCache":
        from studylib.attention import quest

        return quest.QuestKVCache
    raise AttributeError(name)

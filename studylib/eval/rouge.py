"""ROUGE-1/2/L F1 via Google's ``rouge-score`` package (the ``eval`` extra), the scorer XSum results
are usually reported with. We only wrap it: re-implementing ROUGE invites silent tokenisation drift."""

from __future__ import annotations

from statistics import fmean

from studylib.errors import StudylibError

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _scorer(types: tuple[str, ...], stemmer: bool):
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise StudylibError("ROUGE needs the rouge-score package; install it with `pip install -e .[eval]`.") from None
    return rouge_scorer.RougeScorer(list(types), use_stemmer=stemmer)


def rouge_pairs(predictions: list[str], references: list[str], types: tuple[str, ...] = ROUGE_TYPES,
                stemmer: bool = True) -> list[dict[str, float]]:
    """F1 of each type for each (prediction, reference) pair."""
    if len(predictions) != len(references):
        raise StudylibError(f"{len(predictions)} predictions but {len(references)} references; pair them up.")
    scorer = _scorer(tuple(types), stemmer)
    # rouge_score's signature is score(target, prediction): the reference comes first.
    pairs = zip(predictions, references, strict=True)
    return [{t: s.fmeasure for t, s in scorer.score(ref, pred).items()} for pred, ref in pairs]


def rouge(predictions: list[str], references: list[str], types: tuple[str, ...] = ROUGE_TYPES,
          stemmer: bool = True) -> dict[str, float]:
    """Mean F1 per ROUGE type over the pairs (the usual corpus-level XSum figure)."""
    pairs = rouge_pairs(predictions, references, types, stemmer)
    if not pairs:
        raise StudylibError("no predictions to score.")
    return {t: fmean(p[t] for p in pairs) for t in types}

"""The next-word task: which tokens make a word, how a word is scored, and the power of the paired ratio."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from studylib import data
from studylib.claims import FAILS, HOLDS, judge_at_least
from studylib.errors import StudylibError
from studylib.eval.lastword import (
    WordSpan,
    as_estimate,
    chance_score,
    documents,
    final_mask,
    greedy_argmax,
    paired_ratio,
    power_fields,
    score_logits,
    score_model,
    word_spans,
)
from studylib.models import DenseKVCache
from studylib.models.tokenizer import ByteTokenizer

TEXT = "The cat sat on the mat, 42 times. It was unbelievably happy!\n\nDogs ran a mile? Yes"
# "The" has no prefix to predict it from, "a" is one letter, "42" no word, "Yes" may go on past the end.
WORDS = ["cat", "sat", "on", "the", "mat", "times", "It", "was", "unbelievably", "happy", "Dogs", "ran", "mile"]
FINAL = {"times", "happy", "mile"}


@pytest.fixture(scope="module")
def bpe():
    """A GPT-2 style byte-level BPE ('Ġ' marks a space, 'Ċ' a newline) like SmolLM2's, trained in
    milliseconds on a few sentences so that unseen words split into several tokens."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    tok = ByteLevelBPETokenizer()
    corpus = ["The cat sat on the mat, and the dog sat on the log. It was a happy day.\n\nThe dogs ran."] * 10
    tok.train_from_iterator(corpus, vocab_size=300, min_frequency=1, show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok._tokenizer)


def _words(tok, ids, spans):
    return [tok.decode(ids[s.start : s.end]).strip() for s in spans]


# --- words ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["bpe", "byte"])
def test_word_spans_on_real_tokenizers(which, bpe):
    tok = bpe if which == "bpe" else ByteTokenizer()
    ids = tok(TEXT)["input_ids"]
    spans = word_spans(tok, ids)
    assert _words(tok, ids, spans) == WORDS
    assert {w for w, s in zip(WORDS, spans, strict=True) if s.sentence_final} == FINAL
    assert final_mask(spans).sum() == len(FINAL)
    # Words split over several tokens are one item: the BPE never saw "unbelievably".
    assert max(s.end - s.start for s in spans) > 1
    later = word_spans(tok, ids, min_context=spans[3].start + 1)
    assert _words(tok, ids, later) == WORDS[4:]


class SentencePieceLike:
    """'▁' marks a space and a lone token decodes without it, as SentencePiece decoders do: only the
    vocabulary string says that a word starts here."""

    vocab = ["<s>", "▁The", "▁cat", "▁sat", ".", "▁It", "▁ran", "s", "!"]

    def convert_ids_to_tokens(self, i):
        return self.vocab[i]

    def decode(self, ids, **_):
        return "".join(self.vocab[i] for i in ids).replace("▁", " ").lstrip()


def test_word_spans_reads_space_markers():
    ids = [0, 1, 2, 3, 4, 5, 6, 7, 8, 1]
    spans = word_spans(SentencePieceLike(), ids)
    assert spans == [WordSpan(1, 2, False), WordSpan(2, 3, False), WordSpan(3, 4, True),
                     WordSpan(5, 6, False), WordSpan(6, 8, True)]


def test_word_spans_rejects_no_context():
    with pytest.raises(StudylibError):
        word_spans(ByteTokenizer(), [1, 2, 3], min_context=0)


def test_chance_is_computed_from_word_lengths():
    spans = [WordSpan(1, 2, False), WordSpan(2, 4, False)]
    assert chance_score(spans, 10) == pytest.approx((0.1 + 0.01) / 2)
    assert chance_score(spans, 49152) < 1e-4


# --- scoring ----------------------------------------------------------------------------------------


def test_score_logits_needs_every_token_of_a_word():
    ids = np.arange(10) + 20
    spans = [WordSpan(1, 2, False), WordSpan(2, 4, False), WordSpan(5, 8, True)]
    perfect = ids[1:].copy()  # argmax[i] predicts ids[i + 1]
    assert score_logits(perfect, ids, spans).tolist() == [True, True, True]
    wrong = perfect.copy()
    wrong[2] = 0  # the second token of word (2, 4)
    assert score_logits(wrong, ids, spans).tolist() == [True, False, True]
    wrong[4] = 0  # argmax[4] predicts ids[5], the first token of word (5, 8)
    assert score_logits(wrong, ids, spans).tolist() == [True, False, False]
    # A trailing prediction past the text is accepted and ignored; torch input too.
    assert score_logits(torch.as_tensor(np.append(wrong, 7)), ids, spans).tolist() == [True, False, False]
    with pytest.raises(StudylibError):
        score_logits(perfect[:-1], ids, spans)
    with pytest.raises(StudylibError):
        score_logits(perfect, ids, [WordSpan(0, 1, False)])


def _mixed_ids(model, T: int, seed: int = 0) -> list[int]:
    """A text the model predicts right about half the time: each token is the model's greedy choice
    or a random one, so the scores to compare are neither all right nor all wrong."""
    gen = torch.Generator().manual_seed(seed)
    kv = DenseKVCache(model.config, 1, T, model.device, model.dtype)
    ids = [int(torch.randint(3, 259, (1,), generator=gen))]
    with torch.inference_mode():
        while len(ids) < T:
            logits = model.forward(torch.tensor([[ids[-1]]]), kv.begin(1), logits="all").logits[0, -1]
            coin = float(torch.rand(1, generator=gen)) < 0.6
            ids.append(int(logits.argmax()) if coin else int(torch.randint(3, 259, (1,), generator=gen)))
    return ids


def test_score_model_matches_a_full_forward_at_every_chunk(tiny):
    model, _ = tiny
    T = 90
    ids = _mixed_ids(model, T)
    with torch.inference_mode():
        kv = DenseKVCache(model.config, 1, T, model.device, model.dtype)
        full = model.forward(torch.tensor([ids]), kv.begin(T), logits="all").logits[0].argmax(-1)
    rng = np.random.default_rng(0)
    spans, s = [], 1
    while s < T:
        e = min(T, s + int(rng.integers(1, 4)))
        spans.append(WordSpan(s, e, False))
        s = e
    want = score_logits(full, ids, spans)
    assert 0 < want.sum() < len(spans)
    for chunk in (1, 7, 256):
        assert torch.equal(greedy_argmax(model, ids, chunk=chunk), full[:-1])
        assert score_model(model, ids, spans, chunk=chunk).tolist() == want.tolist()


def test_score_model_uses_the_given_cache(tiny):
    model, _ = tiny
    made = []

    def factory(cfg, max_len, device, dtype):
        made.append(max_len)
        return DenseKVCache(cfg, 1, max_len, device, dtype)

    ids = _mixed_ids(model, 20, seed=1)
    score_model(model, ids, [WordSpan(1, 3, False)], kv_factory=factory, chunk=5)
    assert made == [20]


# --- the paired ratio -------------------------------------------------------------------------------


def _ref(n_docs: int, items: int, acc: float = 0.5, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random(items) < acc for _ in range(n_docs)]


def _drop(ref: list[np.ndarray], share: float, seed: int = 1) -> list[np.ndarray]:
    """Each document loses ``share`` of its correct items."""
    rng = np.random.default_rng(seed)
    out = []
    for r in ref:
        a = r.copy()
        hit = np.flatnonzero(r)
        a[rng.choice(hit, size=round(share * hit.size), replace=False)] = False
        out.append(a)
    return out


def test_identical_arms_are_exactly_one():
    ref = _ref(30, 200)
    tr = paired_ratio(ref, [r.copy() for r in ref])
    assert (tr.value, tr.ci_low, tr.ci_high, tr.mdc) == (1.0, 1.0, 1.0, 0.0)
    assert tr.has_power and tr.discordant == 0 and tr.n == 30 and tr.items == 6000
    assert tr.reference_score == tr.arm_score == pytest.approx(0.5, abs=0.02)
    assert judge_at_least("C6", "task ratio", as_estimate(tr), 0.99, ">= 99%", "", 6,
                          unit="documents").verdict == HOLDS


def test_a_20_percent_loss_is_seen():
    ref = _ref(30, 200)
    tr = paired_ratio(ref, _drop(ref, 0.2))
    assert tr.value == pytest.approx(0.8, abs=0.01)
    assert tr.ci_low <= tr.value <= tr.ci_high < 0.99
    assert tr.discordant == sum(r.sum() for r in ref) - sum(a.sum() for a in _drop(ref, 0.2))
    assert judge_at_least("C6", "task ratio", as_estimate(tr), 0.99, ">= 99%", "", 6,
                          unit="documents").verdict == FAILS


def test_a_1_percent_loss_is_seen_at_a_realistic_size():
    # 100 documents of 400 words at SmolLM2-like accuracy: the power the task exists for.
    ref = _ref(100, 400, acc=0.4)
    tr = paired_ratio(ref, _drop(ref, 0.01))
    assert tr.has_power and tr.ci_high < 1.0


def test_few_noisy_documents_have_no_power():
    ref = _ref(3, 20)
    arm = _ref(3, 20, seed=5)  # an unrelated arm of the same accuracy: large, noisy differences
    tr = paired_ratio(ref, arm)
    assert tr.mdc > 0.01 and not tr.has_power
    assert tr.n_needed > tr.n
    assert tr.n_needed == int(np.ceil(3 * (tr.mdc / 0.01) ** 2))
    wide, narrow = paired_ratio(ref, arm, confidence=0.99), paired_ratio(ref, arm, confidence=0.8)
    assert wide.ci_high - wide.ci_low > narrow.ci_high - narrow.ci_low


def test_the_bootstrap_resamples_documents():
    # The same 5% loss, all in one document of ten, or spread evenly: an item-level bootstrap would
    # give both the same CI; resampling documents sees that a clustered loss is less certain.
    ref = [np.ones(100, dtype=bool) for _ in range(10)]
    clustered = [r.copy() for r in ref]
    clustered[0][:50] = False
    spread = [r.copy() for r in ref]
    for a in spread:
        a[:5] = False
    c, s = paired_ratio(ref, clustered), paired_ratio(ref, spread)
    assert c.value == s.value == pytest.approx(0.95)
    assert c.discordant == s.discordant == 50
    assert s.mdc < 1e-9 < 0.02 < c.mdc
    assert np.isnan(c.samples).sum() == 0 and c.samples[0] == 0.5


def test_no_ci_without_two_documents_and_nan_safe_samples():
    one = paired_ratio([np.array([True, False])], [np.array([False, False])])
    assert np.isnan(one.ci_low) and not one.has_power and one.n_needed is None
    tr = paired_ratio([np.array([False, False]), np.array([True, True])],
                      [np.array([True, False]), np.array([True, False])])
    assert tr.value == 1.0 and np.isnan(tr.samples[0]) and tr.samples[1] == 0.5
    est = as_estimate(tr)
    assert (est.value, est.ci_low, est.ci_high, est.n) == (tr.value, tr.ci_low, tr.ci_high, 2)
    assert set(power_fields(tr)) == {"reference_score", "chance", "mdc", "has_power", "n_needed", "items",
                                     "discordant"}
    assert tr.to_dict()["discordant"] == 2
    with pytest.raises(StudylibError):
        paired_ratio([np.ones(3, bool)], [np.ones(4, bool)])
    with pytest.raises(StudylibError):
        paired_ratio([np.ones(3, bool)], [])


# --- documents --------------------------------------------------------------------------------------


@pytest.fixture
def fake_xsum(monkeypatch):
    texts = [f"Article {i}: " + "word " * (4 + 9 * (i % 3)) for i in range(12)]
    texts.append(texts[0])  # a duplicate row must not make two documents
    records = [SimpleNamespace(meta={"document": t}) for t in texts]
    monkeypatch.setattr(data, "load_dataset", lambda name: records)
    return texts[:-1]


def test_documents_join_short_texts_and_truncate(fake_xsum):
    tok = ByteTokenizer()
    docs = documents(tok, 4, 50, seed=0)
    assert len(docs) == 4 and all(len(d) == 50 and d[0] == tok.bos_token_id for d in docs)
    assert any("\n\n" in tok.decode(d) for d in docs)  # short articles are joined
    # No article feeds two documents: documents are independent units for the bootstrap.
    heads = [h for d in docs for h in tok.decode(d).split("Article ")[1:]]
    ids_seen = [h.split(":")[0] for h in heads]
    assert len(ids_seen) == len(set(ids_seen))
    assert documents(tok, 4, 50, seed=0) == docs and documents(tok, 4, 50, seed=1) != docs
    with pytest.raises(StudylibError):
        documents(tok, 40, 50)
    with pytest.raises(StudylibError):
        documents(tok, 1, 50, source="humaneval")


@pytest.mark.skipif(not data.is_cached("xsum"), reason="the xsum data set is not cached here")
def test_documents_from_real_xsum():
    tok = ByteTokenizer()
    docs = documents(tok, 3, 2000)
    assert [len(d) for d in docs] == [2000] * 3
    assert len(word_spans(tok, docs[0])) > 100

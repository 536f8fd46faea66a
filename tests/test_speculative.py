"""Speculative decoding, self-speculation and prompt lookup: lossless greedy output and KV bookkeeping."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from studylib.decoding import ar, prompt_lookup, speculative
from studylib.decoding.drafts import ModelDraft, SelfDraft, parse_layers, resolve_draft
from studylib.decoding.prompt_lookup import NgramIndex
from studylib.decoding.speculative import AdaptiveGamma, expected_tokens, predicted_speedup
from studylib.decoding.verify import residual, verify_greedy, verify_sampling
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, load_model

PROMPT = list(b"hello world, hello world, this is a test of the")


@pytest.fixture(scope="module")
def other():
    return load_model("tiny-random:1")[0]


def _ar(model, prompt, n, tokenizer=None):
    return ar.generate(model, prompt, n, tokenizer=tokenizer).token_ids


# ---------------------------------------------------------------------------- verify step


def test_verify_greedy_counts_matching_prefix():
    logits = torch.full((4, 10), -1.0)
    for row, tok in enumerate([3, 5, 7, 9]):
        logits[row, tok] = 1.0
    assert verify_greedy(logits, [3, 5, 7]) == (3, 9)  # all accepted, bonus from the last row
    assert verify_greedy(logits, [3, 6, 7]) == (1, 5)  # first mismatch at 1: the target's token
    assert verify_greedy(logits[:1], []) == (0, 3)


def test_verify_sampling_identical_distributions_accepts_everything():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 12, generator=g), -1)
    for _ in range(50):
        toks = [int(torch.multinomial(p[i], 1, generator=g)) for i in range(3)]
        assert verify_sampling(p, p[:3], toks, g)[0] == 3


def test_verify_sampling_never_accepts_a_token_the_target_excludes():
    g = torch.Generator().manual_seed(0)
    p = torch.zeros(2, 5)
    p[:, 1] = 1.0
    n_acc, nxt = verify_sampling(p, None, [4], g)  # one-hot proposal of an impossible token
    assert (n_acc, nxt) == (0, 1)


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual(p, torch.tensor(0)), torch.tensor([0.0, 0.6, 0.4]))
    assert torch.allclose(residual(p, p), p)  # p == q: fall back to p rather than divide by zero


# ---------------------------------------------------------------------------- greedy == AR


@pytest.mark.parametrize("gamma", [1, 3, 6, "adaptive"])
@pytest.mark.parametrize("which", ["random", "itself", "self:1", "self:exit:1"])
def test_speculative_greedy_equals_ar(tiny, other, which, gamma):
    model, tok = tiny
    draft = {"random": other, "itself": model}.get(which, which)
    want = _ar(model, PROMPT, 40)
    res = speculative.generate(model, PROMPT, 40, draft=draft, gamma=gamma)
    assert res.token_ids == want
    assert res.new_tokens == 40 and sum(res.accepted_lengths) == 39  # the first token comes from prefill
    assert res.target_forwards == 1 + res.steps == 1 + len(res.accepted_lengths)
    if which == "itself":
        # The target as its own draft: every proposal accepted, gamma + 1 tokens per step.
        assert res.extra["alpha"] == 1.0
        assert all(n == g + 1 for n, g in zip(res.accepted_lengths[:-1], res.extra["gamma_trace"], strict=False))


def test_random_draft_is_rarely_accepted_but_still_exact(tiny, other):
    model, _ = tiny
    res = speculative.generate(model, PROMPT, 40, draft=other, gamma=4)
    assert res.extra["alpha"] < 0.5
    assert res.extra["draft_forwards"] == 4 * res.steps - sum(4 - g for g in res.extra["gamma_trace"])


def test_eos_inside_an_accepted_block_stops_like_ar(tiny):
    model, _ = tiny
    free = _ar(model, PROMPT, 40)
    # An EOS id that first appears at output position >= 3, so it lands inside a drafted block.
    pos = next(i for i in range(3, 40) if free[i] not in free[:i])
    tok = SimpleNamespace(eos_token_id=free[pos], decode=lambda ids: "")
    want = ar.generate(model, PROMPT, 40, tokenizer=tok)
    assert want.stop_reason == "eos" and want.token_ids == free[: pos + 1]
    for draft in (model, "self:1"):
        res = speculative.generate(model, PROMPT, 40, tokenizer=tok, draft=draft, gamma=8)
        assert res.token_ids == want.token_ids and res.stop_reason == "eos"
    res = prompt_lookup.generate(model, PROMPT, 40, tokenizer=tok, gamma=8)
    assert res.token_ids == want.token_ids and res.stop_reason == "eos"


@pytest.mark.parametrize("n", [1, 2, 5, 7, 11])
def test_max_new_tokens_reached_mid_block(tiny, n):
    model, _ = tiny
    want = _ar(model, PROMPT, n)
    for draft in (model, "self:0"):
        res = speculative.generate(model, PROMPT, n, draft=draft, gamma=4)
        assert res.token_ids == want and res.new_tokens == n and res.stop_reason == "length"
    assert prompt_lookup.generate(model, PROMPT, n, gamma=4).token_ids == want


@pytest.mark.parametrize("gamma,ngram", [(1, 1), (4, 3), (10, 2)])
def test_prompt_lookup_greedy_equals_ar(tiny, gamma, ngram):
    model, _ = tiny
    want = _ar(model, PROMPT, 60)
    res = prompt_lookup.generate(model, PROMPT, 60, gamma=gamma, ngram=ngram)
    assert res.token_ids == want
    assert sum(res.accepted_lengths) == 59


def test_prompt_lookup_copies_repeated_text(tiny):
    # The tiny model falls into a loop; once it has, every lookup proposal is right.
    model, _ = tiny
    res = prompt_lookup.generate(model, PROMPT, 80, gamma=6, ngram=3)
    assert res.extra["accepted"] > 0
    assert res.target_forwards < 1 + 79


def test_ngram_index_finds_longest_latest_match():
    seq = [1, 2, 3, 9, 1, 2, 3, 8, 5, 2, 3]
    idx = NgramIndex(3)
    idx.extend(seq)
    # suffix (5, 2, 3) never occurred; (2, 3) occurred twice, the latest continues with 8.
    assert idx.lookup(seq, 3) == [8, 5, 2]
    assert idx.lookup([4, 4, 7], 2) == []  # no earlier occurrence of 7


# ---------------------------------------------------------------------------- KV bookkeeping


def _assert_cache_is_fresh_prefill(model, cache: DenseKVCache, committed: list[int]):
    """After a step the target cache must equal a fresh prefill of all committed tokens but the last."""
    n = len(committed) - 1
    assert cache.length == n
    fresh = DenseKVCache(model.config, 1, n, model.device, model.dtype)
    model(torch.tensor(committed[:-1])[None], fresh.begin(n), logits="none")
    for layer in range(model.config.num_layers):
        torch.testing.assert_close(cache.k[layer][:, :, :n], fresh.k[layer], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(cache.v[layer][:, :, :n], fresh.v[layer], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("which", ["random", "self:1"])
def test_kv_rollback_equals_fresh_prefill(tiny, other, which):
    model, _ = tiny
    checked = []

    def check(cache, seq):
        _assert_cache_is_fresh_prefill(model, cache, seq)
        checked.append(len(seq))

    draft = other if which == "random" else which
    speculative.generate(model, PROMPT, 24, draft=draft, gamma=3, on_step=check)
    assert len(checked) > 3


def test_kv_rollback_with_sampling(tiny, other):
    from studylib.sampling import SamplingParams

    model, _ = tiny
    seen = []
    speculative.generate(model, PROMPT, 24, SamplingParams(1.0, seed=3), draft=other, gamma=3,
                         on_step=lambda c, s: (_assert_cache_is_fresh_prefill(model, c, s), seen.append(1)))
    assert seen


# ---------------------------------------------------------------------------- adaptive gamma


def test_adaptive_gamma_grows_with_acceptance_and_shrinks_without():
    a = AdaptiveGamma(cost_ratio=0.1, gamma_max=8)
    for _ in range(20):
        a.update(a.next(), a.next())  # everything accepted
    assert a.next() == 8 and a.alpha > 0.9
    for _ in range(20):
        a.update(0, a.next())
    assert a.next() == 1 and a.alpha < 0.1


def test_adaptive_gamma_follows_acceptance_in_generation(tiny, other):
    model, _ = tiny
    hi = speculative.generate(model, PROMPT, 40, draft=model, gamma="adaptive", cost_ratio=0.05)
    lo = speculative.generate(model, PROMPT, 40, draft=other, gamma="adaptive", cost_ratio=0.05)
    assert max(hi.extra["gamma_trace"]) == 8
    assert sum(lo.extra["gamma_trace"]) / len(lo.extra["gamma_trace"]) < sum(hi.extra["gamma_trace"]) / len(
        hi.extra["gamma_trace"])


def test_theory_formulas():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert abs(expected_tokens(0.5, 2) - 1.75) < 1e-12
    assert abs(predicted_speedup(0.5, 2, 0.25) - 1.75 / 1.5) < 1e-12


# ---------------------------------------------------------------------------- specs and errors


def test_draft_specs(tiny):
    model, _ = tiny
    assert parse_layers("0-1", 2) == (0, 1)
    assert resolve_draft("self:exit:1", model).skip_layers == (1,)
    assert resolve_draft("self:1", model).skip_layers == (1,)
    assert isinstance(resolve_draft(model, model), ModelDraft)
    assert isinstance(resolve_draft(SelfDraft((0,)), model), SelfDraft)
    for bad in ["self:5", "self:exit:2", "self:x", "", None]:
        with pytest.raises(StudylibError):
            resolve_draft(bad, model)


def test_bad_inputs_raise_clear_errors(tiny, tmp_path, monkeypatch):
    from studylib.models import _random_model
    from studylib.models.presets import tiny_config

    model, _ = tiny
    small_vocab = _random_model(tiny_config(1, vocab_size=16), model.device, model.dtype, 1)
    with pytest.raises(StudylibError, match="vocabulary"):
        speculative.generate(model, PROMPT, 4, draft=small_vocab)
    with pytest.raises(StudylibError, match="gamma"):
        speculative.generate(model, PROMPT, 4, draft=model, gamma=0)
    with pytest.raises(StudylibError, match="gamma"):
        prompt_lookup.generate(model, PROMPT, 4, gamma="adaptive")
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    with pytest.raises(StudylibError, match="train-draft"):
        resolve_draft("distilled", model)  # an empty cache has no distilled draft


def test_self_spec_layer_search_on_tiny(tiny, tmp_path, monkeypatch):
    from studylib.decoding.self_spec import choose_skip_layers

    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    model, _ = tiny
    layers, info = choose_skip_layers(model, prompts=[PROMPT[:10], PROMPT[10:]], budget=1, new_tokens=8)
    assert len(layers) == 1 and info["path"][0]["alpha"] == 1.0  # no layer skipped: the target itself
    again, _ = choose_skip_layers(model, prompts=[PROMPT[:10], PROMPT[10:]], budget=1, new_tokens=8)
    assert again == layers and list(tmp_path.glob("self_spec/*.json"))


# ---------------------------------------------------------------------------- the embedded model


@pytest.mark.slow
def test_all_methods_greedy_equal_ar_on_smollm2(smollm2):
    from studylib.prompts import encode

    model, tok = smollm2
    prompts = ["What is the capital of France? Answer in one sentence.",
               "Repeat after me: the quick brown fox jumps over the lazy dog. the quick brown fox"]
    for text in prompts:
        ids = encode(tok, text, chat=True)
        want = ar.generate(model, ids, 32, tokenizer=tok).token_ids
        for draft in ("self:exit:20", "self:8-15"):
            assert speculative.generate(model, ids, 32, tokenizer=tok, draft=draft, gamma=4).token_ids == want
        assert speculative.generate(model, ids, 32, tokenizer=tok, draft=model, gamma=3).token_ids == want
        assert prompt_lookup.generate(model, ids, 32, tokenizer=tok).token_ids == want


def test_train_draft_exports_resumes_and_drafts(tiny, tmp_path, monkeypatch):
    from studylib.decoding.drafts import distilled_draft
    from studylib.drafting.train import DraftTrainConfig, train_draft

    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    model, tok = tiny
    cfg = DraftTrainConfig(model="tiny-random", layers=1, sources=("self",), self_prompts=3, samples=0,
                           gen_tokens=8, steps=4, save_every=2, head_vocab=32, max_minutes=5)
    meta = train_draft(cfg, (model, tok))
    assert meta["complete"] and meta["steps_done"] == 4 and meta["layers"] == 1
    again = train_draft(cfg, (model, tok))  # same config: resumes the finished checkpoint, no new steps
    assert again["steps_done"] == 4 and again["history"] == meta["history"]
    draft = distilled_draft(model)
    assert draft.head_ids is not None and len(draft.head_ids) <= 32
    want = _ar(model, PROMPT, 20)
    assert speculative.generate(model, PROMPT, 20, draft=draft, gamma=3).token_ids == want
    assert speculative.generate(model, PROMPT, 20, draft="distilled:full", gamma=3).token_ids == want


def test_adaptive_gamma_prefers_short_drafts_when_verification_is_costly():
    cheap = AdaptiveGamma(cost_ratio=0.1, gamma_max=8)
    costly = AdaptiveGamma(cost_ratio=0.1, gamma_max=8, verify_cost=[1.0 + 0.5 * n for n in range(9)])
    for a in (cheap, costly):
        for _ in range(10):
            a.update(3, 4)  # alpha ~ 0.75 for both
    assert costly.next() < cheap.next()
    with pytest.raises(StudylibError, match="verify_cost"):
        AdaptiveGamma(cost_ratio=0.1, gamma_max=8, verify_cost=[1.0, 1.2])


def test_train_draft_keeps_time_for_training(tiny, tmp_path, monkeypatch):
    """Data generation gets at most data_share of the cap; a run that trains no step raises."""
    import time

    from studylib.drafting import train as draft_train
    from studylib.drafting.train import DraftTrainConfig, train_draft

    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    model, tok = tiny
    real_make_data = draft_train._make_data
    seen = {}

    def spy(cfg, target, tok_, work, deadline):
        seen["data_minutes"] = (deadline.end - time.monotonic()) / 60
        return real_make_data(cfg, target, tok_, work, deadline)

    monkeypatch.setattr(draft_train, "_make_data", spy)
    cfg = DraftTrainConfig(model="tiny-random", layers=1, sources=("self",), self_prompts=2, samples=0,
                           gen_tokens=4, steps=2, head_vocab=0, max_minutes=10, data_share=0.3)
    assert train_draft(cfg, (model, tok))["steps_done"] == 2
    assert 2.9 < seen["data_minutes"] <= 3.0
    with pytest.raises(StudylibError, match="data_share"):
        DraftTrainConfig(data_share=1.0)

    class Expired:  # the cap has passed by the time training would start
        def __init__(self, minutes):
            self.end = time.monotonic() + minutes * 60

        @property
        def passed(self):
            return self.end - time.monotonic() > 3 * 60  # only the 10-minute training deadline "passes"

    monkeypatch.setattr(draft_train, "_Deadline", Expired)
    cfg = DraftTrainConfig(model="tiny-random", layers=1, sources=("self",), self_prompts=2, samples=0,
                           gen_tokens=4, steps=2, head_vocab=0, max_minutes=10, data_share=0.3, fresh=True)
    with pytest.raises(StudylibError, match="before any training step"):
        train_draft(cfg, (model, tok))


def test_draft_table_times_each_drafter_and_says_what_its_forward_is(tiny):
    from studylib.experiments.ch02_drafts import draft_table
    from studylib.workbook.tables import CAPTION_KEY

    model = tiny[0]  # load_model returns (model, tokenizer)
    table = draft_table(model, {"self:0": SelfDraft((0,))}, None)
    assert table.draft.tolist() == ["target", "self:0"] and table.measured_c.iloc[0] == 1.0
    assert table.forward_ms.gt(0).all() and table.layers.tolist() == [model.config.num_layers, model.config.num_layers - 1]
    # the forward is not a decode step of the loop: the caption says so, with the context it was timed at
    assert "128-token context" in table.attrs[CAPTION_KEY] and "decoder loop" in table.attrs[CAPTION_KEY]

"""Chapter 6's decode-mode measurements on the tiny random model: the protocol, not the numbers."""

from __future__ import annotations

import pytest

from studylib.experiments import ch06_decode as d


@pytest.fixture(scope="module")
def tiny():
    from studylib.models import load_model

    return load_model("tiny-random")


def test_patterns_that_see_everything_score_exactly_like_dense(tiny):
    model, tok = tiny
    # A window as long as the text and a Quest budget covering it are dense attention in disguise: the
    # chunked (window) and step-by-step (Quest) paths must both reproduce dense.
    docs = d.document_quality(model, tok, ["window:400", "quest:budget=400,page=8,sinks=2,recent=8,dense=0"],
                              n_docs=2, n_tokens=200, scored=12, gen_tokens=4, chunk=64, progress=False)
    assert len(docs) == 4 and set(docs.scored) == {11}
    assert docs.ppl_ratio.sub(1).abs().max() < 1e-4 and docs.kl.abs().max() < 1e-5
    assert (docs.top1 == 1).all() and (docs.greedy_agreement == 1).all()


def test_a_small_budget_differs_from_dense_and_the_summary_counts_documents(tiny):
    model, tok = tiny
    docs = d.document_quality(model, tok, ["sinks:2,14", "quest:budget=32,page=8,sinks=2,recent=6,dense=0"],
                              n_docs=2, n_tokens=200, scored=12, gen_tokens=2, chunk=64, progress=False)
    summary = d.document_summary(docs)
    assert list(summary.documents) == [2, 2]
    assert (summary.kl_nats > 0).all()


def test_needle_grid_marks_what_a_fixed_pattern_can_reach(tiny):
    model, tok = tiny
    nd = d.needle_grid(model, tok, ["window:32", "quest:budget=48,page=8,sinks=2,recent=8,dense=0"], [160],
                       [0.1, 0.9], gen_tokens=2, chunk=64, progress=False)
    assert len(nd) == 6 and set(nd.pattern) == {"dense", "window:32", "quest:budget=48,page=8,sinks=2,recent=8,dense=0"}
    assert nd[nd.pattern == "dense"].reachable.all()
    win = nd[nd.pattern == "window:32"]
    assert not win.reachable.any() and (win.distance > 32).all()  # the needle lies beyond a 32-key window
    assert nd[nd.kind == "quest"].reachable.isna().all()
    assert (nd.length <= 160).all()


def test_decode_cost_rows_and_speedup_pairing(tiny):
    model, _ = tiny
    dc = d.decode_cost(model, [64, 128], ["sinks:2,14", "quest:budget=32,page=8,sinks=2,recent=6,dense=0"],
                       repeats=2, steps=2, progress=False)
    assert len(dc) == 2 * 3 * 2 and (dc.ms_per_token > 0).all()
    sp = d.decode_speedup(dc, 128, "sinks:2,14")
    assert sp["n"] == 2 and sp["value"] > 0
    assert d.decode_speedup(dc, 999, "sinks:2,14")["n"] == 0  # a length not timed: no estimate
    s = d.decode_summary(dc)
    dense_read = s[(s.pattern == "dense") & (s.context == 128)].kv_read_mb.iloc[0]
    assert s[(s.pattern == "sinks:2,14") & (s.context == 128)].kv_read_mb.iloc[0] < dense_read


def test_quest_budgets_decoded_together_match_each_decoded_alone(tiny):
    model, tok = tiny
    from studylib.data import long_text

    ids = long_text(tok, 160, seed=3)
    specs = ["quest:budget=32,page=8,sinks=2,recent=6,dense=0", "quest:budget=64,page=8,sinks=2,recent=6,dense=0"]
    tail = ids[-10:]
    alone = []
    for sp in specs:
        c = d.prefill_arms(model, ids[:-10], [sp], 12, chunk=64)[sp]
        alone.append(d.torch.stack([d.decode_step(model, c, t) for t in tail]))
    caches = d.prefill_arms(model, ids[:-10], specs, 12, chunk=64)
    together = d.decode_rows(model, [caches[sp] for sp in specs], tail)
    assert together.shape == (2, 10, alone[0].shape[-1])
    for i in range(2):
        assert d.torch.allclose(together[i], alone[i], atol=1e-4, rtol=1e-4)
    # the two budgets really differ: each row went through its own cache
    assert not d.torch.allclose(together[0], together[1], atol=1e-6)


@pytest.mark.parametrize("spec", ["quest:budget=32,page=8,sinks=2,recent=8,dense=0",
                                  "quest:budget=48,page=8,sinks=3,recent=16,dense=1"])
def test_a_teacher_forced_quest_chunk_gives_the_logits_of_stepping(tiny, spec):
    model, tok = tiny
    from studylib.data import long_text

    ids = long_text(tok, 200, seed=3)
    n = 40
    stepped_cache = d.prefill_arms(model, ids[:-n], [spec], n + 2, chunk=64)[spec]
    stepped = d.torch.stack([d.decode_step(model, stepped_cache, t) for t in ids[-n:]])
    forced_cache = d.prefill_arms(model, ids[:-n], [spec], n + 2, chunk=64)[spec]
    with d.torch.inference_mode():
        forced = model(d.torch.tensor([ids[-n:]]), forced_cache.begin_teacher_forced(n), logits="all").logits[0]
        dense_cache = d.prefill_arms(model, ids[:-n], ["dense"], n + 2, chunk=64)["dense"]
        dense = model(d.torch.tensor([ids[-n:]]), dense_cache.begin(n), logits="all").logits[0]
    assert d.torch.allclose(forced.float(), stepped, atol=1e-4, rtol=1e-4)
    assert not d.torch.allclose(dense.float(), stepped, atol=1e-2)  # the selection really drops keys
    assert forced_cache.length == stepped_cache.length == 200
    # and the caches go on identically: the next step reads the same
    nxt = ids[-1]
    assert d.torch.allclose(d.decode_step(model, forced_cache, nxt), d.decode_step(model, stepped_cache, nxt),
                            atol=1e-4, rtol=1e-4)

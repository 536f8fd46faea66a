"""Chapter 4's shared-prefix workloads and the model-free replay."""

import pytest

from studylib.errors import StudylibError
from studylib.kvcache.prefix_generate import PrefixCachedDecoder
from studylib.kvcache.replay import replay_hits, working_set_blocks
from studylib.models import load_model
from studylib.models.tokenizer import ByteTokenizer
from studylib.workloads.prefix import WORKLOADS, make_workload, optimal_hits

TOK = ByteTokenizer()
SMALL = {"system_prompt": {"n_requests": 3, "system_tokens": 200, "max_new_tokens": 3},
         "few_shot": {"n_requests": 4, "k": 2, "n_groups": 2, "max_new_tokens": 3},
         "multi_turn": {"n_conversations": 2, "turns": 2, "max_new_tokens": 3},
         "tree_of_thought": {"branching": 2, "depth": 2, "max_new_tokens": 3},
         "no_sharing": {"n_requests": 3, "max_new_tokens": 3}}


def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("name", WORKLOADS)
def test_workloads_are_seeded(name):
    a = make_workload(name, TOK, seed=3, **SMALL[name])
    b = make_workload(name, TOK, seed=3, **SMALL[name])
    assert [r.tokens for r in a.requests] == [r.tokens for r in b.requests]
    c = make_workload(name, TOK, seed=4, **SMALL[name])
    assert [r.tokens for r in a.requests] != [r.tokens for r in c.requests]


def test_shapes_share_what_they_promise():
    sp = make_workload("system_prompt", TOK, **SMALL["system_prompt"]).requests
    assert all(common(sp[0].tokens, r.tokens) >= 200 for r in sp[1:])
    tree = make_workload("tree_of_thought", TOK, **SMALL["tree_of_thought"]).requests
    assert len(tree) == 2 + 4
    by_id = {r.id: r.tokens for r in tree}
    # A child shares its parent's whole path (everything before the parent's closing markers).
    assert common(by_id["tot-0"], by_id["tot-0-1"]) > common(by_id["tot-0"], by_id["tot-1"])
    solo = make_workload("no_sharing", TOK, **SMALL["no_sharing"]).requests
    assert max(common(solo[0].tokens, r.tokens) for r in solo[1:]) < 16


def test_multi_turn_is_closed_loop():
    w = make_workload("multi_turn", TOK, **SMALL["multi_turn"])
    first, follow = w.requests[0], w.requests[2]
    assert follow.follows == first.id
    done = {first.id: (first.tokens, [50, 51, 2])}  # a reply ending in EOS (2), which is dropped
    prompt = w.prompt(follow, done, eos={2})
    assert prompt == first.tokens + [50, 51] + follow.close + follow.tokens
    with pytest.raises(StudylibError, match="has not run yet"):
        w.prompt(follow, {}, eos={2})


def test_unknown_workload():
    with pytest.raises(StudylibError, match="unknown prefix workload"):
        make_workload("rag", TOK)


def test_optimal_hits():
    q = [[1, 2, 3, 4, 5], [1, 2, 3, 9, 9], [7, 7], [1, 2, 3, 4, 5, 6]]
    cached = [s + [0] for s in q]
    assert optimal_hits(q, cached, 1) == [0, 3, 0, 5]
    assert optimal_hits(q, cached, 2) == [0, 2, 0, 4]


def test_replay_reproduces_the_decoder_and_evicts_under_pressure():
    model, _ = load_model("tiny-random")
    w = make_workload("few_shot", TOK, **SMALL["few_shot"])
    dec = PrefixCachedDecoder(model, "radix", block_size=4, capacity_tokens=2000)
    seqs, hits = [], []
    for r in w.requests:
        res = dec.generate(r.tokens, r.max_new_tokens)
        seqs.append((r.tokens, res.token_ids))
        hits.append(res.extra["prefix_hit_tokens"])
    assert replay_hits(seqs, block_size=4, num_blocks=500)["hits"] == hits
    ws = working_set_blocks(seqs, 4)
    assert replay_hits(seqs, block_size=4, num_blocks=ws)["evicted_blocks"] == 0
    need = max(-(-(len(p) + len(o)) // 4) for p, o in seqs)  # the largest request must still fit the pool
    assert need < ws
    small = replay_hits(seqs, block_size=4, num_blocks=max(need, ws // 2))
    assert small["evicted_blocks"] > 0 and small["hit_tokens"] <= sum(hits)


def _summary(identical=(True, True), control_requests=12):
    import pandas as pd

    return pd.DataFrame([
        {"workload": "system_prompt", "requests": 12, "hit / optimal": 1.0, "all identical": identical[0],
         "outputs identical": "12/12", "TTFT speedup": 19.0, "TTFT speedup CI": (18.0, 20.0)},
        {"workload": "no_sharing", "requests": control_requests, "hit / optimal": float("nan"),
         "all identical": identical[1], "outputs identical": f"{control_requests}/{control_requests}",
         "TTFT speedup": 1.0, "TTFT speedup CI": (0.95, 1.05)}])


def _curve(small_ratio, ci=(0.97, 1.0), n=12, binds=True):
    """A pool curve as ``pool_curve`` makes it: one pool below the working set (where eviction costs hits
    unless ``binds`` is False), two at or above it. Per request, Belady hits 80 tokens below the working
    set and LRU about ``small_ratio`` of that (``ci`` is kept for the table; the rule recomputes it)."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for wl, shares in (("multi_turn", True), ("no_sharing", False)):
        for nb, ratio in ((50, small_ratio), (100, 1.0), (125, 1.0)):
            opt = 1000 if shares else 0
            below = nb < 100 and shares and binds
            bel = [80.0] * n if below else [opt / max(n, 1)] * n
            lru = [b * ratio * (1 + 0.02 * rng.standard_normal()) if below else b for b in bel]
            if below and ratio >= 1:
                lru = list(bel)
            rows.append({"workload": wl, "shares prefixes": shares, "pool blocks": nb, "working set blocks": 100,
                         "fraction of working set": nb / 100, "measured pool": nb == 125, "requests": n,
                         "hit / Belady": ratio if shares else float("nan"),
                         "hit / Belady CI": ci if nb < 100 and shares else (1.0, 1.0) if shares
                         else (float("nan"), float("nan")),
                         "hit / optimal": 1.0 if nb >= 100 and shares else float("nan"),
                         "Belady / optimal": 1.0 if nb >= 100 and shares else float("nan"),
                         "hit tokens": sum(lru) if below else opt, "Belady hit tokens": sum(bel) if below else opt,
                         "optimal hit tokens": opt, "LRU hits per request": lru, "Belady hits per request": bel,
                         "evicted blocks": 0, "Belady evicted blocks": 0})
    return pd.DataFrame(rows)


MT, FS = "multi_turn at 0.4x the working set", "few_shot at 0.55x the working set"  # declared in C4@4


def _tc(ratios, traces=10, binds=True):
    """A trace curve as ``trace_curve`` makes it: per declared condition (``ratios``: condition -> LRU's
    share of Belady's hits) and seeded trace, Belady hits 800 tokens of an optimum of 1000 (all 1000 when
    ``binds`` is False: nothing shared is evicted) and LRU about ``ratio`` of that."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    rows = []
    for cond, ratio in ratios.items():
        for t in range(traces):
            bel = 800.0 if binds else 1000.0
            lru = bel if not binds else min(bel * ratio * (1 + 0.01 * rng.standard_normal()), 1000.0)
            rows.append({"condition": cond, "workload": cond.split(" at ")[0], "fraction": 0.4, "trace": t,
                         "requests": 12, "pool blocks": 40, "working set blocks": 100, "LRU hit tokens": lru,
                         "Belady hit tokens": bel, "optimal hit tokens": 1000.0})
    return pd.DataFrame(rows)


def test_judge_c4_is_decided_over_seeded_traces_against_belady():
    from studylib.claims import CONDITIONAL, FAILS, HOLDS, INCONCLUSIVE, corrected_confidence
    from studylib.decisions import declared
    from studylib.experiments import ch04_prefix_cache as ch04

    k = declared("C4", 4).tried
    assert k == 20  # every shared-prefix workload x every pool fraction below the working set
    rows = ch04.judge_c4(_summary(), _curve(0.99), None, "c", _tc({MT: 0.99, FS: 0.99}))
    assert [r.role for r in rows].count("decision") == 1 and rows[0].verdict == HOLDS
    decisive = rows[1]
    assert "Belady" in decisive.metric and decisive.threshold == 0.95 and decisive.unit == "traces"
    # the unit is the trace, never the requests inside one; the family is the declared one, recorded
    assert decisive.n == 10 and decisive.verdict == HOLDS and decisive.tried == k
    assert decisive.confidence == pytest.approx(corrected_confidence(k))
    assert decisive.ci_method == ch04.TRACE_CI
    shown = [r for r in rows[1:] if r.by_construction]
    assert len(shown) == 2 and "not counted, true by construction" in rows[0].conditions
    # one condition clearly below the bar, another clearly above: it holds where it clears, by name
    mixed = ch04.judge_c4(_summary(), _curve(0.99), None, "c", _tc({MT: 0.5, FS: 0.99}))
    assert mixed[0].verdict == CONDITIONAL and MT in mixed[1].conditions and "misses" in mixed[1].conditions
    # LRU far below the clairvoyant reference everywhere: the claim fails, although every pool holding the
    # working set still reaches the never-evicting optimum
    rows = ch04.judge_c4(_summary(), _curve(0.99), None, "c", _tc({MT: 0.6, FS: 0.6}))
    assert rows[0].verdict == FAILS and rows[1].verdict == FAILS
    assert all(r.verdict == HOLDS for r in rows[1:] if r.by_construction)
    # too few traces for a CI to decide: inconclusive, whatever the ratio (many requests do not help)
    assert ch04.judge_c4(_summary(), _curve(0.99), None, "c", _tc({MT: 0.99}, traces=4))[0].verdict == INCONCLUSIVE
    # the identity check needs enough requests too
    few = _summary(control_requests=4)
    few.loc[few.workload == "system_prompt", "requests"] = 4
    assert ch04.judge_c4(few, _curve(0.99), None, "c", _tc({MT: 0.99}))[0].verdict == INCONCLUSIVE
    # the no-sharing control's TTFT is shown beside the decision, never judged (timed in one process)
    slow = _summary()
    slow.loc[slow.workload == "no_sharing", "TTFT speedup"] = 0.5
    rows = ch04.judge_c4(slow, _curve(0.99), None, "c", _tc({MT: 0.99, FS: 0.99}))
    assert rows[0].verdict == HOLDS and not any("control" in r.metric for r in rows)
    assert "no-sharing control's TTFT with the cache x0.50" in rows[0].conditions
    changed = _summary(identical=(False, True))
    assert ch04.judge_c4(changed, _curve(0.99), None, "c", _tc({MT: 0.99}))[0].verdict == FAILS
    # no seeded traces: nothing decides the claim
    assert ch04.judge_c4(_summary(), _curve(0.99), None, "c")[0].verdict == INCONCLUSIVE
    # a condition where eviction costs no trace a hit tests no policy: named, not judged
    idle = ch04.judge_c4(_summary(), _curve(1.0), None, "c", _tc({MT: 1.0}, binds=False))
    assert idle[0].verdict == INCONCLUSIVE and f"eviction costs no trace a hit at {MT}" in idle[1].conditions
    # a condition that was not declared before the run makes the result exploratory
    odd = ch04.judge_c4(_summary(), _curve(0.99), None, "c", _tc({"few_shot at 0.3x the working set": 0.99}))
    assert odd[1].exploratory and odd[1].verdict == INCONCLUSIVE


def test_trace_curve_replays_every_seeded_trace_below_the_working_set():
    import random

    import pandas as pd

    from studylib.experiments import ch04_prefix_cache as ch04

    rows = []
    for trace in range(3):
        rng = random.Random(trace)
        heads = [[rng.randrange(90) for _ in range(64)] for _ in range(3)]
        for i in range(12):
            rows.append({"workload": "few_shot", "cache": "radix", "order": i, "trace": trace,
                         "prompt": rng.choice(heads) + [rng.randrange(90) for _ in range(12)],
                         "tokens": [rng.randrange(90) for _ in range(5)]})
    tc = ch04.trace_curve(pd.DataFrame(rows), 8, [0.3, 0.6, 1.0, 1.25])
    assert sorted(set(tc.condition)) == ["few_shot at 0.3x the working set", "few_shot at 0.6x the working set"]
    assert len(tc) == 6 and set(tc.trace) == {0, 1, 2}  # one row per trace and fraction below 1
    assert (tc["optimal hit tokens"] >= tc["Belady hit tokens"]).all()
    assert (tc["pool blocks"] < tc["working set blocks"]).all()
    table = ch04.trace_table(tc)
    assert list(table.traces) == [3, 3] and "seeded traces" in ch04.trace_text(tc)


def test_pool_curve_puts_lru_beside_belady_and_the_optimum():
    import random

    import pandas as pd

    from studylib.experiments import ch04_prefix_cache as ch04

    rng = random.Random(0)
    heads = [[rng.randrange(90) for _ in range(64)] for _ in range(3)]
    rows = []
    for name, make in (("system_prompt", lambda: rng.choice(heads) + [rng.randrange(90) for _ in range(12)]),
                       ("no_sharing", lambda: [rng.randrange(90) for _ in range(40)])):
        for i in range(12):
            for cache in ("radix", "none"):
                rows.append({"workload": name, "cache": cache, "order": i, "prompt": make() if cache == "radix"
                             else rows[-1]["prompt"], "tokens": [rng.randrange(90) for _ in range(5)]})
    df = pd.DataFrame(rows)
    curve = ch04.pool_curve(df, 8, [0.3, 0.6, 1.0, 1.25], capacity_tokens=2048)
    assert set(curve.workload) == {"system_prompt", "no_sharing"}
    sp = curve[curve.workload == "system_prompt"]
    assert (sp["Belady hit tokens"] >= sp["hit tokens"]).all()
    assert (sp["optimal hit tokens"] >= sp["Belady hit tokens"]).all()
    small = sp[sp["pool blocks"] < sp["working set blocks"]]
    assert len(small) and (small["evicted blocks"] > 0).all()
    for _, r in small.iterrows():
        lo, hi = r["hit / Belady CI"]
        assert lo <= r["hit / Belady"] <= hi and r["requests"] == 12
    full = sp[sp["pool blocks"] >= sp["working set blocks"]]
    assert (full["hit / optimal"] == 1.0).all() and (full["hit / Belady"] == 1.0).all()
    assert sp["measured pool"].sum() == 1
    assert curve[curve.workload == "no_sharing"]["Belady hit tokens"].eq(0).all()
    text = ch04.curve_text(curve)
    assert "Belady" in text and f"{small['hit / Belady'].min():.1%}" in text and "100%-100%" not in text
    assert len(ch04.curve_table(curve)) == len(curve)


def test_ratio_of_sums_resamples_requests():
    from studylib.experiments import ch04_prefix_cache as ch04

    est = ch04.ratio_of_sums([8, 8, 0, 16] * 3, [8, 16, 0, 16] * 3)
    assert est.value == pytest.approx(96 / 120) and est.n == 12
    assert est.ci_low <= est.value <= est.ci_high <= 1.0
    assert ch04.ratio_of_sums([0, 0], [0, 0]).value != ch04.ratio_of_sums([0, 0], [0, 0]).value  # NaN: no hit possible


def test_judge_c4_rows_are_judged_as_declared():
    from studylib.decisions import stamp
    from studylib.experiments import ch04_prefix_cache as ch04

    for tc in (_tc({MT: 0.99}), _tc({MT: 0.6, FS: 0.99}), _tc({MT: 1.0}, traces=4), None):
        stamp(ch04.judge_c4(_summary(), _curve(0.99), None, "c", tc), 4)  # raises on an undeclared row


def test_traces_where_eviction_costs_no_hit_are_not_units():
    """A trace where neither policy loses a hit reads LRU = Belady by construction: it is left out of the
    condition's units, so twelve such traces beside two real ones leave two units (too few to decide)."""
    import pandas as pd

    from studylib.experiments import ch04_prefix_cache as ch04

    rows = [{"condition": "c", "trace": t, "optimal hit tokens": 100, "Belady hit tokens": 100,
             "LRU hit tokens": 100} for t in range(12)]
    rows += [{"condition": "c", "trace": 12 + t, "optimal hit tokens": 100, "Belady hit tokens": 80,
              "LRU hit tokens": 40 + 10 * t} for t in range(2)]
    est, idle = ch04.eviction_estimates(pd.DataFrame(rows), 0.95)
    assert not idle and est["c"]["n"] == 2 and est["c"]["value"] == pytest.approx(90 / 160)
    est, idle = ch04.eviction_estimates(pd.DataFrame(rows[:12]), 0.95)
    assert idle == ["c"] and not est


def test_judge_c4_names_the_pool_fraction_that_ran_where_it_is_not_the_declared_one():
    """A pool is never below a trace's largest request, so a declared 0.25x can run at 0.8x; a referee read
    the declared label where the pools held more. The decisive row names the fraction that ran."""
    from studylib.experiments import ch04_prefix_cache as ch04

    tc = _tc({MT: 0.99, FS: 0.99})
    assert ch04.realised_pools(tc) == []  # every pool ran at its declared 0.4x
    tc.loc[tc.condition == FS, "pool blocks"] = [81 + (i % 7) for i in range(int((tc.condition == FS).sum()))]
    assert ch04.realised_pools(tc) == [f"{FS}: ran at 0.81-0.87x"]
    rows = ch04.judge_c4(_summary(), _curve(0.99), None, "c", tc)
    assert f"{FS}: ran at 0.81-0.87x" in rows[1].conditions and f"{MT}: ran at" not in rows[1].conditions

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
    small = replay_hits(seqs, block_size=4, num_blocks=ws // 2)
    assert small["evicted_blocks"] > 0 and small["hit_tokens"] <= sum(hits)


def test_judge_c4_holds_only_where_the_pool_holds_the_working_set():
    import pandas as pd

    from studylib.claims import CONDITIONAL, FAILS, HOLDS
    from studylib.experiments import ch04_prefix_cache as ch04

    summary = pd.DataFrame([
        {"workload": "system_prompt", "hit / optimal": 1.0, "all identical": True, "TTFT speedup": 19.0,
         "TTFT speedup CI": (18.0, 20.0)},
        {"workload": "no_sharing", "hit / optimal": float("nan"), "all identical": True, "TTFT speedup": 1.0,
         "TTFT speedup CI": (0.95, 1.05)}])

    def curve(small_ratio):
        return pd.DataFrame({"workload": "multi_turn", "fraction of working set": [0.5, 1.0, 1.25],
                             "hit / optimal": [small_ratio, 1.0, 1.0]})

    rows = ch04.judge_c4(summary, curve(1.0), None, "c")
    assert rows[0].role == "decision" and rows[0].verdict == HOLDS and len(rows) == 4
    rows = ch04.judge_c4(summary, curve(0.31), None, "c")  # LRU below the working set: hits collapse
    assert rows[0].verdict == CONDITIONAL and "pool < working set (does not hold)" in rows[1].conditions
    changed = summary.assign(**{"all identical": [False, True]})
    assert ch04.judge_c4(changed, curve(1.0), None, "c")[0].verdict == FAILS  # outputs must never change

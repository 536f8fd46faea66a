"""EAGLE head and tree verification: lossless greedy output, KV bookkeeping, exact sampling, training."""

from __future__ import annotations

import pytest
import torch

from studylib.decoding import ar, eagle
from studylib.decoding.eagle import DraftTree, EagleDraft, EagleHead, TreeSpec, select_nodes, walk_greedy
from studylib.errors import StudylibError
from studylib.models import DenseKVCache
from studylib.sampling import SamplingParams

PROMPT = list(range(5, 30))


@pytest.fixture(scope="module")
def head(tiny):
    model, _ = tiny
    torch.manual_seed(0)
    return EagleHead(model.config).eval()


def _fresh_cache(model, ids):
    cache = DenseKVCache(model.config, 1, len(ids), model.device, model.dtype)
    model(torch.tensor([ids]), cache.begin(len(ids)), logits="none")
    return cache


@pytest.mark.parametrize("tree", [TreeSpec(5, 4, 16), TreeSpec.chain(3), TreeSpec(3, 2, 5), TreeSpec(1, 3, 3)])
@pytest.mark.parametrize("reduced", [False, True])
def test_greedy_output_equals_ar(tiny, head, tree, reduced):
    model, _ = tiny
    ref = ar.generate(model, PROMPT, 40).token_ids
    ids = torch.arange(0, model.config.vocab_size, 2) if reduced else None
    res = eagle.generate(model, PROMPT, 40, draft=EagleDraft(head, ids, tree))
    assert res.token_ids == ref
    assert res.new_tokens == 40 and sum(res.accepted_lengths) == 39  # the prefill gives the first token
    assert res.target_forwards == 1 + res.steps


class _Oracle:
    """Replaces the drafted tree by one whose first branch is AR's continuation (depth ``hit``) beside
    wrong siblings, so verification must accept deep paths and keep scattered KV slots."""

    def __init__(self, model, ref, hit):
        self.model, self.ref, self.hit = model, ref, hit

    def __call__(self, session_draft):
        oracle = self

        def draft(self_, root):
            n_out = self_.kv.committed - len(PROMPT) + 1  # tokens output so far
            truth = oracle.ref[n_out : n_out + oracle.hit]
            v = oracle.model.config.vocab_size
            tokens, parents, depths, scores = [], [], [], []
            prev = -1
            for d, t in enumerate(truth):  # a wrong sibling beside each true token
                tokens += [(t + 1) % v, t]
                parents += [prev, prev]
                depths += [d + 1, d + 1]
                scores += [-float(2 * d + 1), -float(2 * d)]
                prev = len(tokens) - 1
            self_.kv.drop_tree()
            return select_nodes(tokens, parents, depths, scores, len(tokens))

        return draft


def test_deep_acceptance_keeps_the_cache_equal_to_a_fresh_prefill(tiny, head, monkeypatch):
    model, _ = tiny
    ref = ar.generate(model, PROMPT, 30).token_ids
    monkeypatch.setattr(eagle._Session, "draft", _Oracle(model, ref, 4)(None))
    checked = []

    def check(cache, seq):
        fresh = _fresh_cache(model, seq[:-1])
        assert cache.length == len(seq) - 1
        for layer in range(model.config.num_layers):
            torch.testing.assert_close(cache.k[layer][:, :, : cache.length], fresh.k[layer], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(cache.v[layer][:, :, : cache.length], fresh.v[layer], atol=1e-5, rtol=1e-5)
        checked.append(len(seq))

    res = eagle.generate(model, PROMPT, 30, draft=EagleDraft(head, None, TreeSpec(4, 2, 8)), on_step=check)
    assert res.token_ids == ref
    assert max(res.accepted_lengths) == 5  # four drafted tokens accepted plus the target's own
    assert res.extra["accepted_depths"][4] >= 1 and checked


def test_select_nodes_keeps_a_tree_of_the_best_nodes():
    # root children 0 (-0.1), 1 (-2.0); node 0's children 2 (-0.3), 3 (-5); node 2's child 4 (-0.35)
    tokens, parents = [10, 11, 12, 13, 14], [-1, -1, 0, 0, 2]
    depths, scores = [1, 1, 2, 2, 3], [-0.1, -2.0, -0.3, -5.0, -0.35]
    tree = select_nodes(tokens, parents, depths, scores, 3)
    assert tree.tokens == [10, 12, 14] and tree.parents == [-1, 0, 1] and tree.depths == [1, 2, 3]
    mask = tree.mask("cpu")
    assert mask.tolist() == [[True, False, False, False], [True, True, False, False],
                             [True, True, True, False], [True, True, True, True]]
    # A child whose parent did not make the cut is never kept, even when ties put it early.
    tree = select_nodes([1, 2, 3], [-1, -1, 1], [1, 1, 2], [-1.0, -1.0, -1.0], 2)
    assert tree.parents == [-1, -1] and tree.tokens == [1, 2]


def test_walk_greedy_follows_the_argmax_child():
    tree = DraftTree(tokens=[3, 4, 5, 6], parents=[-1, -1, 1, 1], depths=[1, 1, 2, 2], scores=[0, 0, 0, 0])
    logits = torch.full((5, 8), -1.0)
    for row, tok in enumerate([4, 0, 6, 0, 7]):  # root -> 4 (row 2) -> 6 (row 4) -> bonus 7
        logits[row, tok] = 1.0
    assert walk_greedy(logits, tree) == ([2, 4], 7)
    logits[2] = -1.0
    logits[2, 1] = 1.0  # node 4's argmax (1) is not among its children
    assert walk_greedy(logits, tree) == ([2], 1)


def test_tree_spec_checks_and_parses():
    assert TreeSpec.parse("5,4,16") == TreeSpec(5, 4, 16)
    assert TreeSpec.chain(4) == TreeSpec(4, 1, 4) and TreeSpec.chain(4).label() == "4"
    for bad in ("5,4", "a,b,c", "0,1,1"):
        with pytest.raises(StudylibError):
            TreeSpec.parse(bad)
    with pytest.raises(StudylibError, match="at most"):
        TreeSpec(2, 2, 7)  # 2 + 4 nodes at most


def test_missing_head_names_the_training_command(tiny, tmp_path):
    model, _ = tiny
    with pytest.raises(StudylibError, match="train-draft --kind eagle"):
        eagle.resolve_eagle(str(tmp_path / "nowhere"), model)


def test_head_round_trips_through_disk(tiny, head, tmp_path):
    model, _ = tiny
    eagle.save_head(head, tmp_path, [0, 2, 4, 6], {"tree": [3, 2, 4]})
    loaded = eagle.resolve_eagle(str(tmp_path), model)
    assert loaded.tree == TreeSpec(3, 2, 4) and loaded.head_ids.tolist() == [0, 2, 4, 6]
    for k, v in head.state_dict().items():
        torch.testing.assert_close(loaded.head.state_dict()[k], v)
    full = eagle.resolve_eagle(str(tmp_path) + ":full", model)
    assert full.head_ids is None and full.describe().startswith("eagle:full")


def test_sampling_is_exact_and_the_check_rejects_a_wrong_walk():
    from studylib.experiments.ch02_eagle import eagle_sampling_check

    df = eagle_sampling_check(n=1500)
    assert df.as_expected.all(), df.to_string()
    assert df.set_index("sampler").rejected.to_dict() == {"exact (multi-candidate)": False,
                                                          "wrong (rejected candidate kept in p)": True}


def test_training_reduces_the_loss_and_resumes(tiny, tmp_path):
    from studylib.drafting.eagle_train import synthetic_state, train_on_state

    model, _ = tiny
    state = synthetic_state(model, n_seqs=12, length=40, seed=0)
    a = train_on_state(model, state, steps=30, seed=0, batch_tokens=160, lr=3e-3)
    assert a["history"][-1]["loss"] < a["history"][0]["loss"]
    # A run is a function of the seed: the same steps give the same weights.
    b = train_on_state(model, state, steps=30, seed=0, batch_tokens=160, lr=3e-3)
    for k, v in a["head"].state_dict().items():
        torch.testing.assert_close(b["head"].state_dict()[k], v)


def test_sampled_output_runs_and_counts(tiny, head):
    model, _ = tiny
    res = eagle.generate(model, PROMPT, 20, SamplingParams(temperature=1.0, seed=3),
                         draft=EagleDraft(head, None, TreeSpec(3, 2, 5)))
    again = eagle.generate(model, PROMPT, 20, SamplingParams(temperature=1.0, seed=3),
                           draft=EagleDraft(head, None, TreeSpec(3, 2, 5)))
    assert res.token_ids == again.token_ids and res.new_tokens == 20


def test_method_specs_and_counts():
    from types import SimpleNamespace

    from studylib.experiments.ch02_speculative import _counts, parse_spec

    assert parse_spec("eagle@4") == ("eagle", {"draft": "eagle", "tree": (4, 1, 4)})
    assert parse_spec("eagle:full@5,4,16") == ("eagle", {"draft": "eagle:full", "tree": (5, 4, 16)})
    with pytest.raises(ValueError):
        parse_spec("eagle@5,4")
    # Two steps: one accepted 2 drafted tokens, one none; depth 3, so both stopped early (rejections).
    res = SimpleNamespace(method="eagle", steps=2, extra={"tree": [3, 2, 5], "accepted_depths": [1, 0, 1, 0]})
    c = _counts(res)
    assert (c["accepted"], c["proposed"], c["rejections"]) == (2, 10, 2)


def test_eagle_aims_read_the_ci_low_end():
    import pandas as pd

    from studylib.experiments.ch02_eagle import eagle_aims

    bw = pd.DataFrame([{"workload": "chat", "method": "eagle@5,4,16", "tokens_per_step": 2.7, "tokens_per_step_lo": 2.6,
                        "tokens_per_step_hi": 2.8, "speedup": 1.6, "speedup_lo": 1.4, "speedup_hi": 1.8}])
    gg = pd.DataFrame([{"workload": "chat", "method": "eagle@5,4,16", "speedup": 1.7, "speedup_lo": 1.55,
                        "speedup_hi": 1.9}])
    aims = eagle_aims(bw, "eagle@5,4,16", gg)
    assert aims.met.tolist() == [True, False, True]


def test_speculative_generate_routes_an_eagle_draft(tiny, head):
    from studylib.decoding import speculative

    model, _ = tiny
    d = EagleDraft(head, None, TreeSpec(3, 2, 5))
    res = speculative.generate(model, PROMPT, 20, draft=d, tree="2,2,3")
    assert res.token_ids == ar.generate(model, PROMPT, 20).token_ids
    assert res.extra["tree"] == [2, 2, 3] and res.method == "speculative"
    assert speculative.generate(model, PROMPT, 20, draft=d, gamma=3).extra["tree"] == [3, 1, 3]
    with pytest.raises(StudylibError, match="--tree"):
        speculative.generate(model, PROMPT, 5, draft="self:0", tree="2,2,3")


def test_engine_costs_read_tau_c_and_v_in_ar_steps():
    import pandas as pd

    from studylib.experiments.ch02_eagle import engine_costs

    # AR: 11 tokens in 1.0 s of decode -> 0.1 s per step. EAGLE: 11 tokens in 4 steps, 8 draft forwards
    # taking 0.08 s (c = 0.1) and 0.6 s of verification (v = 1.5).
    df = pd.DataFrame([
        {"prompt": "p", "method": "ar", "decode_s": 1.0, "new_tokens": 11, "steps": 10, "draft_s": 0.0,
         "verify_s": 0.0, "draft_forwards": 0},
        {"prompt": "p", "method": "eagle@2", "decode_s": 0.7, "new_tokens": 11, "steps": 4, "draft_s": 0.08,
         "verify_s": 0.6, "draft_forwards": 8},
    ])
    r = engine_costs(df).iloc[0]
    assert r.tau == pytest.approx(2.5) and r.c == pytest.approx(0.1) and r.v == pytest.approx(1.5)
    assert r.predicted_speedup == pytest.approx(2.5 / (1.5 + 2 * 0.1))


def test_acceptance_by_depth_explains_the_levels_a_tree_does_not_have():
    import pandas as pd

    from studylib.experiments.ch02_eagle import acceptance_by_depth
    from studylib.workbook import tables

    positions = pd.DataFrame({"method": ["eagle@2", "eagle@2", "eagle@3", "eagle@3", "eagle@3"],
                              "depth": [1, 2, 1, 2, 3], "acceptance": [0.5, 0.25, 0.6, 0.3, 0.1]})
    table = acceptance_by_depth(positions)
    assert table.loc[3, "eagle@3"] == 0.1 and pd.isna(table.loc[3, "eagle@2"])
    assert tables.notes(table) == ["Eagle@2: this tree has no level this deep, or no step reached the level above it"]


@pytest.fixture(scope="module")
def block_target():
    from studylib.models import load_model

    model, _ = load_model("tiny-random", "cpu", "float32", weights="q4_1", act="int8")
    return model


def test_on_a_block_format_target_the_draft_runs_the_targets_arithmetic(block_target):
    """The draft's linears become Q8_0 blocks in the target's --act, built once per target; the reduced LM head
    is the target's own block rows. The decoder's output stays AR's, token for token."""
    from studylib.models.quant import QuantTensor

    model = block_target
    torch.manual_seed(1)
    plain = EagleHead(model.config).eval()
    ids = torch.arange(0, model.config.vocab_size, 3)
    draft = EagleDraft(plain, ids, TreeSpec(3, 2, 5))
    run = draft.runtime_head(model)
    assert run is draft.runtime_head(model) and run is not plain
    for w in (run.fc.weight, run.layer.self_attn.qkv_weight, run.layer.self_attn.o_proj.weight,
              run.layer.mlp.gate_up_weight, run.layer.mlp.down_proj.weight):
        assert type(w) is QuantTensor and (w.fmt, w.act) == (eagle.HEAD_BLOCK_FORMAT, "int8")
    assert isinstance(plain.fc.weight, torch.nn.Parameter)  # the loaded head itself is left as it was
    _, rows = draft.projection(model)
    head_w = model.lm_head.weight
    assert type(rows) is QuantTensor and rows.act == "int8" and torch.equal(rows.data, head_w.data[ids])
    # the rounded head computes near the fp32 head, and not the same bits (it really runs on blocks)
    x, f = torch.randn(1, 4, model.config.hidden_size), torch.randn(1, 4, model.config.hidden_size)
    with torch.inference_mode():
        a = plain(x, f, eagle.CausalKV(1, 4, model.device))
        b = run(x, f, eagle.CausalKV(1, 4, model.device))
    assert not torch.equal(a, b) and torch.allclose(a, b, atol=0.1 * float(a.abs().max()))
    res = eagle.generate(model, PROMPT, 24, draft=draft)
    assert res.token_ids == ar.generate(model, PROMPT, 24).token_ids
    assert res.extra["draft_arithmetic"] == "q8_0 x int8"


def test_on_a_dense_target_the_draft_is_the_head_itself(tiny, head):
    model, _ = tiny
    draft = EagleDraft(head, None, TreeSpec(2, 2, 3))
    assert draft.runtime_head(model) is head and draft.arithmetic(model) == "float32"

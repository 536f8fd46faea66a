"""Quest (memory-augmented attention): spec, page bounds, selection, torch backend vs reference, cache."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from studylib.attention import Pattern, Quest, attention, make_cache
from studylib.attention.quest import (
    QuestKVCache,
    page_bounds,
    page_summaries,
    quest_attention_ref,
    quest_mask_ref,
    select_tokens,
)
from studylib.errors import StudylibError
from studylib.models import DenseKVCache


def _qkv(b, h, hkv, t, d, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, 1, d, generator=g)
    k = torch.randn(b, hkv, t, d, generator=g)
    v = torch.randn(b, hkv, t, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


# --- the spec -------------------------------------------------------------------------------------
def test_parse_keywords_positional_and_round_trip():
    p = Pattern.parse("quest:budget=512")
    assert isinstance(p, Quest) and (p.budget, p.page, p.sinks, p.recent, p.dense_layers) == (512, 16, 4, 64, 2)
    assert Pattern.parse("quest:512,8,0,32,0") == Quest(budget=512, page=8, sinks=0, recent=32, dense_layers=0)
    assert Pattern.parse(p.spec) == p
    assert p.kind == "quest" and p.keys_read == 4 + 64 + ((512 - 68) // 16) * 16
    assert p.kv_budget(100) == 100 and p.kv_budget(10_000) == p.keys_read


@pytest.mark.parametrize("bad", ["quest", "quest:budget=10", "quest:budget=100,page=0", "quest:budget=100,foo=1",
                                 "quest:1,2,3,4,5,6", "quest:budget=100,recent=0"])
def test_bad_specs_are_one_clear_error(bad):
    with pytest.raises(StudylibError, match="grammar"):
        Pattern.parse(bad)


def test_static_mask_is_dense_causal_and_read_counts():
    p = Pattern.parse("quest:budget=96,page=16,sinks=4,recent=12,dense=1")
    pos = torch.arange(50)
    assert torch.equal(p.mask(pos, pos), Pattern.parse("dense").mask(pos, pos))  # prefill stays dense
    assert p.read_tokens(90, 4) == 90 * 4  # within the budget every key is read
    T = 1000  # past it: dense layers read T, the others the budget plus one summary per page
    assert p.read_tokens(T, 4) == T + 3 * (p.keys_read + -(-T // 16))


# --- page bounds and selection ----------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(t=st.integers(1, 80), page=st.sampled_from([1, 3, 8, 16]), g=st.sampled_from([1, 2, 3]),
       hkv=st.integers(1, 2), seed=st.integers(0, 10_000))
def test_page_bound_is_an_upper_bound_on_every_score(t, page, g, hkv, seed):
    q, k, _ = _qkv(2, g * hkv, hkv, t, 8, seed)
    lo, hi = page_summaries(k, page)
    bound = page_bounds(q[:, :, 0], lo, hi)  # (B, H, NP)
    scores = q @ k.repeat_interleave(g, 1).transpose(-1, -2)  # (B, H, 1, T)
    n = -(-t // page)
    padded = torch.nn.functional.pad(scores[:, :, 0], (0, n * page - t), value=float("-inf"))
    true_max = padded.reshape(2, g * hkv, n, page).amax(-1)
    assert bool((bound >= true_max - 1e-5).all())


@settings(max_examples=60, deadline=None)
@given(t=st.integers(40, 200), page=st.sampled_from([4, 8, 16]), seed=st.integers(0, 10_000))
def test_selection_never_misses_the_page_holding_the_top_score(t, page, seed):
    # One head per KV head (MHA): every page whose bound reaches the top true score is a contender; with a
    # budget of that many pages, the page holding the top score is always read.
    S, R = 2, 4
    q, k, _ = _qkv(1, 1, 1, t, 8, seed)
    lo, hi = page_summaries(k, page)
    scores = (q[0, 0, 0] @ k[0, 0].T)
    region = torch.arange(t)
    cand_keys = (region >= S) & (region < t - R)
    if not bool(cand_keys.any()):
        return
    top_key = int(scores.masked_fill(~cand_keys, float("-inf")).argmax())
    bound = page_bounds(q[:, :, 0], lo, hi)[0, 0]
    first = torch.arange(bound.numel()) * page
    cand = (torch.clamp(first + page, max=t) - 1 >= S) & (first < t - R)
    contenders = int(((bound >= scores[top_key] - 1e-6) & cand).sum())
    pattern = Quest(budget=S + R + contenders * page, page=page, sinks=S, recent=R, dense_layers=0)
    if not pattern.selects(t):
        return
    idx, valid = select_tokens(q[:, :, 0], lo, hi, t, pattern)
    assert top_key in set(idx[valid].tolist())


@pytest.mark.parametrize("b,h,hkv,t,page,S,R", [(1, 4, 4, 100, 16, 0, 1), (2, 9, 3, 257, 16, 4, 20),
                                                 (2, 6, 2, 130, 7, 3, 9), (1, 8, 1, 64, 4, 1, 5)])
def test_torch_backend_matches_reference_on_awkward_sizes(b, h, hkv, t, page, S, R):
    q, k, v = _qkv(b, h, hkv, t, 16, seed=t)
    p = Quest(budget=S + R + 3 * page, page=page, sinks=S, recent=R, dense_layers=0)
    torch.testing.assert_close(attention(q, k, v, p), quest_attention_ref(q, k, v, p), atol=1e-5, rtol=1e-5)
    vis = quest_mask_ref(q, k, p)
    assert int(vis[0, 0, 0].sum()) <= p.keys_read  # never reads more than the budget
    assert bool(vis[..., :S].all()) and bool(vis[..., t - R:].all())  # sinks and recent always read


def test_budget_covering_the_context_is_dense_attention():
    q, k, v = _qkv(2, 6, 2, 90, 16, seed=3)
    p = Quest(budget=90, page=16, sinks=2, recent=8, dense_layers=0)
    assert not p.selects(90)
    torch.testing.assert_close(attention(q, k, v, p), attention(q, k, v, "dense"))
    # One page short of the whole context really does drop keys.
    p2 = Quest(budget=2 + 8 + 16 * 4, page=16, sinks=2, recent=8, dense_layers=0)
    assert p2.selects(90) and not torch.allclose(attention(q, k, v, p2), attention(q, k, v, "dense"))


# --- the cache ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from studylib.models import load_model

    return load_model("tiny-random")[0]


def test_cache_summaries_follow_writes_and_rollbacks(tiny):
    cfg = tiny.config
    p = Pattern.parse("quest:budget=40,page=8,sinks=2,recent=6,dense=0")
    cache = make_cache(p, cfg, 120)
    assert isinstance(cache, QuestKVCache)
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        tiny(torch.randint(3, 250, (1, 53), generator=g), cache.begin(53))
        for _ in range(9):
            tiny(torch.randint(3, 250, (1, 1), generator=g), cache.begin(1))
        cache.truncate(57)
        for _ in range(4):
            tiny(torch.randint(3, 250, (1, 1), generator=g), cache.begin(1))
    L = cache.length
    for layer in range(cfg.num_layers):
        lo, hi = page_summaries(cache.k[layer][:, :, :L], 8)
        n = lo.shape[2]
        torch.testing.assert_close(cache.kmin[layer][:, :, :n], lo)
        torch.testing.assert_close(cache.kmax[layer][:, :, :n], hi)


def test_cache_decode_step_reads_the_selection_and_dense_layers_read_all(tiny):
    cfg = tiny.config  # 2 layers; the first stays dense
    p = Pattern.parse("quest:budget=30,page=8,sinks=2,recent=4,dense=1")
    cache = make_cache(p, cfg, 100)
    g = torch.Generator().manual_seed(1)
    D, H, Hkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    prefix = [torch.randn(1, Hkv, 70, D, generator=g) for _ in range(4)]
    view = cache.begin(70)
    for layer in range(2):
        view.attend(layer, torch.randn(1, H, 70, D, generator=g), prefix[2 * layer], prefix[2 * layer + 1])
    view = cache.begin(1)
    for layer in range(2):
        q, k, v = (torch.randn(1, H, 1, D, generator=g), torch.randn(1, Hkv, 1, D, generator=g),
                   torch.randn(1, Hkv, 1, D, generator=g))
        out = view.attend(layer, q, k, v)
        keys, vals = cache.k[layer][:, :, :71], cache.v[layer][:, :, :71]
        want = attention(q, keys, vals, "dense") if layer == 0 else quest_attention_ref(q, keys, vals, p)
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert cache.keys_read == p.read_tokens(71, 2)


def test_generation_with_a_whole_context_budget_equals_dense(tiny):
    from studylib.decoding import ar

    prompt = list(range(5, 60))
    dense = ar.generate(tiny, prompt, 16)
    quest = ar.generate(tiny, prompt, 16, attention="quest:budget=200,page=8,sinks=2,recent=8,dense=0")
    assert quest.token_ids == dense.token_ids


def test_copy_from_a_dense_prefill_then_decode_like_a_fresh_cache(tiny):
    cfg = tiny.config
    spec = "quest:budget=40,page=8,sinks=2,recent=6,dense=0"
    ids = torch.randint(3, 250, (1, 80), generator=torch.Generator().manual_seed(2))
    fresh, dense = make_cache(spec, cfg, 100), DenseKVCache(cfg, 1, 100)
    with torch.inference_mode():
        tiny(ids, fresh.begin(80))
        tiny(ids, dense.begin(80))
        copied = make_cache(spec, cfg, 100).copy_from(dense)
        tok = torch.tensor([[7]])
        a = tiny(tok, fresh.begin(1)).logits
        b = tiny(tok, copied.begin(1)).logits
    torch.testing.assert_close(a, b)


def test_quest_never_evicts(tiny):
    with pytest.raises(StudylibError, match="evict"):
        make_cache("quest:budget=100", tiny.config, 200, evict=True)


# --- the fused C kernel (CPU decode) -----------------------------------------------------------------
def _c_or_skip():
    from studylib.attention.quest import kernel_backend

    if kernel_backend() != "c":
        pytest.skip("the Quest C kernel does not build here (no C compiler or no AVX2)")


@pytest.mark.parametrize("b,h,hkv,t,d,spec", [
    (1, 9, 3, 3000, 64, "quest:budget=1024"),
    (2, 4, 4, 500, 32, "quest:budget=100,page=8,sinks=2,recent=9,dense=0"),
    (1, 6, 2, 301, 24, "quest:budget=60,page=7,sinks=0,recent=5,dense=0"),  # head_dim not a multiple of 8
])
def test_c_kernel_matches_reference(b, h, hkv, t, d, spec):
    from studylib.attention.quest import quest_decode_c

    _c_or_skip()
    p = Pattern.parse(spec)
    g = torch.Generator().manual_seed(t)
    q = torch.randn(b, h, 1, d, generator=g)
    k, v = (torch.randn(b, hkv, t + 40, d, generator=g) for _ in range(2))  # slots past t must be ignored
    n_max = -(-(t + 40) // p.page)
    lo = torch.full((b, hkv, n_max, d), float("inf"))
    hi = torch.full((b, hkv, n_max, d), float("-inf"))
    slo, shi = page_summaries(k[:, :, :t], p.page)
    lo[:, :, : slo.shape[2]], hi[:, :, : shi.shape[2]] = slo, shi
    want = quest_attention_ref(q, k[:, :, :t].contiguous(), v[:, :, :t].contiguous(), p)
    torch.testing.assert_close(quest_decode_c(q, k, v, lo, hi, t, p), want, atol=1e-5, rtol=1e-5)


def test_cache_decodes_the_same_with_the_c_kernel_and_with_torch(tiny, monkeypatch):
    _c_or_skip()
    spec = "quest:budget=40,page=8,sinks=2,recent=6,dense=1"
    ids = torch.randint(3, 250, (1, 90), generator=torch.Generator().manual_seed(5))
    logits = {}
    for mode in ("c", "torch"):
        monkeypatch.setenv("STUDYLIB_QUEST_KERNEL", mode)
        cache = make_cache(spec, tiny.config, 110)
        with torch.inference_mode():
            tiny(ids, cache.begin(90))
            logits[mode] = torch.cat([tiny(torch.tensor([[t]]), cache.begin(1)).logits for t in (5, 9, 11)])
    torch.testing.assert_close(logits["c"], logits["torch"], atol=1e-5, rtol=1e-5)


def test_kernel_setting_is_checked(monkeypatch):
    from studylib.attention.quest import _c_kernel

    monkeypatch.setenv("STUDYLIB_QUEST_KERNEL", "fast")
    with pytest.raises(StudylibError, match="STUDYLIB_QUEST_KERNEL='fast'"):
        _c_kernel()


def test_each_teacher_forced_query_sees_what_the_reference_step_would():
    from studylib.attention.quest import page_summaries, quest_mask_ref, teacher_forced_mask

    g = torch.Generator().manual_seed(7)
    pattern = Quest(budget=40, page=8, sinks=2, recent=8, dense_layers=0)
    B, H, Hkv, D, start, n = 1, 4, 2, 16, 70, 12
    k = torch.randn(B, Hkv, start + n, D, generator=g)
    q = torch.randn(B, H, n, D, generator=g)
    kmin, kmax = page_summaries(k, pattern.page)
    mask = teacher_forced_mask(q, kmin, kmax, start, pattern).repeat_interleave(H // Hkv, 1)
    for i in range(n):
        ref = quest_mask_ref(q[:, :, i:i + 1], k[:, :, :start + i + 1], pattern)[:, :, 0]
        assert torch.equal(mask[:, :, i, :start + i + 1], ref), i
        assert not mask[:, :, i, start + i + 1:].any()  # causal: nothing later


def test_teacher_forcing_refuses_a_recent_window_shorter_than_a_page():
    from studylib.attention.quest import page_summaries, teacher_forced_mask

    pattern = Quest(budget=40, page=8, sinks=2, recent=6, dense_layers=0)
    k = torch.randn(1, 1, 80, 8)
    kmin, kmax = page_summaries(k, 8)
    with pytest.raises(StudylibError, match="recent >= page"):
        teacher_forced_mask(torch.randn(1, 1, 4, 8), kmin, kmax, 76, pattern)


def _tf_mask_matches_stepping(q, k, start, pattern):
    """Assert each row of ``teacher_forced_mask`` is the reference step's mask; return the rows (B, H, n, L)."""
    from studylib.attention.quest import teacher_forced_mask

    H, Hkv, n = q.shape[1], k.shape[1], q.shape[2]
    kmin, kmax = page_summaries(k, pattern.page)
    mask = teacher_forced_mask(q, kmin, kmax, start, pattern).repeat_interleave(H // Hkv, 1)
    for i in range(n):
        ref = quest_mask_ref(q[:, :, i:i + 1], k[:, :, :start + i + 1], pattern)[:, :, 0]
        assert torch.equal(mask[:, :, i, :start + i + 1], ref), i
        assert not mask[:, :, i, start + i + 1:].any(), i
    return mask


def test_teacher_forced_selection_switches_pages_from_row_to_row_like_stepping():
    # Page j's keys carry a large value on channel j, so a query pointing at channels a > b makes pages a
    # and b the top two: each row points elsewhere, and the teacher-forced mask must follow every switch.
    pattern = Quest(budget=13, page=4, sinks=1, recent=4, dense_layers=0)  # 2 pages a step
    assert pattern.n_pages == 2
    B, H, Hkv, D, start, n = 1, 4, 2, 16, 40, 8
    P, S, R = pattern.page, pattern.sinks, pattern.recent
    g = torch.Generator().manual_seed(11)
    k = torch.randint(-1, 2, (B, Hkv, start + n, D), generator=g).float()
    for j in range(start // P):
        k[:, :, j * P:(j + 1) * P, j] = 8.0
    q = torch.zeros(B, H, n, D)
    for i in range(n):
        for h in range(H):
            a, b = (3 * i + h) % 9, (5 * i + 2 * h + 4) % 9
            q[0, h, i, a] += 4.0
            q[0, h, i, b] += 2.0 if b != a else 0.0
    mask = _tf_mask_matches_stepping(q, k, start, pattern)
    # the pages region no row counts as sink or recent: the selections there must differ between rows
    region = mask[:, :, :, S:start + 1 - R]
    switches = [i for i in range(1, n) if not torch.equal(region[:, :, i], region[:, :, i - 1])]
    assert len(switches) >= n // 2, switches
    # and each row reads exactly its two pages per KV head (nothing else beyond sinks and recent)
    G = H // Hkv
    for i in range(n):
        for hk in range(Hkv):
            seen = mask[0, hk * G, i, : start + 1 - R]
            pages = {s // P for s in range(S, start + 1 - R) if seen[s]}
            assert len(pages) == 2, (i, hk, pages)


@pytest.mark.parametrize("case", ["tied_pages_at_the_cut", "all_keys_equal"])
def test_teacher_forced_selection_breaks_tied_bounds_like_stepping(case):
    pattern = Quest(budget=13, page=4, sinks=1, recent=4, dense_layers=0)  # 2 pages a step
    B, H, Hkv, D, start, n = 1, 4, 2, 8, 40, 6
    P, S, R = pattern.page, pattern.sinks, pattern.recent
    g = torch.Generator().manual_seed(5)
    q = torch.randint(0, 4, (B, H, n, D), generator=g).float()  # >= 0: a larger key max is a larger bound
    if case == "all_keys_equal":
        k = torch.ones(B, Hkv, start + n, D)  # every page ties: the lowest candidate pages win
        want = {0, 1}
    else:
        k = torch.randint(-2, 3, (B, Hkv, start + n, D), generator=g).float()
        k[:, :, 4 * P:5 * P] = 10.0  # page 4 is the clear top
        block = torch.randint(5, 7, (B, Hkv, P, D), generator=g).float()
        for j in (7, 2, 5):  # identical keys: tied second place, page 2 must win the tie
            k[:, :, j * P:(j + 1) * P] = block
        want = {2, 4}
    mask = _tf_mask_matches_stepping(q, k, start, pattern)
    for i in range(n):
        for h in range(H):
            seen = mask[0, h, i, : start + 1 - R]
            assert {s // P for s in range(S, start + 1 - R) if seen[s]} == want, (i, h)


def _cache_state(cache):
    tensors = {"valid": cache.valid, "next_pos": cache.next_pos}
    for name in ("k", "v", "kmin", "kmax"):
        for layer, t in enumerate(getattr(cache, name)):
            tensors[f"{name}{layer}"] = t
    plain = {a: getattr(cache, a) for a in ("length", "padded", "_start", "_n", "_select", "_teacher_forced")}
    return {n: t.clone() for n, t in tensors.items()}, plain


def _assert_state_unchanged(cache, before):
    tensors, plain = _cache_state(cache)
    assert plain == before[1]
    for name, t in before[0].items():
        assert torch.equal(tensors[name], t), name


def test_a_refused_teacher_forced_call_leaves_the_cache_as_it_was(tiny):
    cfg = tiny.config
    spec = "quest:budget=40,page=8,sinks=2,recent=8,dense=0"
    g = torch.Generator().manual_seed(3)
    # a padded batch: teacher forcing refuses
    cache = make_cache(spec, cfg, 120, batch=2)
    valid = torch.ones(2, 60, dtype=torch.bool)
    valid[1, :5] = False
    with torch.inference_mode():
        tiny(torch.randint(3, 250, (2, 60), generator=g), cache.begin(60, valid=valid))
    assert cache.padded
    before = _cache_state(cache)
    with pytest.raises(StudylibError, match="unpadded"):
        cache.begin_teacher_forced(10)
    _assert_state_unchanged(cache, before)
    # recent < page, and no room for n more tokens: refused up front too
    for spec, n, why in [("quest:budget=40,page=8,sinks=2,recent=6,dense=0", 10, "recent >= page"),
                         ("quest:budget=40,page=8,sinks=2,recent=8,dense=0", 61, "raise max_len")]:
        cache = make_cache(spec, cfg, 120)
        with torch.inference_mode():
            tiny(torch.randint(3, 250, (1, 60), generator=g), cache.begin(60))
        before = _cache_state(cache)
        with pytest.raises(StudylibError, match=why):
            cache.begin_teacher_forced(n)
        _assert_state_unchanged(cache, before)

"""Training EAGLE heads on the draft corpus: the training-time-test mask is the tree's visibility, the
recipes learn, training resumes, stops by the curve, and the export loads as a working draft."""

from __future__ import annotations

import json

import pytest
import torch

from studylib.decoding import ar, eagle
from studylib.drafting import corpus as dc
from studylib.drafting import head_train as ht
from studylib.errors import StudylibError
from studylib.models import load_model


def test_ttt_mask_is_what_a_depth_s_node_sees():
    kv = ht.TTTKV(1, 6, "cpu")
    assert torch.equal(kv.mask(1), torch.ones(6, 6, dtype=torch.bool).tril())
    m3 = kv.mask(3)  # (6, 18): step 1 rows, step 2 rows, step 3 rows
    j = 4  # a depth-3 node at position 4: committed context 0..2, its parent (step 2, row 3), itself
    assert m3[j, :6].nonzero().flatten().tolist() == [0, 1, 2]
    assert m3[j, 6:12].nonzero().flatten().tolist() == [3]
    assert m3[j, 12:].nonzero().flatten().tolist() == [4]
    assert m3.sum(1).min() >= 1  # no row attends to nothing


def test_plateau_rule():
    curve = [{"top1_1": v} for v in (0.1, 0.3, 0.4, 0.401, 0.4015, 0.4012)]
    assert ht.plateaued(curve, patience=3, min_delta=0.002)
    assert not ht.plateaued(curve, patience=3, min_delta=0.0005)
    assert not ht.plateaued(curve[:3], patience=3, min_delta=0.002)


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    feat, tok = load_model("tiny-random")
    gen, _ = load_model("tiny-random", weights="q4_1", act="int8")
    out = tmp_path_factory.mktemp("corpus") / "c"
    cfg = dc.CorpusConfig(model="tiny-random", tokens=1500, max_new=24, per_shard={"self": 8}, self_tokens=12,
                          weights="q4_1", act="int8", max_running=8, kv_budget_mib=32, out=str(out))
    man = dc.build(cfg, models=(feat, gen, tok), progress=False)
    return feat, tok, man


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_each_recipe_learns_and_exports_a_working_draft(tmp_path, tiny_corpus, kind):
    feat, tok, man = tiny_corpus
    cfg = ht.HeadTrainConfig(kind=kind, corpus=man["path"], context=16, batch_tokens=256, lr=3e-3, warmup=5,
                             max_steps=60, decay_steps=60, eval_every=20, eval_answers=16, patience=10, head_vocab=64,
                             ttt_steps=2, precision="fp32")
    res = ht.train(cfg, tmp_path / "work", loaded=(feat, tok), progress=False)
    assert res["step"] == 60 and res["stop"] == "max_steps" and len(res["curve"]) == 4
    first = res["history"][0]
    last = sum(h["loss"] for h in res["history"][-10:]) / 10
    assert last < first["loss"]  # it learns something on the training answers
    meta = ht.export(res, cfg, feat, tmp_path / "head", man)
    assert meta["head_kind"] == kind and len(meta["sha256"]) == 64 and meta["corpus"]["hash"] == man["hash"]
    assert json.loads((tmp_path / "head" / eagle.META_FILE).read_text())["sha256"] == meta["sha256"]
    draft = eagle.load_head(tmp_path / "head", feat)
    assert draft.head.kind == kind and len(draft.head_ids) == 64
    prompt = list(range(10, 30))
    # lossless whatever the head: greedy EAGLE equals AR on the target
    assert eagle.generate(feat, prompt, 20, draft=draft).token_ids == ar.generate(feat, prompt, 20).token_ids


def test_training_resumes_where_it_stopped(tmp_path, tiny_corpus):
    feat, tok, man = tiny_corpus
    kw = dict(kind="eagle3", corpus=man["path"], context=16, batch_tokens=256, lr=3e-3, warmup=5, eval_every=10,
              eval_answers=8, patience=50, head_vocab=64, ttt_steps=2, precision="fp32", decay_steps=30)
    whole = ht.train(ht.HeadTrainConfig(max_steps=30, **kw), tmp_path / "a", loaded=(feat, tok), progress=False)
    ht.train(ht.HeadTrainConfig(max_steps=20, **kw), tmp_path / "b", loaded=(feat, tok), progress=False)
    resumed = ht.train(ht.HeadTrainConfig(max_steps=30, **kw), tmp_path / "b", loaded=(feat, tok), progress=False)
    for k, v in whole["head"].state_dict().items():
        assert torch.allclose(v, resumed["head"].state_dict()[k], atol=1e-5), k


def test_a_run_killed_between_evaluations_resumes_from_its_last_timed_checkpoint(tmp_path, tiny_corpus, monkeypatch):
    """checkpoint_minutes=0 saves after every step: a run that dies at step 13, between the evaluations at
    10 and 20, resumes at 13 and ends where an unbroken run ends."""
    feat, tok, man = tiny_corpus
    kw = dict(kind="eagle3", corpus=man["path"], context=16, batch_tokens=256, lr=3e-3, warmup=5, eval_every=10,
              eval_answers=8, patience=50, head_vocab=64, ttt_steps=2, precision="fp32", decay_steps=30,
              max_steps=30)
    whole = ht.train(ht.HeadTrainConfig(**kw), tmp_path / "a", loaded=(feat, tok), progress=False)
    real, calls = ht.losses, []

    def dies_at_step_14(head, *a, **k):
        calls.append(head.training)  # held-out evaluations call it too, with the head in eval mode
        if sum(calls) == 14:
            raise KeyboardInterrupt("killed")
        return real(head, *a, **k)

    monkeypatch.setattr(ht, "losses", dies_at_step_14)
    with pytest.raises(KeyboardInterrupt):
        ht.train(ht.HeadTrainConfig(checkpoint_minutes=0, **kw), tmp_path / "b", loaded=(feat, tok), progress=False)
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=True)["step"] == 13
    monkeypatch.setattr(ht, "losses", real)
    resumed = ht.train(ht.HeadTrainConfig(**kw), tmp_path / "b", loaded=(feat, tok), progress=False)
    for k, v in whole["head"].state_dict().items():
        assert torch.allclose(v, resumed["head"].state_dict()[k], atol=1e-5), k


def test_bad_head_settings_are_named():
    with pytest.raises(StudylibError, match="kind in"):
        ht.HeadTrainConfig(kind="medusa")


def test_eagle_names_resolve_to_the_shipped_default_then_the_cache(tmp_path, monkeypatch, tiny_corpus):
    """``eagle`` follows the shipped pointer to a recipe's head; ``eagle3`` is that recipe's head; without
    shipped heads both fall back to the cache, and a missing head is one clear error."""
    from studylib.decoding import draft_files
    from studylib.decoding.draft_files import slug as _slug

    feat, _, _ = tiny_corpus
    monkeypatch.setattr(draft_files, "SHIPPED", tmp_path / "assets")
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path / "cache"))
    slug = _slug(feat.config.name)
    with pytest.raises(StudylibError, match="no EAGLE head 'eagle3'"):
        eagle.resolve_eagle("eagle3", feat)
    head = eagle.EagleHead(feat.config, "eagle3")
    eagle.save_head(head, tmp_path / "assets" / f"{slug}-eagle3", [], {"head_kind": "eagle3"})
    (tmp_path / "assets" / f"{slug}-eagle.default").write_text("eagle3\n")
    eagle._LOADED.clear()
    assert eagle.head_path("eagle", feat.config.name) == tmp_path / "assets" / f"{slug}-eagle3"
    assert eagle.resolve_eagle("eagle", feat).head.kind == "eagle3"
    assert eagle.resolve_eagle("eagle3:full", feat).head_ids is None
    assert eagle.head_path("eagle1", feat.config.name).name == f"{slug}-eagle1"  # the cache's


def test_chapter_2_reads_the_shipped_head_and_its_manifest(tmp_path, monkeypatch, tiny_corpus):
    """Chapter 2 trains nothing by default: it reads the shipped head, names its sha256 and shows its
    curve and data from the manifest; without a head it says how to get one."""
    from studylib.decoding import draft_files
    from studylib.decoding.draft_files import slug as _slug
    from studylib.experiments import ch02_eagle as ex

    feat, tok, man = tiny_corpus
    monkeypatch.setattr(draft_files, "SHIPPED", tmp_path / "assets")
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(StudylibError, match="retrain_drafts=true"):
        ex.chapter_head(feat.config.name)
    cfg = ht.HeadTrainConfig(kind="eagle3", corpus=man["path"], context=16, batch_tokens=256, warmup=2, max_steps=6,
                             decay_steps=6, eval_every=3, eval_answers=8, head_vocab=64, ttt_steps=2, precision="fp32")
    res = ht.train(cfg, tmp_path / "work", loaded=(feat, tok), progress=False)
    slug = _slug(feat.config.name)
    ht.export(res, cfg, feat, tmp_path / "assets" / f"{slug}-eagle3", man)
    (tmp_path / "assets" / f"{slug}-eagle.default").write_text("eagle3")
    meta = ex.chapter_head(feat.config.name)
    assert meta["head_kind"] == "eagle3" and not meta["trained_now"] and len(meta["sha256"]) == 64
    curve = ex.training_curve(meta)
    assert set(curve["drafted token"]) == {"first", "second"} and curve.tokens.max() == 6 * 256
    table = ex.corpus_table(meta)
    assert table.answer_tokens.sum() == man["answer_tokens"] and abs(table.share.sum() - 1) < 1e-9
    text = ex.head_summary(meta)
    assert meta["sha256"][:12] in text and "shipped with the study" in text and "EAGLE-3" in text


def test_validation_is_by_document_and_a_finished_run_stays_finished(tmp_path, tiny_corpus):
    """An article's four tasks land on one side of the split; the curve's last point is the exported
    weights' own; a rerun of a run the curve stopped returns that head instead of training on."""
    assert dc.document_of("xsum-123#t0", "xsum") == dc.document_of("xsum-123#t3", "xsum") == "xsum-123"
    assert ht.heldout("xsum-123") in (True, False)
    feat, tok, man = tiny_corpus
    kw = dict(kind="eagle1", corpus=man["path"], context=16, batch_tokens=256, warmup=2, max_steps=7, decay_steps=7,
              eval_every=3, eval_answers=8, head_vocab=64, precision="fp32")
    res = ht.train(ht.HeadTrainConfig(**kw), tmp_path / "w", loaded=(feat, tok), progress=False)
    assert [c["step"] for c in res["curve"]] == [0, 3, 6, 7] and res["final"]["step"] == 7
    flat = dict(kw, max_steps=50, decay_steps=50, patience=1, min_delta=1.0)  # any evaluation counts as flat
    first = ht.train(ht.HeadTrainConfig(**flat), tmp_path / "f", loaded=(feat, tok), progress=False)
    assert first["stop"] == "curve flat" and first["step"] == 3
    again = ht.train(ht.HeadTrainConfig(**flat), tmp_path / "f", loaded=(feat, tok), progress=False)
    assert again["step"] == first["step"] and again["stop"] == "curve flat"
    for k, v in first["head"].state_dict().items():
        assert torch.equal(v, again["head"].state_dict()[k])


def test_a_retrain_is_compared_with_the_shipped_head_at_the_same_point():
    from studylib.drafting.head_train import against_shipped

    ref = {"training": {"steps": 1000}, "heldout": {"final": {"top1_1": 0.62, "top1_2": 0.5}, "curve": [
        {"step": 0, "top1_1": 0.0, "top1_2": 0.0}, {"step": 250, "top1_1": 0.40, "top1_2": 0.30}, {"step": 500, "top1_1": 0.55, "top1_2": 0.42},
        {"step": 1000, "top1_1": 0.62, "top1_2": 0.5}]}}
    full = {"training": {"steps": 1000}, "heldout": {"final": {"top1_1": 0.615, "top1_2": 0.49}}}
    assert against_shipped(full, ref) == "the shipped head: 0.620 and 0.500 (difference -0.005 on the first drafted token)"
    partial = {"training": {"steps": 600}, "heldout": {"final": {"top1_1": 0.56, "top1_2": 0.43}}}
    assert against_shipped(partial, ref).startswith("the shipped run at step 500 of 1000: 0.550 and 0.420 (difference +0.010")
    early = {"training": {"steps": 100}, "heldout": {"final": {"top1_1": 0.2, "top1_2": 0.1}}}
    assert "no held-out point" in against_shipped(early, ref) and "first is at step 250" in against_shipped(early, ref)
    # a retrain that evaluated at step 500 too is compared there, point for point (this session's 276-step
    # retrain read 'difference +0.001' from its final point where its step 250 equalled the shipped one)
    same = {**partial, "heldout": {**partial["heldout"], "curve": [{"step": 500, "top1_1": 0.55, "top1_2": 0.42}]}}
    assert against_shipped(same, ref) == ("the shipped run at step 500 of 1000: 0.55000 against this run's 0.55000 "
                                          "at the same step (identical, loss included: the training reproduced "
                                          "bit for bit)")
    off = {**partial, "heldout": {**partial["heldout"], "curve": [{"step": 500, "top1_1": 0.54, "top1_2": 0.42}]}}
    assert against_shipped(off, ref).endswith("(difference -0.01000)")

"""The draft head's corpus: the split keeps every chapter's prompts out of it, and the shards hold the
target's own answers with its features, resumably."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from studylib import data
from studylib.decoding import ar
from studylib.drafting import corpus as dc
from studylib.errors import StudylibError
from studylib.models import DenseKVCache, load_model
from studylib.models.tokenizer import ByteTokenizer
from tests.test_data import _real, real_data


@real_data
@pytest.mark.parametrize("name", sorted(data.DATASETS))
def test_the_split_partitions_documents_and_chapters_only_see_eval(name):
    _real(name)
    key = data._DOC_KEY[name]
    every = data._indexed_rows(name, "all")
    ev, dr = data._indexed_rows(name, "eval"), data._indexed_rows(name, "draft")
    assert sorted(i for i, _ in ev + dr) == [i for i, _ in every] and ev and dr
    assert not ({r[key] for _, r in ev} & {r[key] for _, r in dr})  # no document straddles
    pool_docs = {str(r[key]).strip() for _, r in dr}
    field = {"xsum": "document", "narrativeqa": "document", "humaneval": "task_id"}[name]
    shown = data.load_dataset(name) + data.load_workload(name)
    assert shown and all(str(r.meta[field]).strip() not in pool_docs or name == "xsum" for r in shown)
    ids_draft = {r.id for r in data.load_dataset(name, split="draft")}
    assert not ids_draft & {r.id for r in shown}
    # ids are the whole file's, whatever the split
    assert {r.id for r in data.load_dataset(name, split="all")} == ids_draft | {r.id for r in data.load_dataset(name)}


@real_data
def test_long_text_reads_only_eval_documents():
    _real("narrativeqa")
    text = ByteTokenizer().decode(data.long_text(ByteTokenizer(), 40_000, seed=3))
    for _, r in data._indexed_rows("narrativeqa", "draft")[::25]:
        assert r["passage"].strip()[:300] not in text


@real_data
def test_the_pool_holds_draft_documents_and_no_chat_prompt():
    for n in data.DATASETS:
        _real(n)
    tok = ByteTokenizer()
    docs = dc.pool(tok, seed=0)
    assert all(docs[s] for s in ("xsum", "nqa", "story", "code"))
    draft_ids = {r.id for n in data.DATASETS for r in data.load_dataset(n, split="draft")}
    for p in docs["xsum"] + docs["nqa"] + docs["code"]:
        assert p.id.split("#")[0] in draft_ids
    texts = [tok.decode(p.ids) for s in ("xsum", "nqa", "story", "code") for p in docs[s][:200]]
    for rec in data.load_prompts():
        assert not any(rec.messages[0]["content"][:120] in t for t in texts)


@pytest.fixture(scope="module")
def tiny_pair():
    feat, tok = load_model("tiny-random")
    gen, _ = load_model("tiny-random", weights="q4_1", act="int8")
    return feat, gen, tok


def _cfg(tmp_path, tokens, **kw):
    return dc.CorpusConfig(model="tiny-random", tokens=tokens, max_new=12, per_shard={"self": 3}, self_tokens=10,
                           weights="q4_1", act="int8", max_running=4, kv_budget_mib=16, out=str(tmp_path / "c"), **kw)


def test_a_corpus_holds_the_targets_answers_and_features(tmp_path, tiny_pair):
    feat, gen, tok = tiny_pair
    man = dc.build(_cfg(tmp_path, 40), models=tiny_pair, progress=False)
    assert man["complete"] and man["answer_tokens"] >= 40 and man["shards"] >= 1
    shard = dc.shard_dirs(tmp_path / "c")[0]
    idx = json.loads((shard / "index.json").read_text())
    f = np.load(shard / "feats.npy", mmap_mode="r")
    assert f.shape == (idx["rows"], 4, feat.config.hidden_size) and f.dtype == np.float16
    assert idx["layers"] == list(dc.layers(feat.config))
    greedy = [a for a in idx["answers"] if a["kind"] == "greedy"]
    assert greedy and len(idx["answers"]) == 2 * len(idx["prompts"])
    for a in greedy[:2]:
        p = idx["prompts"][a["prompt"]]
        # the engine's greedy answer is the generating model's single-request AR answer
        assert ar.generate(gen, p["ids"], 12, tokenizer=tok).token_ids == a["ids"]
        # features: a fresh full prefill of prompt + answer (the rolled-back cache changed nothing)
        ids = p["ids"] + a["ids"]
        cache = DenseKVCache(feat.config, 1, len(ids))
        out = feat(torch.tensor([ids]), cache.begin(len(ids)), logits="none", hidden_layers=(*dc.layers(feat.config), -1))
        want = torch.stack([out.hidden[i][0] for i in (*dc.layers(feat.config), -1)], 1).half().numpy()
        got = np.concatenate([f[p["row"]: p["row"] + len(p["ids"])], f[a["row"]: a["row"] + len(a["ids"])]])
        assert np.allclose(got.astype(np.float32), want.astype(np.float32), atol=2e-3, rtol=2e-3)


def test_a_rerun_resumes_and_a_killed_shard_is_redone(tmp_path, tiny_pair):
    cfg = _cfg(tmp_path, 30)
    first = dc.build(cfg, models=tiny_pair, progress=False)
    shards = dc.shard_dirs(tmp_path / "c")
    stamp = [(s / "index.json").stat().st_mtime_ns for s in shards]
    (tmp_path / "c" / f"shard-{len(shards):05d}.tmp").mkdir()  # a shard killed mid-write
    again = dc.build(cfg, models=tiny_pair, progress=False)
    assert again["hash"] == first["hash"] and [(s / "index.json").stat().st_mtime_ns for s in shards] == stamp
    more = dc.build(_cfg(tmp_path, first["answer_tokens"] + 30), models=tiny_pair, progress=False)
    assert more["shards"] > first["shards"] and more["answer_tokens"] >= first["answer_tokens"] + 30
    assert not list((tmp_path / "c").glob("*.tmp"))


def test_bad_corpus_settings_are_named():
    with pytest.raises(StudylibError, match="per_shard keys"):
        dc.CorpusConfig(per_shard={"poems": 3})
    with pytest.raises(StudylibError, match="temperature > 0"):
        dc.CorpusConfig(temperature=0)


@pytest.mark.parametrize("argv", [["draft-corpus", "--per-shard", "xsum=four"], ["draft-corpus", "--act", "int4"],
                                  ["draft-corpus", "--per-shard", "poems=3"]])
def test_the_cli_refuses_bad_input_in_one_line(capsys, argv):
    from studylib.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("studylib: error:") and err.count("\n") == 1 and "Traceback" not in err

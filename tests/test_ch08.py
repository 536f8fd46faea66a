"""Chapter 8's bookkeeping on synthetic measurements: the C9 rule, the peer export/import, identity."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from studylib.claims import CONDITIONAL, HOLDS, check_one_decision
from studylib.experiments import ch08_compression as ch08


def _decode(arms, n=10, speed=None, flip=None):
    speed = speed or {}
    rows = []
    for p in range(n):
        for a in arms:
            toks = [1, 2, 3, p]
            if flip and a == flip[0] and p == flip[1]:
                toks = [1, 9, 3, p]
            rows.append({"arm": a, "prompt": p, "decode_s_per_token": 0.03 / speed.get(a, 1.0) * (1 + 0.01 * p),
                         "tokens": toks})
    return pd.DataFrame(rows)


def _task(arms, n=12, scale=None):
    scale = scale or {}
    rng = np.random.default_rng(0)
    base = rng.uniform(0.1, 0.3, n)
    return pd.DataFrame([{"arm": a, "doc": i, "rougeL": base[i] * scale.get(a, 1.0), "text": f"{a if a in scale else 'x'}{i}"}
                         for a in arms for i in range(n)])


def test_c9_needs_speed_and_quality_per_format():
    arms = ["dense", "gguf", "q8_0", "bf16"]
    dec = _decode(arms, speed={"gguf": 4.0, "q8_0": 3.5, "bf16": 1.2})
    prefill = pd.DataFrame([{"arm": a, "doc": i, "seconds": 1.0} for a in arms for i in range(10)])
    speed = ch08.speed_summary(dec, prefill, {a: 100.0 for a in arms})
    task = ch08.task_summary(_task(arms, scale={"q8_0": 0.5}))
    verdicts = ch08.judge_c9(speed, task, {"gguf": ch08.greedy_identity(dec, "gguf")}, "synthetic")
    check_one_decision(verdicts)
    decision = verdicts[0]
    assert decision.verdict == CONDITIONAL  # gguf holds; q8_0 fails quality; bf16 fails speed
    by_metric = {v.metric: v.verdict for v in verdicts[1:]}
    assert by_metric["greedy output identical to dense fp32, gguf"] == HOLDS
    assert by_metric["decode speed-up over dense fp32, same engine path, bf16"] != HOLDS
    assert by_metric["task-score ratio (ROUGE-L, XSum; n = summaries that differ), q8_0"] != HOLDS
    assert abs(speed.set_index("arm").loc["gguf", "speedup"] - 4.0) < 1e-6


def test_per_op_arms_are_timed_against_the_per_op_reference():
    arms = ["dense", "dense_perop", "gguf", "kv_int8"]
    dec = _decode(arms, speed={"dense_perop": 0.25, "gguf": 4.0, "kv_int8": 0.25})
    prefill = pd.DataFrame([{"arm": a, "doc": i, "seconds": 1.0} for a in arms for i in range(10)])
    speed = ch08.speed_summary(dec, prefill, {}).set_index("arm")
    assert speed.loc["kv_int8", "baseline"] == "dense_perop" and abs(speed.loc["kv_int8", "speedup"] - 1) < 1e-6
    assert speed.loc["gguf", "baseline"] == "dense" and abs(speed.loc["gguf", "speedup"] - 4) < 1e-6


def test_identical_summaries_do_not_count_as_evidence():
    task = _task(["dense", "q8_0"], scale={})  # q8_0 writes the reference's text on every document
    row = ch08.task_summary(task).set_index("arm").loc["q8_0"]
    assert row.n_differ == 0 and row.estimate.n == 0


def test_identity_reports_flips_where_they_start():
    dec = _decode(["dense", "gguf"], flip=("gguf", 3))
    ident = ch08.greedy_identity(dec, "gguf")
    assert ident["identical"] == 9 and ident["flips"] == [{"prompt": 3, "first_difference": 1}]
    assert "9 of 10" in ch08.identity_text(ident)


def test_peer_round_trip(tmp_path):
    dec = _decode(["dense", "gguf"], speed={"gguf": 4.0})
    prompts = [[5, 6, 7]] * 10
    path = ch08.export_peer_prompts(tmp_path, prompts, dec, 4)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 10 and rows[3]["ours"] == [1, 2, 3, 3] and rows[0]["prompt_token_ids"] == [5, 6, 7]
    table, text = ch08.peer_frame(tmp_path, dec)
    assert table is None and "No llama.cpp run" in text
    from studylib.bench.provenance import cpu_model

    peer = {"threads": 2, "date": "d", "cpu": "Another CPU", "prompts": [
        {"id": r["id"], "decode_s_per_token": 0.03 / 4.0 * (1 + 0.01 * r["id"]) * 2,
         "tokens": r["ours"] if r["id"] > 0 else [0]}
        for r in rows]}
    (tmp_path / "peers" / ch08.PEER_FILE).write_text(json.dumps(peer))
    table, text = ch08.peer_frame(tmp_path, dec)  # measured on another machine: not compared
    assert table is None and "not compared" in text and "Another CPU" in text
    peer["cpu"] = cpu_model()
    (tmp_path / "peers" / ch08.PEER_FILE).write_text(json.dumps(peer))
    table, text = ch08.peer_frame(tmp_path, dec)
    assert table is not None and "2.00x llama.cpp" in text and "9 of 10" in text


def test_exact_arms_are_those_with_the_reference_weights_and_arithmetic():
    fp = pd.DataFrame([{"arm": a, "weight_rel_error": e} for a, e in
                       [("dense", 0.0), ("dense_perop", 0.0), ("gguf", 0.0), ("gguf+bf16prefill", 0.0),
                        ("q8_0", 0.005), ("kv_int8", 0.0), ("awq4", None)]])
    assert ch08.exact_arms(fp) == ["gguf"]

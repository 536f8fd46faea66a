"""Bad input to generate and bench-serve: one line on stderr naming the problem and the fix, exit 2."""

from __future__ import annotations

import json

import pytest

from studylib.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("studylib: error:") and err.count("\n") == 1, err
    for n in needles:
        assert n in err, err


@pytest.mark.parametrize("device", ["foo", "cuda:x"])
def test_generate_unknown_device(capsys, device):
    code, out, err = run(capsys, "generate", "--model", "tiny-random", "--device", device, "--prompt", "hi")
    assert_one_line_error(code, err, repr(device), "use cpu or cuda")
    assert out == ""


def test_generate_model_dir_without_config_json(capsys, tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"")
    code, _, err = run(capsys, "generate", "--model", str(tmp_path), "--prompt", "hi")
    assert_one_line_error(code, err, str(tmp_path), "config.json", "supported:", "tiny-random", "llama")


def test_generate_model_dir_with_unreadable_config_json(capsys, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    code, _, err = run(capsys, "generate", "--model", str(tmp_path), "--prompt", "hi")
    assert_one_line_error(code, err, "config.json", "supported:")


SERVE = ("bench-serve", "--model", "tiny-random", "--workload", "synthetic", "--num-requests", "3")


def test_bench_serve_every_request_longer_than_the_context(capsys):
    # tiny-random has a 4096-token window; synthetic outputs are drawn from [max_new/2, max_new].
    code, out, err = run(capsys, *SERVE, "--max-new-tokens", "9000", "--json")
    assert_one_line_error(code, err, "every one of the 3 requests", "context window", "lower max_new_tokens")
    assert out == ""


def test_bench_serve_every_request_larger_than_the_kv_pool(capsys):
    # One 16-token block of tiny-random's KV is 8 KiB: a 0.0079 MiB budget holds exactly one block.
    code, _, err = run(capsys, *SERVE, "--max-new-tokens", "40", "--kv-budget-mib", "0.0079")
    assert_one_line_error(code, err, "every one of the 3 requests", "KV budget")


def test_bench_serve_partly_rejected_still_serves_the_rest(capsys, tmp_path):
    f = tmp_path / "w.jsonl"
    f.write_text('{"id": "ok", "prompt": "hi", "max_new_tokens": 4}\n'
                 + json.dumps({"id": "long", "prompt": "x" * 5000, "max_new_tokens": 4}) + "\n")
    code, out, err = run(capsys, "bench-serve", "--model", "tiny-random", "--workload", str(f),
                         "--num-requests", "2", "--max-new-tokens", "4", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["requests"] == 1 and summary["rejected"] == 1
    assert err.count("\n") == 1 and "warning" in err and "'long'" in err


def test_bench_serve_nothing_completed_for_another_cause_exits_1(capsys, monkeypatch):
    from studylib.serving import engine as engine_mod
    from studylib.serving.request import RequestStatus

    def all_aborted(self, requests, progress=False):  # e.g. every request aborted mid-run
        for r in requests:
            r.status, r.stop_reason, r.finished_s = RequestStatus.ABORTED, "abort", 0.0
        return engine_mod.ServingRun(list(requests), 0.0, [], self.config.to_dict(), 0, 0)

    monkeypatch.setattr(engine_mod.Engine, "run", all_aborted)
    code, out, err = run(capsys, *SERVE, "--max-new-tokens", "4", "--json")
    assert code == 1 and out == ""
    assert err.startswith("studylib: error: none of the 3 requests completed") and err.count("\n") == 1


@pytest.mark.parametrize("spec,needle", [("quest:budget=10", "budget=10"), ("quest:budget=100,pages=16", "pages=16"),
                                         ("window", "expected 1")])
def test_generate_bad_attention_pattern(capsys, spec, needle):
    code, out, err = run(capsys, "generate", "--model", "tiny-random", "--attention", spec, "--prompt", "hi")
    assert_one_line_error(code, err, needle, "grammar", "quest:budget=B")
    assert out == ""


def test_generate_with_quest_attention_runs(capsys):
    code, out, err = run(capsys, "generate", "--model", "tiny-random", "--attention", "quest:budget=80,recent=8",
                         "--prompt", "hello " * 40, "--max-new-tokens", "4", "--json")
    assert code == 0, err
    assert json.loads(out.splitlines()[-1])["new_tokens"] == 4


def test_generate_eagle_without_a_trained_head_names_the_command(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    code, out, err = run(capsys, "generate", "--model", "tiny-random", "--method", "speculative", "--draft", "eagle",
                         "--prompt", "hi")
    assert_one_line_error(code, err, "no EAGLE head", "studylib train-draft --kind eagle")
    assert out == ""


@pytest.mark.parametrize("argv, needles", [
    (["--draft", "eagle", "--tree", "5,4"], ["DEPTH,TOPK,NODES"]),
    (["--draft", "eagle", "--tree", "2,2,9"], ["at most"]),
    (["--draft", "distilled", "--tree", "5,4,16"], ["--tree needs --draft eagle"]),
    (["--draft", "eagle", "--tree", "5,4,16", "--gamma", "4"], ["not both"]),
    (["--draft", "eagle", "--gamma", "adaptive"], ["--gamma K or --tree"]),
])
def test_generate_bad_tree(capsys, argv, needles):
    code, out, err = run(capsys, "generate", "--model", "tiny-random", "--method", "speculative", *argv,
                         "--prompt", "hi")
    assert_one_line_error(code, err, *needles)
    assert out == ""


@pytest.mark.parametrize("argv, needles", [
    (["--unroll", "3"], ["unroll in 1..2"]),
    (["--steps", "50"], ["--steps is a distilled-draft option", "--eagle-steps"]),
])
def test_train_draft_eagle_bad_option(capsys, argv, needles):
    code, _, err = run(capsys, "train-draft", "--kind", "eagle", "--model", "tiny-random", *argv)
    assert_one_line_error(code, err, *needles)

"""Bad input gets one clear line on stderr and a non-zero exit, never a traceback."""

from __future__ import annotations

import json

import pytest
import torch

from studylib.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_clean_error(code, err, *needles):
    assert code != 0
    assert "Traceback" not in err
    assert err.startswith("studylib: error:") and err.count("\n") == 1
    for n in needles:
        assert n in err


def test_generate_json_record(capsys, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "prompt": "hi"}\n{"id": "b", "messages": [{"role": "user", "content": "yo"}]}\n')
    code, out, err = run(capsys, "generate", "--model", "tiny-random", "--prompts", str(f),
                         "--max-new-tokens", "5", "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["id"] for r in rows] == ["a", "b"]
    for r in rows:
        assert r["method"] == "ar" and r["model"] == "tiny-random" and r["random_weights"] is True
        for key in ("token_ids", "text", "new_tokens", "target_forwards", "steps", "accepted_lengths",
                    "ttft_s", "wall_s"):
            assert key in r
        assert r["new_tokens"] == len(r["token_ids"]) <= 5


def test_unknown_model(capsys):
    code, _, err = run(capsys, "generate", "--model", "no-such-model", "--prompt", "x")
    assert_clean_error(code, err, "no-such-model", "supported")


def test_unknown_method(capsys):
    code, _, err = run(capsys, "generate", "--model", "tiny-random", "--method", "telepathy", "--prompt", "x")
    assert_clean_error(code, err, "telepathy")


def test_option_for_wrong_method(capsys):
    code, _, err = run(capsys, "generate", "--model", "tiny-random", "--gamma", "4", "--prompt", "x")
    assert_clean_error(code, err, "--gamma")


@pytest.mark.parametrize("content, needle", [
    ("{not json\n", "not valid JSON"),
    ('{"prompt": "no id"}\n', "no 'id'"),
    ('{"id": 1}\n', "exactly one of"),
    ('{"id": 1, "messages": "text"}\n', "'messages' must be"),
    ('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n', "repeats id"),
])
def test_malformed_prompts_file(capsys, tmp_path, content, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    code, _, err = run(capsys, "generate", "--model", "tiny-random", "--prompts", str(f))
    assert_clean_error(code, err, needle, str(f))


def test_prompt_longer_than_context(capsys):
    code, _, err = run(capsys, "generate", "--model", "tiny-random", "--prompt", "x" * 5000)
    assert_clean_error(code, err, "context window")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu(capsys):
    code, _, err = run(capsys, "generate", "--model", "tiny-random", "--device", "cuda", "--prompt", "x")
    assert_clean_error(code, err, "CUDA", "--device cpu")


def test_float16_on_cpu_is_refused(capsys):
    code, _, err = run(capsys, "generate", "--model", "tiny-random", "--dtype", "float16", "--prompt", "x")
    assert_clean_error(code, err, "bfloat16")

"""train-draft's work files (data.pt, ckpt.pt) hold plain tensors and containers only, so they load
with torch.load(weights_only=True); files of the older format (pickled Sequence objects) still load."""

from __future__ import annotations

import pytest
import torch

from studylib.drafting import train as draft_train
from studylib.drafting.data import Sequence
from studylib.drafting.train import DraftTrainConfig, train_draft


def test_work_files_load_with_weights_only(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("STUDYLIB_CACHE", str(tmp_path))
    model, tok = tiny
    cfg = DraftTrainConfig(model="tiny-random", layers=1, sources=("self",), self_prompts=2, samples=0,
                           gen_tokens=4, steps=2, save_every=1, head_vocab=0, max_minutes=5)
    meta = train_draft(cfg, (model, tok))
    work = draft_train.work_dir(model.config.name)
    # No allow-listed classes here: what train-draft saves must be loadable by the strict loader as is.
    data = torch.load(work / "data.pt", weights_only=True)
    assert data["seqs"] and all(isinstance(s, dict) and isinstance(s["ids"], torch.Tensor) for s in data["seqs"])
    ckpt = torch.load(work / "ckpt.pt", weights_only=True)
    assert ckpt["step"] == 2 and ckpt["keep"] == meta["init_layers"]
    again = train_draft(cfg, (model, tok))  # resumes both files: no new data, no new steps
    assert again["steps_done"] == 2 and again["history"] == meta["history"]
    assert again["sequences"] == meta["sequences"]


class NotAllowed:
    pass


def test_old_format_data_file_still_loads_and_nothing_else_does(tmp_path):
    seq = Sequence(torch.arange(6), 2, torch.zeros(4, 3, dtype=torch.int32), torch.zeros(4, 3, dtype=torch.float16))
    old = tmp_path / "old.pt"
    torch.save({"key": "k", "prompts": [[5, 6]], "done": 1, "seqs": [seq]}, old)
    state = draft_train._load_work(old)
    [back] = draft_train._seqs_from_plain(state["seqs"])
    assert isinstance(back, Sequence) and back.prompt_len == 2 and torch.equal(back.ids, seq.ids)

    bad = tmp_path / "bad.pt"
    torch.save({"x": NotAllowed()}, bad)  # any other pickled class is refused
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        draft_train._load_work(bad)

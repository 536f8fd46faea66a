"""The GGUF tensor index reads exactly the bytes gguf's own reader does, without parsing the metadata, and
says what is wrong with a file that is not a whole GGUF."""

from __future__ import annotations

import numpy as np
import pytest

from studylib.errors import StudylibError
from studylib.models.gguf_index import tensor_blocks, tensor_index


@pytest.fixture(scope="module")
def embedded():
    from studylib.models.hub import smollm2_gguf

    return smollm2_gguf()


def test_every_tensor_matches_ggufs_own_reader_byte_for_byte(embedded):
    import gguf

    index = tensor_index(embedded)
    tensors = gguf.GGUFReader(str(embedded)).tensors
    assert set(index) == {t.name for t in tensors}
    for t in tensors:
        info = index[t.name]
        ours, theirs = tensor_blocks(embedded, info), np.array(t.data)
        assert info.fmt == t.tensor_type.name.lower() and info.shape == tuple(int(d) for d in t.shape)
        assert ours.tobytes() == theirs.tobytes(), t.name
        if theirs.dtype == np.uint8:  # block formats: (rows, bytes per row), as the engine takes them
            assert ours.shape == theirs.shape
    assert {i.fmt for i in index.values()} >= {"q4_1", "q8_0"}  # the embedded file's linears and embedding


def test_a_file_that_is_not_a_whole_gguf_gets_one_error_naming_it(tmp_path, embedded):
    plain = tmp_path / "model.bin"
    plain.write_bytes(b"not a gguf file at all")
    with pytest.raises(StudylibError, match="not a GGUF file"):
        tensor_index(plain)
    data = embedded.read_bytes()
    cut = tmp_path / "cut.gguf"
    for at in (6, 24, 4096, 500_000, 1_500_000, len(data) - 100):  # header, metadata, tensor infos, data
        cut.write_bytes(data[:at])
        with pytest.raises(StudylibError, match="GGUF|truncated"):
            tensor_index(cut)

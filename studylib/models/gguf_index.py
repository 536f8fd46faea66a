"""The tensors of a GGUF file, found without parsing its metadata.

``gguf.GGUFReader`` builds a Python object for every metadata value, the tokenizer's 49k-entry vocabulary
and merges included: about 6 s of every load of the embedded model on a 2-core CPU, in every chapter and
every whole run (a fresh process each), for values the engine never reads. The layout (GGUF v2/v3, little
endian: header, key-value pairs, tensor infos, padding to ``general.alignment``, tensor data) lets us step
over the values by their lengths and read only the tensor infos, in a few milliseconds.

``tensor_index`` returns each tensor's block format, shape and byte range; ``tensor_blocks`` its bytes as
(rows, bytes per row) uint8, exactly what ``GGUFReader``'s ``tensor.data`` holds for a block format (the test
compares the two on the embedded file, byte for byte).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from studylib.errors import StudylibError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# metadata value types (GGUF spec): fixed sizes in bytes; 8 = string, 9 = array
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY, _UINT32 = 8, 9, 4


@dataclass(frozen=True)
class TensorInfo:
    name: str
    fmt: str  # the block format's name, lower case ("q4_1", "q8_0", "f32", ...)
    shape: tuple[int, ...]  # GGUF order: the innermost (row length) first, as GGUFReader's ``tensor.shape``
    offset: int  # absolute byte offset in the file
    nbytes: int
    bytes_per_row: int


class _Cursor:
    def __init__(self, buf, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str):
        try:
            vals = struct.unpack_from(fmt, self.buf, self.pos)
        except struct.error:
            raise StudylibError(f"{self.path} ends inside its header: it is not a whole GGUF file; fetch it "
                                "again (delete it from the cache).") from None
        self.pos += struct.calcsize(fmt)
        return vals[0] if len(vals) == 1 else vals

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise StudylibError(f"{self.path} ends inside its header: it is not a whole GGUF file; fetch it "
                                "again (delete it from the cache).")
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def skip_value(self, vtype: int) -> None:
        if vtype in _FIXED:
            self.pos += _FIXED[vtype]
        elif vtype == _STRING:
            n = self.take("<Q")  # (``self.pos += self.take(...)`` would read pos before take moves it)
            self.pos += n
        elif vtype == _ARRAY:
            itype, count = self.take("<I"), self.take("<Q")
            if itype in _FIXED:
                self.pos += _FIXED[itype] * count
            else:
                for _ in range(count):
                    self.skip_value(itype)
        else:
            raise StudylibError(f"{self.path}: unknown GGUF value type {vtype}; the file is damaged or newer "
                                "than this reader (GGUF v2/v3).")


def tensor_index(path: str | Path) -> dict[str, TensorInfo]:
    """Name -> ``TensorInfo`` for every tensor of the GGUF file at ``path``."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        if bytes(buf[:4]) != MAGIC:
            raise StudylibError(f"{path} is not a GGUF file (no GGUF magic); give the model's .gguf file.")
        cur.pos = 4
        version, n_tensors, n_kv = cur.take("<I"), cur.take("<Q"), cur.take("<Q")
        if version not in (2, 3):
            raise StudylibError(f"{path} is GGUF version {version}; this reader knows versions 2 and 3.")
        alignment = DEFAULT_ALIGNMENT
        for _ in range(n_kv):
            key, vtype = cur.string(), cur.take("<I")
            if key == "general.alignment" and vtype == _UINT32:
                alignment = cur.take("<I")
            else:
                cur.skip_value(vtype)
        infos = []
        for _ in range(n_tensors):
            name = cur.string()
            dims = tuple(int(d) for d in (cur.take("<Q") for _ in range(cur.take("<I"))))
            ttype, offset = cur.take("<I"), cur.take("<Q")
            infos.append((name, dims, ttype, offset))
        if cur.pos > len(buf):
            raise StudylibError(f"{path} ends inside its header: it is not a whole GGUF file; fetch it again.")
        data_start = -(-cur.pos // alignment) * alignment
        size = len(buf)
    out = {}
    for name, dims, ttype, offset in infos:
        qtype = GGMLQuantizationType(ttype)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        row = dims[0] // block * block_bytes
        nbytes = row * int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else row
        start = data_start + offset
        if start + nbytes > size:
            raise StudylibError(f"{path}: tensor {name!r} runs past the end of the file; it is truncated.")
        out[name] = TensorInfo(name, qtype.name.lower(), dims, start, nbytes, row)
    return out


def tensor_blocks(path: str | Path, info: TensorInfo) -> np.ndarray:
    """The tensor's bytes as a (rows, bytes per row) uint8 array (a copy, not a view of the file)."""
    rows = info.nbytes // info.bytes_per_row
    with open(path, "rb") as f:
        f.seek(info.offset)
        data = f.read(info.nbytes)
    return np.frombuffer(data, dtype=np.uint8).reshape(rows, info.bytes_per_row).copy()

"""A byte-level tokenizer for random-weight models, which have no trained vocabulary.

It mimics the small part of the HF tokenizer API the study uses (``__call__``, ``encode``,
``decode``, ``apply_chat_template``, ``eos_token_id``), so decoders never special-case it.
"""

from __future__ import annotations


class ByteTokenizer:
    """Ids 0..2 are <pad>, <bos>, <eos>; bytes map to 3..258; larger ids decode to a placeholder."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2
    offset = 3
    chat_template = "byte"
    name_or_path = "byte-tokenizer"

    def __init__(self, vocab_size: int = 259):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = [b + self.offset for b in text.encode("utf-8")]
        return [self.bos_token_id, *ids] if add_special_tokens else ids

    def __call__(self, text: str, **_: object) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text)}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            if self.offset <= i < self.offset + 256:
                out.append(i - self.offset)
            elif not skip_special_tokens:
                out.extend(f"<{i}>".encode())
        return out.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages, add_generation_prompt: bool = True, tokenize: bool = True, **_):
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "<assistant>"
        return self.encode(text) if tokenize else text

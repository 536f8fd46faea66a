"""Reading prompt files (JSONL) and turning a prompt or chat into token ids."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from studylib.errors import StudylibError


@dataclass
class PromptRecord:
    id: str
    prompt: str | None = None
    messages: list[dict] | None = None
    category: str | None = None
    meta: dict = field(default_factory=dict)


def jsonl_objects(path: Path, kind: str, expect: str):
    """Yield ("file:line", object) for each non-blank line of a JSONL file, with one-line errors for a
    missing file, invalid JSON or a line that is not an object (``expect`` says what it should hold)."""
    if not path.is_file():
        raise StudylibError(f"{kind} file {path} does not exist.")
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise StudylibError(f"{where} is not valid JSON ({exc.msg}); each line must be one JSON object.") from None
        if not isinstance(obj, dict):
            raise StudylibError(f"{where} must be a JSON object with {expect}.")
        yield where, obj


def read_prompts(path: str | Path) -> list[PromptRecord]:
    """Parse a JSONL prompts file: each line has ``id`` plus ``prompt`` (text) or ``messages`` (chat)."""
    path = Path(path)
    records: list[PromptRecord] = []
    seen: set[str] = set()
    for where, obj in jsonl_objects(path, "prompts", "'id' and 'prompt' or 'messages'"):
        if "id" not in obj:
            raise StudylibError(f"{where} has no 'id' field; give each prompt a unique id.")
        rid = str(obj["id"])
        if rid in seen:
            raise StudylibError(f"{where} repeats id {rid!r}; ids must be unique.")
        seen.add(rid)
        prompt, messages = obj.get("prompt"), obj.get("messages")
        if (prompt is None) == (messages is None):
            raise StudylibError(f"{where} needs exactly one of 'prompt' (text) or 'messages' (chat).")
        if prompt is not None and not isinstance(prompt, str):
            raise StudylibError(f"{where}: 'prompt' must be a string.")
        if messages is not None and (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)
        ):
            raise StudylibError(f"{where}: 'messages' must be a non-empty list of {{'role', 'content'}} objects.")
        extra = {k: v for k, v in obj.items() if k not in {"id", "prompt", "messages", "category"}}
        records.append(PromptRecord(rid, prompt, messages, obj.get("category"), extra))
    if not records:
        raise StudylibError(f"prompts file {path} holds no prompts.")
    return records


def encode(tokenizer, record: PromptRecord | str, chat: bool = False) -> list[int]:
    """Token ids for a prompt. Plain text is tokenised as ``tokenizer(text)`` does by default;
    chat messages (or ``chat=True`` on text) go through the model's chat template."""
    if isinstance(record, str):
        record = PromptRecord("prompt", prompt=record)
    if record.messages is not None or chat:
        messages = record.messages or [{"role": "user", "content": record.prompt}]
        if not getattr(tokenizer, "chat_template", None):
            raise StudylibError("this model's tokenizer has no chat template; drop --chat or use 'prompt' text.")
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    return [int(i) for i in tokenizer(record.prompt)["input_ids"]]

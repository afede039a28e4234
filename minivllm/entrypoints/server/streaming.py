"""What both endpoints' streams share: the delta cursor (what each choice has sent) and the
SSE encoding of chunks."""

from __future__ import annotations

import json

from minivllm.outputs import CompletionOutput


class DeltaCursor:
    """What a stream has sent of each choice (keyed by its index in the response): the next
    delta of a choice, once, and nothing after its last."""

    def __init__(self) -> None:
        # key -> characters of text sent, or -1 once the choice's last delta went out
        self._num_chars: dict[int, int] = {}
        self._num_tokens: dict[int, int] = {}

    def is_new(self, key: int) -> bool:
        """Nothing of this choice has been sent yet."""
        return key not in self._num_chars

    def advance(
        self, key: int, choice: CompletionOutput, force: bool = False
    ) -> tuple[str, int] | None:
        """(new text, index of the first new token) of the choice since its last delta, and
        marks them sent; None when there is nothing new to send (unless force) or its last
        delta (the one with a finish_reason) has gone out."""
        num_chars = self._num_chars.get(key, 0)
        if num_chars < 0:
            return None
        num_tokens = self._num_tokens.get(key, 0)
        text = choice.text[num_chars:]
        finished = choice.finish_reason is not None
        if not (text or finished or force or len(choice.token_ids) != num_tokens):
            return None
        self._num_chars[key] = -1 if finished else len(choice.text)
        self._num_tokens[key] = len(choice.token_ids)
        return text, num_tokens


SSE_DONE = "data: [DONE]\n\n"
_encode_str = json.encoder.encode_basestring  # the C encoder: a JSON string, no ASCII escaping


def _json_value(value) -> str:
    """One JSON value; the hot types without json.dumps' per-call encoder set-up."""
    if value is None:
        return "null"
    if value.__class__ is str:
        return _encode_str(value)
    if value.__class__ is int:
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_encode_str(k)}:{_json_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class SSEChunks:
    """The `data: {...}` lines of one stream. The head (id, object, created, model) is the same
    in every chunk: it is serialized once, and a chunk serializes only its choice."""

    def __init__(self, head: dict) -> None:
        self._prefix = f"data: {json.dumps(head, ensure_ascii=False, separators=(',', ':'))[:-1]}"

    def choice(self, choice: dict) -> bytes:
        """The chunk of one choice: {**head, "choices": [choice]}, as bytes for the socket."""
        return f'{self._prefix},"choices":[{_json_value(choice)}]}}\n\n'.encode()

    def last(self, fields: dict) -> bytes:
        """A chunk with other fields after the head (the usage chunk; a chat role chunk with
        the prompt's token ids)."""
        body = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
        return f"{self._prefix},{body[1:]}\n\n".encode()

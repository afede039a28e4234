"""Stored answers of the Responses API (`store: true`, OpenAI's default): for a later request's
`previous_response_id`, and for GET and DELETE /v1/responses/{id}. In memory, bounded: past
max_bytes (`minivllm serve --responses-store-bytes`) the least recently used are dropped. An
entry is kept as its JSON text (UTF-8 bytes), parsed when read, so that the bound is the
memory the entries hold (Python objects of the same answer take several times their text).

Each entry keeps its own turn only (the input's messages and the answer, as chat messages)
and the id of the response before it: a conversation is its chain of turns, so that a long
one costs its length once, not once per turn.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from minivllm.entrypoints.server.errors import APIError


def shown_id(response_id: str, limit: int = 64) -> str:
    """An id as an error message quotes it: at most limit characters of it (a client's id
    may be a megabyte)."""
    if len(response_id) <= limit:
        return repr(response_id)
    return f"{response_id[:limit]!r}... ({len(response_id):,} characters)"


@dataclass(frozen=True)
class StoredResponse:
    data: bytes  # JSON of {"response": the response object, "turn": this turn's messages}
    previous_id: str | None

    @property
    def num_bytes(self) -> int:
        return len(self.data)

    @property
    def response(self) -> dict[str, Any]:
        """The response object, as returned."""
        return json.loads(self.data)["response"]

    @property
    def turn(self) -> list[dict[str, Any]]:
        """This turn's input messages and the answer (chat messages)."""
        return json.loads(self.data)["turn"]


class ResponseStore:
    def __init__(self, max_bytes: int = 64 << 20) -> None:
        if max_bytes < 0:
            raise ValueError("--responses-store-bytes must be >= 0")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._num_bytes = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def put(
        self, response: dict[str, Any], turn: list[dict[str, Any]], previous_id: str | None
    ) -> bool:
        """Stores a finished response; False, and nothing kept, for one larger than the whole
        store (the caller says "store": false in it)."""
        data = json.dumps({"response": response, "turn": turn}, separators=(",", ":")).encode()
        if len(data) > self.max_bytes:
            return False
        entry = StoredResponse(data, previous_id)
        self._entries[response["id"]] = entry
        self._num_bytes += entry.num_bytes
        while self._num_bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._num_bytes -= dropped.num_bytes
        return True

    def get(self, response_id: str) -> StoredResponse:
        """The stored response (now the most recently used), or a 404."""
        entry = self._entries.get(response_id)
        if entry is None:
            raise APIError(
                f"no stored response with id {shown_id(response_id)} (responses are kept in this "
                "server's memory while they fit in --responses-store-bytes)",
                status=404,
            )
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> None:
        entry = self.get(response_id)
        del self._entries[response_id]
        self._num_bytes -= entry.num_bytes

    def conversation(self, response_id: str) -> list[dict[str, Any]]:
        """The chat messages of the conversation that ends with this response's answer, turn
        by turn from its first; a 400 when a turn before it is no longer stored."""
        turns = []
        entry = self.get(response_id)
        while True:
            turns.append(entry.turn)
            if entry.previous_id is None:
                break
            previous = self._entries.get(entry.previous_id)
            if previous is None:
                raise APIError(
                    f"previous_response_id {shown_id(response_id)}: an earlier turn of its "
                    "conversation "
                    f"({entry.previous_id!r}) is no longer stored; send the conversation as input",
                    param="previous_response_id",
                )
            entry = previous
        return [message for turn in reversed(turns) for message in turn]

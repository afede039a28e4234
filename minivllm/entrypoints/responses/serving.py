"""POST /v1/responses (OpenAI's Responses API), served as a chat request (input.py), its
answer as output items, whole or as OpenAI's streamed events (output.py); GET and DELETE
/v1/responses/{id} on the stored answers (store.py)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from minivllm.entrypoints.openai.chat.output import full_message
from minivllm.entrypoints.openai.logprobs import chat_logprobs
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest
from minivllm.entrypoints.openai.serving_chat import ChatRun, start_chat
from minivllm.entrypoints.responses.input import RESPONSES_PARAM, chat_request
from minivllm.entrypoints.responses.output import (
    OutputEvents,
    answer_message,
    new_id,
    output_items,
    response_object,
    response_usage,
)
from minivllm.entrypoints.responses.protocol import ResponsesRequest
from minivllm.entrypoints.server.errors import APIError, renamed
from minivllm.entrypoints.server.serving_common import ServerState, as_api_error, collect
from minivllm.outputs import CompletionOutput, RequestOutput


async def create_response(state: ServerState, req: ResponsesRequest):
    store = state.response_store
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        try:
            history = store.conversation(req.previous_response_id)
        except APIError as e:
            raise APIError(e.message, e.status, "previous_response_id") from None
    chat = chat_request(req, history)
    response_id = new_id("resp")
    try:
        run = await start_chat(state, chat, response_id)
    except APIError as e:  # named as the Responses request names the field
        raise renamed(e, RESPONSES_PARAM) from None
    # This turn's messages: after the instructions and the stored conversation.
    num_before = len(history) + bool(req.instructions)
    turn = [m.model_dump(exclude_none=True) for m in chat.messages[num_before:]]
    answer = _Answer(state, req, chat, response_id, run, turn)
    if req.stream:
        return StreamingResponse(answer.stream(), media_type="text/event-stream")
    (final,) = await collect(run.iterators)  # one prompt, n = 1
    return JSONResponse(await answer.full(final))


def get_response(state: ServerState, response_id: str) -> dict[str, Any]:
    return state.response_store.get(response_id).response


def delete_response(state: ServerState, response_id: str) -> dict[str, Any]:
    state.response_store.delete(response_id)
    return {"id": response_id, "object": "response", "deleted": True}


class _Answer:
    """One request's answer: its response object, whole or streamed, and its stored turn."""

    def __init__(
        self,
        state: ServerState,
        req: ResponsesRequest,
        chat: ChatCompletionRequest,
        response_id: str,
        run: ChatRun,
        turn: list[dict[str, Any]],
    ) -> None:
        self.state = state
        self.req = req
        self.chat = chat
        self.run = run
        self.turn = turn
        self.id = response_id
        self.created_at = int(time.time())
        self.stored = req.store and state.response_store.enabled

    def _logprobs(self, choice: CompletionOutput, start: int) -> list | None:
        if not self.chat.logprobs:
            return None
        token_ids, logprobs = choice.token_ids[start:], (choice.logprobs or [])[start:]
        return chat_logprobs(token_ids, logprobs, self.run.top)["content"]

    async def full(self, output: RequestOutput) -> dict[str, Any]:
        (choice,) = output.outputs
        message, _ = full_message(self.run.spec, choice.text, choice.finish_reason)
        items = output_items(message, _status(choice), self._logprobs(choice, 0))
        return await self._finished(output, items)

    async def _finished(self, output: RequestOutput, items: list[dict[str, Any]]) -> dict:
        """The finished response object (stored when asked)."""
        (choice,) = output.outputs
        reasoning = "".join(i["content"][0]["text"] for i in items if i["type"] == "reasoning")
        # The reasoning's tokens are counted by encoding its text (the engine sees one output).
        num_reasoning = len(await self.state.engine.encode(reasoning, False)) if reasoning else 0
        usage = response_usage(
            len(output.prompt_token_ids), output.num_cached_tokens, len(choice.token_ids),
            num_reasoning,
        )  # fmt: skip
        status = _status(choice)
        error = None
        if status == "failed":  # the engine failed this request alone (its grammar)
            error = {"code": "server_error", "message": choice.stop_reason or "the request failed"}
        response = self._object(status, items, usage, error)
        if self.stored:
            turn = self.turn + [answer_message(items)]
            store = self.state.response_store
            if not store.put(response, turn, self.req.previous_response_id):
                response["store"] = False  # larger than --responses-store-bytes: not kept
        return response

    def _object(self, status: str, items: list, usage=None, error=None) -> dict[str, Any]:
        return response_object(
            self.req, self.id, self.state.model_name, self.created_at, status, items, usage,
            error, self.stored,
        )  # fmt: skip

    async def stream(self) -> AsyncIterator[bytes]:
        events = OutputEvents(with_logprobs=self.chat.logprobs)
        sequence = _Sequence()
        yield sequence.event(
            {"type": "response.created", "response": self._object("in_progress", [])}
        )
        yield sequence.event(
            {"type": "response.in_progress", "response": self._object("in_progress", [])}
        )
        try:
            async for output, fields, start in self.run.deltas():
                (choice,) = output.outputs
                body = b"".join(
                    sequence.event(e) for e in events.feed(fields, self._logprobs(choice, start))
                )
                if choice.finish_reason is not None:
                    body += b"".join(sequence.event(e) for e in events.finish(_status(choice)))
                    response = await self._finished(output, events.items)
                    kind = _FINAL_EVENTS.get(response["status"], "response.failed")
                    body += sequence.event({"type": kind, "response": response})
                if body:
                    yield body
        except Exception as e:  # noqa: BLE001 - after the 200 an error is an event
            error = as_api_error(e)
            code = "server_error" if error.status >= 500 else "invalid_prompt"
            failed = self._object(
                "failed", events.items, error={"code": code, "message": error.message}
            )
            yield sequence.event({"type": "response.failed", "response": failed})


# A choice's finish reason as the response's status (the others: "completed").
_STATUS = {"length": "incomplete", "error": "failed", "abort": "cancelled"}


def _status(choice: CompletionOutput) -> str:
    return _STATUS.get(choice.finish_reason, "completed")


# The last event of a stream, by the response's status (failed or cancelled: response.failed).
_FINAL_EVENTS = {"completed": "response.completed", "incomplete": "response.incomplete"}


class _Sequence:
    """Numbers a stream's events (sequence_number) and writes each as an SSE event."""

    def __init__(self) -> None:
        self.next = 0

    def event(self, event: dict[str, Any]) -> bytes:
        event = {**event, "sequence_number": self.next}
        self.next += 1
        data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
        return f"event: {event['type']}\ndata: {data}\n\n".encode()

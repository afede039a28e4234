"""POST /v1/messages (Anthropic's Messages API), served as a chat request (input.py), its
answer as content blocks, whole or as Anthropic's streamed events (output.py); and POST
/v1/messages/count_tokens. Errors are in Anthropic's shape."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from minivllm.entrypoints.anthropic.input import MESSAGES_PARAM, chat_request
from minivllm.entrypoints.anthropic.output import (
    BlockEvents,
    content_blocks,
    error_body,
    stop_reason,
)
from minivllm.entrypoints.anthropic.protocol import CountTokensRequest, MessagesRequest
from minivllm.entrypoints.openai.chat.output import full_message
from minivllm.entrypoints.openai.chat.template import render_chat
from minivllm.entrypoints.openai.params import check_model
from minivllm.entrypoints.openai.serving_chat import ChatRun, start_chat
from minivllm.entrypoints.server.errors import APIError, ErrorResponse, renamed
from minivllm.entrypoints.server.serving_common import (
    ServerState,
    as_api_error,
    collect,
)
from minivllm.outputs import RequestOutput


def anthropic_error(error: APIError) -> ErrorResponse:
    return ErrorResponse(error_body(error.message, error.status), error.status, error.headers)


async def create_message(state: ServerState, req: MessagesRequest):
    chat = chat_request(req)
    message_id = f"msg_{uuid.uuid4().hex}"
    try:
        run = await start_chat(state, chat, message_id)
    except APIError as e:  # named as the Messages request names the field
        raise renamed(e, MESSAGES_PARAM) from None
    answer = _Answer(state, message_id, run)
    if req.stream:
        return StreamingResponse(answer.stream(), media_type="text/event-stream")
    (final,) = await collect(run.iterators)  # one prompt, n = 1
    return JSONResponse(answer.full(final))


async def count_tokens(state: ServerState, req: CountTokensRequest) -> dict[str, int]:
    """The prompt's token count, rendered as /v1/messages renders it (tools included)."""
    chat = chat_request(req)
    check_model(chat.model, state.served_model_names)
    token_ids = await render_chat(
        state.engine, state.chat_template, chat.messages, chat.tools, chat.template_kwargs()
    )
    return {"input_tokens": len(token_ids)}


class _Answer:
    def __init__(self, state: ServerState, message_id: str, run: ChatRun) -> None:
        self.run = run
        self.head = {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": state.model_name,
        }

    def _usage(self, output: RequestOutput | None) -> dict[str, int]:
        num_output = len(output.outputs[0].token_ids) if output is not None else 0
        cached = output.num_cached_tokens if output is not None else 0
        return {
            "input_tokens": len(self.run.prompt_token_ids),
            "output_tokens": num_output,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
        }

    def full(self, output: RequestOutput) -> dict[str, Any]:
        (choice,) = output.outputs
        if choice.finish_reason == "error":  # the engine failed this request alone
            raise APIError(f"the request failed: {choice.stop_reason}", status=500)
        message, _ = full_message(self.run.spec, choice.text, choice.finish_reason)
        reason, sequence = stop_reason(choice, bool(message["tool_calls"]))
        return {
            **self.head,
            "content": content_blocks(message),
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": self._usage(output),
        }

    async def stream(self) -> AsyncIterator[bytes]:
        start = {**self.head, "content": [], "stop_reason": None, "stop_sequence": None}
        yield _event({"type": "message_start", "message": {**start, "usage": self._usage(None)}})
        blocks = BlockEvents()
        try:
            async for output, fields, _ in self.run.deltas():
                (choice,) = output.outputs
                if choice.finish_reason == "error":
                    raise APIError(f"the request failed: {choice.stop_reason}", status=500)
                events = blocks.feed(fields)
                if choice.finish_reason is not None:
                    events += blocks.finish()
                    reason, sequence = stop_reason(choice, blocks.called)
                    usage = {"output_tokens": len(choice.token_ids)}
                    delta_fields = {"stop_reason": reason, "stop_sequence": sequence}
                    events.append({"type": "message_delta", "delta": delta_fields, "usage": usage})
                    events.append({"type": "message_stop"})
                if events:
                    yield b"".join(_event(e) for e in events)
        except Exception as e:  # noqa: BLE001 - after the 200 an error is an event
            error = as_api_error(e)
            yield _event(error_body(error.message, error.status))


def _event(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()

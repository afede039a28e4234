"""POST /v1/chat/completions: messages through the chat template, n samples, streamed or not."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from minivllm.entrypoints.async_tokenizer import TokenizerClosedError
from minivllm.entrypoints.openai.errors import APIError, sse_error
from minivllm.entrypoints.openai.logprobs import chat_logprobs
from minivllm.entrypoints.openai.params import check_model, sampling_params
from minivllm.entrypoints.openai.protocol import MAX_LOGPROBS, ChatCompletionRequest, ChatMessage
from minivllm.entrypoints.openai.serving_common import (
    ServerState,
    as_api_error,
    check_num_completions,
    collect,
    response_head,
    submit,
    tokenize_text,
    usage,
)
from minivllm.entrypoints.openai.streaming import SSE_DONE, DeltaCursor, SSEChunks
from minivllm.outputs import CompletionOutput, RequestOutput

# apply_chat_template arguments a request may not set through chat_template_kwargs.
_RESERVED_KWARGS = {
    "conversation",
    "chat_template",
    "tokenize",
    "return_dict",
    "return_tensors",
    "padding",
    "truncation",
    "max_length",
    "tokenizer_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "tools",
    "documents",
}


def _content_text(message: ChatMessage) -> str:
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError("only text content parts are supported", param="messages")
        texts.append(part["text"])
    return "\n".join(texts)


def _render(tokenizer, messages: list[ChatMessage], **template_kwargs) -> str:
    """The conversation as text (on a tokenizer thread: all of it is per-message work)."""
    conversation = [{"role": m.role, "content": _content_text(m)} for m in messages]
    return tokenizer.apply_chat_template(conversation, **template_kwargs)


async def render_chat(
    engine,
    chat_template: str | None,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    continue_final_message: bool,
    template_kwargs: dict[str, Any] | None,
) -> list[int]:
    """Prompt token ids of a conversation (rendered to text on a tokenizer thread: a template
    over 10^5 messages takes seconds of Python; then tokenized without adding special tokens,
    as vLLM does); engine: the AsyncLLM (its tokenizer)."""
    tokenizer = engine.tokenizer
    kwargs = dict(template_kwargs or {})
    bad = sorted(set(kwargs) & _RESERVED_KWARGS)
    if bad:
        raise APIError(f"chat_template_kwargs may not set {bad}", param="chat_template_kwargs")
    if chat_template is None and tokenizer.chat_template is None:
        raise APIError("this model has no chat template; start the server with --chat-template")
    render = partial(
        _render,
        tokenizer,
        messages,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
        continue_final_message=continue_final_message,
        tokenize=False,
        **kwargs,
    )
    try:
        text = await engine.async_tokenizer.run(render)
    except APIError:
        raise
    except TokenizerClosedError:
        raise APIError("the server is shutting down", status=503) from None
    except Exception as e:  # noqa: BLE001 - template errors are the request's fault
        raise APIError(f"the chat template failed on these messages: {e}") from None
    return await tokenize_text(engine, text, add_special_tokens=False, param="messages")


async def create_chat_completion(state: ServerState, req: ChatCompletionRequest):
    check_model(req.model, state.served_model_names)
    if req.chat_template is not None:
        raise APIError(
            "chat_template in a request is not accepted; the server's --chat-template is used",
            param="chat_template",
        )
    check_num_completions(state.limits, 1, req.n)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    top = req.top_logprobs if req.logprobs else None
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise APIError(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", param="top_logprobs")
    engine = state.engine
    token_ids = await render_chat(
        engine,
        state.chat_template,
        req.messages,
        req.add_generation_prompt,
        req.continue_final_message,
        req.chat_template_kwargs,
    )
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else None
    max_tokens = req.max_tokens if max_tokens is None else max_tokens
    params = sampling_params(
        req,
        engine.default_sampling(),
        len(token_ids),
        engine.max_model_len,
        max_tokens,
        (top or 0) if req.logprobs else None,
    )
    request_id = f"chatcmpl-{uuid.uuid4().hex}"
    iterators = await submit(state, request_id, [(None, token_ids, params)])
    response = _ChatResponse(state, req, request_id, top or 0)
    if req.stream:
        return StreamingResponse(response.stream(iterators), media_type="text/event-stream")
    (final,) = await collect(iterators)  # a chat request is one prompt
    return JSONResponse(response.full(final))


class _ChatResponse:
    def __init__(
        self, state: ServerState, req: ChatCompletionRequest, request_id: str, top: int
    ) -> None:
        self.req = req
        self.top = top
        self.head = response_head(request_id, "chat.completion", state.model_name)

    def _logprobs(self, choice: CompletionOutput, start: int) -> dict | None:
        if not self.req.logprobs:
            return None
        return chat_logprobs(choice.token_ids[start:], (choice.logprobs or [])[start:], self.top)

    def full(self, output: RequestOutput) -> dict:
        choices = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text, "tool_calls": []},
                "logprobs": self._logprobs(c, 0),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in output.outputs
        ]
        return {**self.head, "choices": choices, "usage": usage([output])}

    async def stream(self, iterators: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[bytes]:
        chunks = SSEChunks({**self.head, "object": "chat.completion.chunk"})
        cursor = DeltaCursor()
        final = None
        try:
            # The role comes first, as in OpenAI and vLLM.
            yield b"".join(
                chunks.choice(
                    {
                        "index": index,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                )
                for index in range(self.req.n)
            )
            (iterator,) = iterators  # a chat request is one prompt: read it directly
            async for output in iterator:
                final = output
                body = b""  # all choices of one output in one socket write
                for choice in output.outputs:
                    chunk = self._chunk(choice, cursor)
                    if chunk is not None:
                        body += chunks.choice(chunk)
                if body:
                    yield body
            opts = self.req.stream_options
            if opts is not None and opts.include_usage:
                yield chunks.last({"choices": [], "usage": usage([final])})
        except Exception as e:  # noqa: BLE001 - after the 200 an error is a data chunk
            yield sse_error(as_api_error(e))
        yield SSE_DONE

    def _chunk(self, choice: CompletionOutput, cursor: DeltaCursor) -> dict | None:
        delta = cursor.advance(choice.index, choice)
        if delta is None:
            return None
        text, start_tokens = delta
        return {
            "index": choice.index,
            "delta": {"content": text} if text or choice.finish_reason is None else {},
            "logprobs": self._logprobs(choice, start_tokens),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }

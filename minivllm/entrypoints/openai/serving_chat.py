"""POST /v1/chat/completions: messages through the chat template, n samples, streamed or not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse

from minivllm.entrypoints.chat_messages import content_text
from minivllm.entrypoints.openai.chat.output import (
    ChatOutputSpec,
    ChoiceParser,
    full_message,
    one_delta_per_call,
    output_spec,
    tool_mode,
)
from minivllm.entrypoints.openai.chat.template import render_chat_text
from minivllm.entrypoints.openai.constraints import check_constraint, request_constraint
from minivllm.entrypoints.openai.logprobs import chat_logprobs, prompt_logprobs
from minivllm.entrypoints.openai.params import (
    check_model,
    check_unimplemented,
    sampling_params,
    truncate_prompt,
)
from minivllm.entrypoints.openai.protocol import (
    MAX_LOGPROBS,
    ChatCompletionRequest,
)
from minivllm.entrypoints.openai.routed_experts import (
    RoutedExpertsCursor,
    check_routed_experts,
    encode_routed_experts,
    sends_routed_experts,
)
from minivllm.entrypoints.parsers.reasoning.constraint import (
    after_reasoning,
    has_special_markers,
    reasoning_start,
)
from minivllm.entrypoints.server.errors import APIError, sse_error
from minivllm.entrypoints.server.serving_common import (
    ServerState,
    as_api_error,
    check_num_completions,
    collect,
    request_ids,
    response_head,
    submit,
    tokenize_text,
    usage,
)
from minivllm.entrypoints.server.streaming import SSE_DONE, DeltaCursor, SSEChunks
from minivllm.outputs import CompletionOutput, RequestOutput


@dataclass
class ChatRun:
    """A chat request in the engine: what its response is built from."""

    iterators: list[AsyncIterator[RequestOutput]]
    spec: ChatOutputSpec  # how each choice's text is parsed
    prompt_token_ids: list[int]
    top: int  # top logprobs per token (0 without logprobs)

    async def deltas(self) -> AsyncIterator[tuple[RequestOutput, dict[str, Any], int]]:
        """(output, delta fields, index of the delta's first token) as its one choice grows:
        the fields are the chat parser's ({"reasoning", "content", "tool_calls"}), for APIs
        that stream their own events (responses/, anthropic/)."""
        parser = ChoiceParser(self.spec) if self.spec.parses else None
        cursor = DeltaCursor()
        (iterator,) = self.iterators
        async for output in iterator:
            (choice,) = output.outputs
            delta = cursor.advance(0, choice)
            if delta is None:
                continue
            text, start = delta
            final = choice.finish_reason is not None
            fields = {"content": text} if parser is None else parser.feed(text, final=final)
            yield output, fields, start


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, header_id: str | None = None
):
    """header_id: the request's X-Request-Id (it wins over the body's request_id, as vLLM)."""
    response_id, engine_id = request_ids("chatcmpl", header_id or req.request_id)
    run = await start_chat(state, req, engine_id)
    response = _ChatResponse(state, req, response_id, run)
    if req.stream:
        return StreamingResponse(response.stream(run.iterators), media_type="text/event-stream")
    (final,) = await collect(run.iterators)  # a chat request is one prompt
    return JSONResponse(response.full(final))


async def start_chat(state: ServerState, req: ChatCompletionRequest, request_id: str) -> ChatRun:
    """Checks the request, renders its messages, and submits it (the Responses API's requests
    come here too, as chat requests: responses/input.py)."""
    check_model(req.model, state.served_model_names)
    if req.chat_template is not None:
        raise APIError(
            "chat_template in a request is not accepted; the server's --chat-template is used",
            param="chat_template",
        )
    check_unimplemented(req)
    check_num_completions(state.limits, 1, req.n)
    check_routed_experts(req.return_routed_experts, state.engine.config)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs needs logprobs: true", param="top_logprobs")
    top = req.top_logprobs if req.logprobs else None
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise APIError(f"top_logprobs must be between 0 and {MAX_LOGPROBS}", param="top_logprobs")
    engine = state.engine
    mode, tool_schema = tool_mode(req, state.tool_parser)
    constraint = request_constraint(req, tool_schema)
    template_kwargs = req.template_kwargs()
    prompt = await render_chat_text(
        engine,
        state.chat_template,
        req.messages,
        req.add_generation_prompt,
        req.continue_final_message,
        template_kwargs,
        req.tools,
        documents=req.documents,
    )
    token_ids = await tokenize_text(
        engine,
        prompt,
        add_special_tokens=req.add_special_tokens,  # False: the template writes them
        param="messages",
        truncated=req.truncate_prompt_tokens is not None,
    )
    # The constraint as asked first (its errors name what the request sent), then as it
    # holds: after the reasoning, when the model thinks first.
    await check_constraint(engine, constraint)
    start = reasoning_start(state.reasoning_parser, prompt, template_kwargs)
    if constraint is not None and start != "off":
        special = has_special_markers(engine.tokenizer)
        constraint = (constraint[0], after_reasoning(constraint[1], start, special))
        await check_constraint(engine, constraint)
    spec = output_spec(req, mode, state.tool_parser, state.reasoning_parser, start)
    max_tokens = req.max_tokens if req.max_completion_tokens is None else req.max_completion_tokens
    token_ids = truncate_prompt(
        token_ids,
        req.truncate_prompt_tokens,
        engine.max_model_len,
        max_tokens,
        engine.tokenizer.truncation_side,
    )
    params = sampling_params(
        req,
        engine.default_sampling(),
        len(token_ids),
        engine.max_model_len,
        max_tokens,
        (top or 0) if req.logprobs else None,
        prompt_logprobs=req.prompt_logprobs,
        structured_outputs=constraint[1] if constraint is not None else None,
    )
    iterators = await submit(
        state, request_id, [(None, token_ids, params)], req.cache_salt, req.priority
    )
    return ChatRun(iterators, spec, token_ids, top or 0)


class _ChatResponse:
    def __init__(
        self,
        state: ServerState,
        req: ChatCompletionRequest,
        request_id: str,
        run: ChatRun,
    ) -> None:
        self.req = req
        self.run = run
        self.parsers: dict[int, ChoiceParser] = {}
        self.head = response_head(request_id, "chat.completion", state.model_name)
        self.echo = _echoed(req)
        self.routed = sends_routed_experts(req.return_routed_experts)

    def _logprobs(self, choice: CompletionOutput, start: int) -> dict | None:
        if not self.req.logprobs:
            return None
        token_ids, logprobs = choice.token_ids[start:], (choice.logprobs or [])[start:]
        return chat_logprobs(token_ids, logprobs, self.run.top, self.req.return_tokens_as_token_ids)

    def full(self, output: RequestOutput) -> dict:
        choices = []
        for c in output.outputs:
            message, finish_reason = full_message(self.run.spec, c.text, c.finish_reason)
            if self.echo:
                message["content"] = self.echo + (message["content"] or "")
            choices.append(
                {
                    "index": c.index,
                    "message": message,
                    "logprobs": self._logprobs(c, 0),
                    "finish_reason": finish_reason,
                    "stop_reason": c.stop_reason,
                }
            )
            if self.req.return_token_ids:
                choices[-1]["token_ids"] = c.token_ids
            if self.routed and c.routed_experts is not None:  # vLLM's field
                choices[-1]["routed_experts"] = encode_routed_experts(c.routed_experts)
        body = {**self.head, "choices": choices, "usage": usage([output])}
        if self.req.return_token_ids:  # vLLM's field, on the response
            body["prompt_token_ids"] = self.run.prompt_token_ids
        if self.req.prompt_logprobs is not None:  # vLLM's field, on the response
            body["prompt_logprobs"] = prompt_logprobs(
                output.prompt_token_ids, output.prompt_logprobs, self.req.prompt_logprobs
            )
        return body

    async def stream(self, iterators: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[bytes]:
        chunks = SSEChunks({**self.head, "object": "chat.completion.chunk"})
        cursor = DeltaCursor()
        routed = RoutedExpertsCursor() if self.routed else None
        final = None
        try:
            # The role comes first, as in OpenAI and vLLM (with the prompt's ids, as vLLM's).
            roles = [
                {
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
                for index in range(self.req.n)
            ]
            if self.req.return_token_ids:
                ids = self.run.prompt_token_ids
                yield b"".join(
                    chunks.last({"choices": [r], "prompt_token_ids": ids}) for r in roles
                )
            else:
                yield b"".join(chunks.choice(r) for r in roles)
            if self.echo:  # the continued message's text first, as vLLM streams it
                yield b"".join(chunks.choice({**r, "delta": {"content": self.echo}}) for r in roles)
            (iterator,) = iterators  # a chat request is one prompt: read it directly
            async for output in iterator:
                final = output
                body = b""  # all choices of one output in one socket write
                for choice in output.outputs:
                    for chunk in self._chunks(choice, cursor, routed):
                        body += chunks.choice(chunk)
                if body:
                    yield body
            opts = self.req.stream_options
            if opts is not None and opts.include_usage:
                yield chunks.last({"choices": [], "usage": usage([final])})
        except Exception as e:  # noqa: BLE001 - after the 200 an error is a data chunk
            yield sse_error(as_api_error(e))
        yield SSE_DONE

    def _chunks(
        self, choice: CompletionOutput, cursor: DeltaCursor, routed: RoutedExpertsCursor | None
    ) -> list[dict]:
        """The choice's new output as stream chunks: none, one, or more where a call's header
        and arguments came together (`one_delta_per_call`); the logprobs, token ids and routed
        experts go with the first, the finish reason with the last."""
        delta = cursor.advance(choice.index, choice)
        if delta is None:
            return []
        text, start_tokens = delta
        finish_reason = choice.finish_reason
        if not self.run.spec.parses:  # plain text (kept as it was: a content delta every time)
            fields = {"content": text} if text or finish_reason is None else {}
        else:
            parser = self.parsers.get(choice.index)
            if parser is None:
                parser = self.parsers[choice.index] = ChoiceParser(self.run.spec)
            fields = parser.feed(text, final=finish_reason is not None)
            if finish_reason is not None:
                finish_reason = parser.finish_reason(finish_reason)
            elif not fields:
                if not (self.req.logprobs or self.req.return_token_ids):
                    return []  # all held back (the first characters of a tag)
                fields = {"content": ""}  # the chunk carries this delta's logprobs or ids
        parts = one_delta_per_call(fields)
        chunks = [
            {"index": choice.index, "delta": part, "logprobs": None, "finish_reason": None,
             "stop_reason": None}
            for part in parts
        ]  # fmt: skip
        chunks[0]["logprobs"] = self._logprobs(choice, start_tokens)
        if self.req.return_token_ids:  # as vLLM streams them: each delta's own ids
            chunks[0]["token_ids"] = choice.token_ids[start_tokens:]
        if routed is not None and (rows := routed.delta(choice.index, choice)) is not None:
            chunks[0]["routed_experts"] = rows  # held-back text's rows ride the next chunk
        chunks[-1].update(finish_reason=finish_reason, stop_reason=choice.stop_reason)
        return chunks


def _echoed(req: ChatCompletionRequest) -> str:
    """What echo puts before the reply: the last message's text when it is the assistant's."""
    last = req.messages[-1]
    if not req.echo or last.role != "assistant":
        return ""
    return content_text(last.content, f"messages[{len(req.messages) - 1}]")

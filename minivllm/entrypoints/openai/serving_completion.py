"""POST /v1/completions: one or several prompts, n samples each, streamed or not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse

from minivllm.entrypoints.openai.constraints import check_constraint, request_constraint
from minivllm.entrypoints.openai.logprobs import completion_logprobs, prompt_logprobs, top_ranks
from minivllm.entrypoints.openai.params import (
    check_model,
    check_unimplemented,
    sampling_params,
    truncate_prompt,
)
from minivllm.entrypoints.openai.protocol import CompletionRequest
from minivllm.entrypoints.openai.routed_experts import (
    RoutedExpertsCursor,
    check_routed_experts,
    encode_routed_experts,
    sends_routed_experts,
)
from minivllm.entrypoints.server.errors import APIError, sse_error
from minivllm.entrypoints.server.serving_common import (
    ServerState,
    as_api_error,
    check_num_completions,
    collect,
    fair_slices,
    merge,
    request_ids,
    response_head,
    submit,
    tokenize_text,
    usage,
)
from minivllm.entrypoints.server.streaming import SSE_DONE, DeltaCursor, SSEChunks
from minivllm.outputs import CompletionOutput, RequestOutput


async def _prompts(req: CompletionRequest, engine) -> list[tuple[str | None, list[int]]]:
    """(text, token ids) per prompt: a string, a list of strings, ids, or a list of id lists."""
    prompt = req.prompt
    options = dict(
        add_special_tokens=req.add_special_tokens, truncated=req.truncate_prompt_tokens is not None
    )
    if isinstance(prompt, str):
        return [(prompt, await tokenize_text(engine, prompt, **options))]
    if not prompt:
        raise APIError("prompt is empty", param="prompt")
    if isinstance(prompt[0], int):
        return [(None, list(prompt))]
    if isinstance(prompt[0], str):
        ids = await asyncio.gather(*(tokenize_text(engine, p, **options) for p in prompt))
        return list(zip(prompt, ids))
    return [(None, list(p)) for p in prompt]


def _num_prompts(prompt) -> int:
    return 1 if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else len(prompt)


async def create_completion(
    state: ServerState, req: CompletionRequest, header_id: str | None = None
):
    """header_id: the request's X-Request-Id (it wins over the body's request_id, as vLLM)."""
    response_id, engine_id = request_ids("cmpl", header_id or req.request_id)
    check_model(req.model, state.served_model_names)
    check_unimplemented(req)
    check_num_completions(state.limits, _num_prompts(req.prompt), req.n)
    engine = state.engine
    check_routed_experts(req.return_routed_experts, engine.config)
    constraint = request_constraint(req)
    prompts = []
    keep, side = req.truncate_prompt_tokens, engine.tokenizer.truncation_side
    for text, token_ids in await _prompts(req, engine):
        kept = truncate_prompt(token_ids, keep, engine.max_model_len, req.max_tokens, side)
        prompts.append((text if len(kept) == len(token_ids) else None, kept))  # echo: the kept
    await check_constraint(engine, constraint)
    # Prompt tokens' top ranks, for echo's logprobs and prompt_logprobs: the engine scores
    # the larger count, each view keeps its own (logprobs.top_ranks).
    asked = [k for k in (req.logprobs if req.echo else None, req.prompt_logprobs) if k is not None]
    prompt_top = max(asked, default=None)
    specs = []
    async for text, token_ids in fair_slices(prompts):
        params = sampling_params(
            req,
            engine.default_sampling(),
            len(token_ids),
            engine.max_model_len,
            req.max_tokens,
            req.logprobs,
            prompt_logprobs=prompt_top,
            structured_outputs=constraint[1] if constraint is not None else None,
        )
        specs.append((text, token_ids, params))
    iterators = await submit(state, engine_id, specs, req.cache_salt, req.priority)
    response = _Response(state, req, response_id, [t for t, _ in prompts])
    if req.stream:
        return StreamingResponse(response.stream(iterators), media_type="text/event-stream")
    return JSONResponse(response.full(await collect(iterators)))


class _Response:
    """Builds the response body (or its stream chunks) of one completion request."""

    def __init__(
        self, state: ServerState, req: CompletionRequest, request_id: str, texts: list
    ) -> None:
        self.req = req
        self.tokenizer = state.engine.tokenizer
        self.texts = texts
        self.head = response_head(request_id, "text_completion", state.model_name)
        self.routed = sends_routed_experts(req.return_routed_experts)

    def _prompt_text(self, index: int, output: RequestOutput) -> str:
        text = self.texts[index]
        return self.tokenizer.decode(output.prompt_token_ids) if text is None else text

    def _logprobs(self, output: RequestOutput, choice: CompletionOutput, start: int, echo: bool):
        if self.req.logprobs is None:
            return None
        token_ids = choice.token_ids[start:]
        entries = (choice.logprobs or [])[start:]
        if echo:
            prompt_ids = output.prompt_token_ids
            prompt_entries = list(output.prompt_logprobs or [None] * len(prompt_ids))
            num_top = self.req.logprobs
            if (self.req.prompt_logprobs or 0) > num_top:  # the engine scored more ranks
                prompt_entries = [
                    None if entry is None else top_ranks(entry, token_id, num_top)
                    for token_id, entry in zip(prompt_ids, prompt_entries)
                ]
            entries = prompt_entries + entries
            token_ids = prompt_ids + token_ids
        return completion_logprobs(
            token_ids,
            entries,
            self.req.logprobs,
            self.tokenizer,
            as_ids=self.req.return_tokens_as_token_ids,
        )

    def full(self, finals: list[RequestOutput | None]) -> dict:
        choices = []
        for index, output in enumerate(finals):
            assert output is not None
            prefix = self._prompt_text(index, output) if self.req.echo else ""
            for choice in output.outputs:
                choices.append(
                    {
                        "index": index * self.req.n + choice.index,
                        "text": prefix + choice.text,
                        "logprobs": self._logprobs(output, choice, 0, self.req.echo),
                        "finish_reason": choice.finish_reason,
                        "stop_reason": choice.stop_reason,
                    }
                )
                if self.req.return_token_ids:
                    choices[-1]["prompt_token_ids"] = output.prompt_token_ids
                    choices[-1]["token_ids"] = choice.token_ids
                if self.routed and choice.routed_experts is not None:  # vLLM's field
                    choices[-1]["routed_experts"] = encode_routed_experts(choice.routed_experts)
                if self.req.prompt_logprobs is not None:  # vLLM's field, on each choice
                    choices[-1]["prompt_logprobs"] = prompt_logprobs(
                        output.prompt_token_ids, output.prompt_logprobs, self.req.prompt_logprobs
                    )
        return {**self.head, "choices": choices, "usage": usage(finals)}

    async def stream(self, iterators: list[AsyncIterator[RequestOutput]]) -> AsyncIterator[bytes]:
        chunks = SSEChunks(self.head)
        cursor = DeltaCursor()
        routed = RoutedExpertsCursor() if self.routed else None
        finals: list[RequestOutput | None] = [None] * len(iterators)

        def encode(index: int, output: RequestOutput) -> bytes:
            """The chunks of one output, joined: one socket write for all its choices."""
            finals[index] = output
            body = b""
            for choice in output.outputs:
                key = index * self.req.n + choice.index
                chunk = self._chunk(key, index, output, choice, cursor, routed)
                if chunk is not None:
                    body += chunks.choice(chunk)
            return body

        try:
            if len(iterators) == 1:  # the common case, read directly (no fan-in layer)
                async for output in iterators[0]:
                    if body := encode(0, output):
                        yield body
            else:
                async for index, output in merge(iterators):
                    if body := encode(index, output):
                        yield body
            opts = self.req.stream_options
            if opts is not None and opts.include_usage:
                yield chunks.last({"choices": [], "usage": usage(finals)})
        except Exception as e:  # noqa: BLE001 - after the 200 an error is a data chunk
            yield sse_error(as_api_error(e))
        yield SSE_DONE

    def _chunk(
        self, key, index, output, choice, cursor: DeltaCursor, routed: RoutedExpertsCursor | None
    ) -> dict | None:
        first = cursor.is_new(key)  # the prompt (echo, its ids) goes out with the first delta
        echo = self.req.echo and first
        delta = cursor.advance(key, choice, force=echo)
        if delta is None:
            return None
        text, start_tokens = delta
        if echo:
            text = self._prompt_text(index, output) + text
        chunk = {
            "index": key,
            "text": text,
            "logprobs": self._logprobs(output, choice, start_tokens, echo),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
        }
        if self.req.return_token_ids:  # as vLLM streams them: each delta's own ids
            if first:
                chunk["prompt_token_ids"] = output.prompt_token_ids
            chunk["token_ids"] = choice.token_ids[start_tokens:]
        if routed is not None and (rows := routed.delta(key, choice)) is not None:
            chunk["routed_experts"] = rows  # the routing that came with these tokens
        return chunk

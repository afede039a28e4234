"""What both generation endpoints share: server state and limits, submission of several
prompts, fan-in, usage."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from minivllm.entrypoints.async_llm import AsyncLLM, EngineDeadError
from minivllm.entrypoints.async_tokenizer import TokenizerClosedError
from minivllm.entrypoints.openai.protocol import ServerLimits
from minivllm.entrypoints.server.errors import APIError
from minivllm.entrypoints.server.response_store import ResponseStore
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm.serve")
_DONE = object()
# Sub-requests submitted between two yields to the event loop: a request of many prompts
# lets other clients' requests and streams in every this many.
_SUBMIT_SLICE = 32


@dataclass
class ServerState:
    engine: AsyncLLM
    served_model_names: list[str]
    chat_template: str | None = None
    log_requests: bool = True
    limits: ServerLimits = field(default_factory=ServerLimits)
    # --tool-call-parser when --enable-auto-tool-choice is on (tool_choice "auto"), and
    # --reasoning-parser (docs/api.md, "Tool calling" and "Reasoning")
    tool_parser: str | None = None
    reasoning_parser: str | None = None
    # The Responses API's stored answers (--responses-store-bytes)
    response_store: ResponseStore = field(default_factory=ResponseStore)

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


async def tokenize_text(
    engine: AsyncLLM,
    text: str,
    add_special_tokens: bool = True,
    param: str = "prompt",
    truncated: bool = False,
) -> list[int]:
    """A request's text as token ids (off the event loop); text the tokenizer cannot take
    is the request's fault: a 400 naming param. A text too long to fit in max_model_len
    whatever its tokens (more characters than max_model_len times the longest vocabulary
    entry) is refused before it is tokenized: an 8 MB prompt costs no seconds of CPU; unless
    truncated (the request cuts its prompt to fit: truncate_prompt_tokens)."""
    max_chars = engine.max_model_len * engine.async_tokenizer.max_chars_per_token
    if len(text) > max_chars and not truncated:
        raise APIError(
            f"This model's maximum context length is {engine.max_model_len} tokens, and the "
            f"text has {len(text)} characters: more than {max_chars} (no token of this "
            f"tokenizer is longer than {engine.async_tokenizer.max_chars_per_token} "
            "characters), so it cannot fit",
            param=param,
        )
    try:
        return await engine.encode(text, add_special_tokens)
    except ValueError as e:
        raise APIError(str(e), param=param) from None
    except TokenizerClosedError:
        raise APIError("the server is shutting down", status=503) from None


def request_ids(prefix: str, client_id: str | None) -> tuple[str, str]:
    """(the response's id, the engine's id) of a request: "{prefix}-{client_id}" where the
    client named it (vLLM's X-Request-Id header or request_id field), with a random suffix for
    the engine (two clients may pick one name); else one random id for both."""
    if client_id is None:
        request_id = f"{prefix}-{uuid.uuid4().hex}"
        return request_id, request_id
    if not 0 < len(client_id) <= 256 or not client_id.isprintable():
        raise APIError(
            "a request id (X-Request-Id, request_id) must be 1 to 256 printable characters",
            param="request_id",
        )
    return f"{prefix}-{client_id}", f"{prefix}-{client_id}-{uuid.uuid4().hex[:8]}"


def check_num_completions(limits: ServerLimits, num_prompts: int, n: int) -> None:
    """A 400 for a request asking more sequences (prompts x n) than the server allows; made
    before anything is tokenized or built."""
    if num_prompts * n > limits.max_prompts_per_request:
        raise APIError(
            f"the request asks for {num_prompts} prompt(s) x n={n} = {num_prompts * n} "
            f"completions; at most {limits.max_prompts_per_request} per request "
            "(--max-prompts-per-request)",
            param="prompt" if num_prompts > 1 else "n",
        )


async def fair_slices(items: list) -> AsyncIterator:
    """The items, yielding to the event loop every _SUBMIT_SLICE: a request of many prompts
    builds and submits them without stalling other requests and streams."""
    for start in range(0, len(items), _SUBMIT_SLICE):
        if start:
            await asyncio.sleep(0)
        for item in items[start : start + _SUBMIT_SLICE]:
            yield item


async def submit(
    state: ServerState,
    request_id: str,
    prompts: list[tuple[str | None, list[int], SamplingParams]],
    cache_salt: str | None = None,
    priority: int = 0,
) -> list[AsyncIterator[RequestOutput]]:
    """Submits every prompt of a request: all are validated first (a bad one submits
    nothing), then added _SUBMIT_SLICE at a time with a yield to the loop in between (fair
    to other clients); a bad prompt is a 400, a dead engine a 503. cache_salt, priority: the
    request's (vLLM's fields): its prompts share prefix-cache blocks only with requests of
    that salt; under --scheduling-policy priority, a lower priority is served first."""
    requests = [
        (request_id if len(prompts) == 1 else f"{request_id}-{i}", text, token_ids, params)
        for i, (text, token_ids, params) in enumerate(prompts)
    ]
    engine = state.engine
    iterators: list[AsyncIterator[RequestOutput]] = []
    try:
        engine.validate_options(cache_salt, priority)
        async for _, _, token_ids, params in fair_slices(requests):
            engine.validate(token_ids, params)  # once, here: add_validated_requests trusts it
        for start in range(0, len(requests), _SUBMIT_SLICE):
            if start:
                await asyncio.sleep(0)
            iterators += engine.add_validated_requests(
                requests[start : start + _SUBMIT_SLICE], cache_salt, priority
            )
    except BaseException as e:  # a failure (or a cancel) part-way: abort what was added
        for sub_id, *_ in requests[: len(iterators)]:
            engine.abort(sub_id)
        if isinstance(e, ValueError):
            raise APIError(str(e)) from None
        if isinstance(e, EngineDeadError):
            raise as_api_error(e) from None
        raise
    if state.log_requests:
        for sub_id, _, token_ids, params in requests:
            logger.info("request %s: %d prompt tokens, %s", sub_id, len(token_ids), _brief(params))
    return iterators


def _brief(params: SamplingParams) -> str:
    return (
        f"n={params.n} max_tokens={params.max_tokens} temperature={params.temperature} "
        f"top_p={params.top_p} top_k={params.top_k}"
    )


async def merge(
    iterators: list[AsyncIterator[RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(prompt index, output) from several requests as they come; cancelling it (or an
    error) cancels them all, which aborts their engine requests. Outputs are cumulative: a
    request's outputs that come while the consumer is busy are read as its newest only (as
    AsyncLLM's mailbox does): nothing queues up behind a slow client, and no output is read
    after a later step has grown the token ids it shares (out of step with its own text
    and routed experts)."""
    if len(iterators) == 1:
        async for output in iterators[0]:
            yield 0, output
        return
    # (index, None): the request has a newest output; (index, error or _DONE): it ended.
    queue: asyncio.Queue = asyncio.Queue()
    newest: dict[int, RequestOutput] = {}

    async def pump(index: int, iterator: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in iterator:
                if index not in newest:
                    queue.put_nowait((index, None))
                newest[index] = output
        except Exception as e:  # noqa: BLE001 - re-raised by the consumer
            queue.put_nowait((index, e))
        finally:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is None:
                yield index, newest.pop(index)
            elif item is _DONE:
                remaining -= 1
            else:
                raise item
    finally:
        for task in tasks:
            task.cancel()


async def collect(iterators: list) -> list[RequestOutput | None]:
    """The last output of each request (non-streaming responses); errors become APIErrors."""
    finals: list[RequestOutput | None] = [None] * len(iterators)
    try:
        async for index, output in merge(iterators):
            finals[index] = output
    except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error
        raise as_api_error(e) from None
    return finals


def as_api_error(e: Exception) -> APIError:
    """The error a client sees for a failure while its request runs."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, EngineDeadError):
        # Past --timeout-graceful-shutdown, http_server.GracefulServer fails what is open
        # through AsyncLLM.shutdown: that is no death, and the message says so.
        if "shutting down" in str(e):
            return APIError(str(e), status=503)
        return APIError(f"the engine is dead: {e}", status=503)
    if isinstance(e, ValueError):
        return APIError(str(e))
    if isinstance(e, TokenizerClosedError):
        return APIError("the server is shutting down", status=503)
    logger.exception("request failed")
    return APIError(f"internal error: {type(e).__name__}", status=500)


def response_head(request_id: str, object_name: str, model: str) -> dict:
    """The fields every response body and stream chunk of one request starts with."""
    return {
        "id": request_id,
        "object": object_name,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }


def usage(outputs: list[RequestOutput | None]) -> dict:
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs if o is not None)
    completion_tokens = sum(len(c.token_ids) for o in outputs if o is not None for c in o.outputs)
    cached = sum(o.num_cached_tokens for o in outputs if o is not None)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }

"""What both generation endpoints share: server state, fan-in of several prompts, usage, SSE."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from minivllm.entrypoints.async_llm import AsyncLLM, EngineDeadError
from minivllm.entrypoints.openai.errors import APIError
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm.serve")
_DONE = object()


@dataclass
class ServerState:
    engine: AsyncLLM
    served_model_names: list[str]
    chat_template: str | None = None
    log_requests: bool = True

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


async def tokenize_text(
    engine: AsyncLLM, text: str, add_special_tokens: bool = True, param: str = "prompt"
) -> list[int]:
    """A request's text as token ids (off the event loop); text the tokenizer cannot take
    is the request's fault: a 400 naming param."""
    try:
        return await engine.encode(text, add_special_tokens)
    except ValueError as e:
        raise APIError(str(e), param=param) from None


def submit(
    state: ServerState, request_id: str, prompts: list[tuple[str | None, list[int], SamplingParams]]
) -> list[AsyncIterator[RequestOutput]]:
    """Submits every prompt of a request (AsyncLLM.add_requests: a bad one submits nothing);
    a bad prompt is a 400, a dead engine a 503."""
    requests = [
        (request_id if len(prompts) == 1 else f"{request_id}-{i}", text, token_ids, params)
        for i, (text, token_ids, params) in enumerate(prompts)
    ]
    try:
        iterators = state.engine.add_requests(requests)
    except ValueError as e:
        raise APIError(str(e)) from None
    except EngineDeadError as e:
        raise APIError(f"the engine is dead: {e}", status=503) from None
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
    error) cancels them all, which aborts their engine requests."""
    if len(iterators) == 1:
        async for output in iterators[0]:
            yield 0, output
        return
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, iterator: AsyncIterator[RequestOutput]) -> None:
        try:
            async for output in iterator:
                queue.put_nowait((index, output))
        except Exception as e:  # noqa: BLE001 - re-raised by the consumer
            queue.put_nowait((index, e))
        finally:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await queue.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
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
        return APIError(f"the engine is dead: {e}", status=503)
    if isinstance(e, ValueError):
        return APIError(str(e))
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
        """A chunk with other fields after the head (the usage chunk)."""
        body = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
        return f"{self._prefix},{body[1:]}\n\n".encode()

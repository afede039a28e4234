"""From an HTTP request to validated inputs: the JSON body, the model, SamplingParams."""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from minivllm.entrypoints.openai.protocol import (
    MAX_LOGPROBS,
    MAX_N,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    ServerLimits,
)
from minivllm.entrypoints.server.errors import APIError
from minivllm.sampling_params import SamplingParams
from minivllm.structured_output.params import StructuredOutputsParams

ModelT = TypeVar("ModelT", bound=BaseModel)
# Request fields that override generation_config.json's defaults when given.
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
# Request fields a SamplingParams error may start with (it names the field first).
_PARAM_FIELDS = frozenset(
    (*_SAMPLING_FIELDS, "n", "stop", "seed", "stop_token_ids", "max_tokens", "min_tokens",
     "logprobs", "prompt_logprobs", "logit_bias", "allowed_token_ids", "bad_words",
     "thinking_token_budget")
)  # fmt: skip
_MAX_SEED = 2**63 - 1 - MAX_N  # n samples use seed + index
_MAX_LOGIT_BIAS = 1024  # entries a request may bias (each one a column the sampler adds to)
# ids a request may allow (the sampler pads every row of a batch to the longest list)
_MAX_ALLOWED_TOKEN_IDS = 4096


async def read_body(request: Request, model_cls: type[ModelT], limits: ServerLimits) -> ModelT:
    """Reads at most limits.max_body_bytes (413 beyond; a larger Content-Length was refused
    before the app, by server._BodySizeLimit) within limits.read_timeout_s (408 after: a client
    trickling its body holds no connection for long), parses JSON, validates; every other
    failure is a 400. A
    1,000-id prompt's body takes about half the time in model_validate_json as in
    json.loads + model_validate (the error path still uses those)."""
    body = bytearray()
    max_bytes, timeout_s = limits.max_body_bytes, limits.read_timeout_s
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                body += chunk
                if len(body) > max_bytes:
                    raise APIError(f"the request body is larger than {max_bytes} bytes", 413)
    except TimeoutError:
        raise APIError(f"the request body did not arrive within {timeout_s:g} s", 408) from None
    try:  # a valid body, the common case: parsed and validated in one pass (pydantic's Rust)
        return model_cls.model_validate_json(body)
    except ValidationError:
        pass  # parsed again below, to say precisely what is wrong
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:  # bad JSON, bad UTF-8, absurd nesting
        raise APIError(f"the request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(f"invalid request: {_describe(e)}", param=param) from None


def _describe(e: ValidationError) -> str:
    parts = []
    for err in e.errors()[:3]:
        loc = ".".join(str(p) for p in err["loc"])
        if err["type"] == "extra_forbidden":
            parts.append(f"{loc}: not a field of this request (unknown fields are refused)")
        else:
            parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def check_unimplemented(req: BaseModel) -> None:
    """A 400 naming the first field that the request's model declares unimplemented
    (protocol._unimplemented: OpenAI's or vLLM's, not implemented here) and that the request
    sets to a value that would change something."""
    for name, no_ops in _unimplemented_fields(type(req)):
        value = getattr(req, name)
        if value is not None and not any(_same(value, v) for v in no_ops):
            allowed = " or ".join(json.dumps(v) for v in no_ops)
            raise APIError(
                f"{name} is not supported by this server"
                + (f" (only {allowed}, which changes nothing, is accepted)" if allowed else ""),
                param=name,
            )


@functools.cache
def _unimplemented_fields(model: type[BaseModel]) -> list[tuple[str, list[Any]]]:
    """(name, no-op values) of the model's unimplemented fields, worked out once per model."""
    return [
        (name, field.json_schema_extra["unimplemented"])
        for name, field in model.model_fields.items()
        if isinstance(field.json_schema_extra, dict) and "unimplemented" in field.json_schema_extra
    ]


def _same(value: Any, no_op: Any) -> bool:
    """value equals no_op as JSON values do (true is not 1)."""
    if type(no_op) is float and type(value) is int:  # 1 for 1.0
        return value == no_op
    return type(value) is type(no_op) and value == no_op


def check_model(requested: str | None, served_names: list[str]) -> None:
    if requested is not None and requested not in served_names:
        shown = requested if len(requested) <= 200 else requested[:200] + "..."
        served = ", ".join(f"`{name}`" for name in served_names)
        raise APIError(
            f"The model `{shown}` does not exist; this server serves {served}.",
            status=404,
            param="model",
        )


def truncate_prompt(
    token_ids: list[int], keep: int | None, max_model_len: int, max_tokens: int | None, side: str
) -> list[int]:
    """token_ids cut to keep (a request's truncate_prompt_tokens; None: as they are), as vLLM
    0.20 cuts them:
    k keeps k tokens, -1 keeps what max_model_len leaves beside max_tokens; the first k where
    the tokenizer's truncation_side is "right" (transformers' default), the last k where it is
    "left". A k larger than max_model_len - max_tokens is a 400, as in vLLM."""
    if keep is None:
        return token_ids
    room = max_model_len - (max_tokens or 0)
    if keep < -1 or keep > room:
        raise APIError(
            f"truncate_prompt_tokens must be -1 or between 0 and max_model_len - max_tokens = "
            f"{room}, got {keep}",
            param="truncate_prompt_tokens",
        )
    keep = room if keep == -1 else keep
    if keep >= len(token_ids):
        return token_ids
    return token_ids[len(token_ids) - keep :] if side == "left" else token_ids[:keep]


def sampling_params(
    req: Any,
    defaults: dict[str, Any],
    num_prompt_tokens: int,
    max_model_len: int,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None = None,
    structured_outputs: StructuredOutputsParams | None = None,
) -> SamplingParams:
    """SamplingParams of one prompt. max_tokens defaults to what fits in max_model_len (at most
    generation_config.json's max_new_tokens, as in vLLM); a larger one is a 400, as in OpenAI
    and vLLM (a prompt that does not fit at all is refused by the engine's checks, in their
    words)."""
    _check_limits(req, logprobs)
    values = dict(defaults)
    default_max_tokens = values.pop("max_tokens", None)
    for name in _SAMPLING_FIELDS:
        if getattr(req, name) is not None:
            values[name] = getattr(req, name)
    room = max(max_model_len - num_prompt_tokens, 1)
    if max_tokens is None and default_max_tokens is not None:
        max_tokens = min(default_max_tokens, room)
    if max_tokens is not None and max_tokens > room and num_prompt_tokens < max_model_len:
        raise APIError(
            f"max_tokens is too large: {max_tokens}. This model's maximum context length is "
            f"{max_model_len} tokens and the request has {num_prompt_tokens} prompt tokens, "
            f"so at most {room} can be generated ({max_tokens} > {max_model_len} - "
            f"{num_prompt_tokens})",
            param="max_tokens",
        )
    if max_tokens is not None and max_tokens < 1:
        raise APIError(f"max_tokens must be at least 1, got {max_tokens}", param="max_tokens")
    try:
        return SamplingParams(
            n=req.n,
            stop=req.stop,
            seed=req.seed,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            max_tokens=room if max_tokens is None else max_tokens,
            min_tokens=req.min_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str_in_output=req.include_stop_str_in_output,
            logit_bias=_logit_bias(req.logit_bias),
            allowed_token_ids=req.allowed_token_ids,
            bad_words=req.bad_words,
            thinking_token_budget=req.thinking_token_budget,
            structured_outputs=structured_outputs,
            **values,
        )
    except (ValueError, TypeError) as e:  # SamplingParams' messages start with the field
        field = str(e).split(" ", 1)[0]
        raise APIError(str(e), param=field if field in _PARAM_FIELDS else None) from None


def _logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's {"token id": bias} as {id: bias} (SamplingParams clamps each bias to
    [-100, 100], as the OpenAI API does); keys that are not token ids are a 400. (Non-finite
    biases never get here: the request models reject NaN and infinities.)"""
    if not logit_bias:
        return None
    if len(logit_bias) > _MAX_LOGIT_BIAS:
        raise APIError(f"at most {_MAX_LOGIT_BIAS} logit_bias entries", param="logit_bias")
    result = {}
    for key, bias in logit_bias.items():
        try:
            token_id = int(key)
        except ValueError:
            raise APIError(
                f"logit_bias keys must be token ids, got {key!r}", param="logit_bias"
            ) from None
        result[token_id] = float(bias)
    return result


def _check_limits(req: Any, logprobs: int | None) -> None:
    if not 1 <= req.n <= MAX_N:
        raise APIError(f"n must be between 1 and {MAX_N}, got {req.n}", param="n")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(
            f"best_of is not supported (got best_of={req.best_of} with n={req.n}); "
            "only best_of equal to n, which changes nothing, is accepted",
            param="best_of",
        )
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise APIError(
            f"logprobs must be between 0 and {MAX_LOGPROBS}, got {logprobs}", param="logprobs"
        )
    if req.allowed_token_ids is not None and len(req.allowed_token_ids) > _MAX_ALLOWED_TOKEN_IDS:
        raise APIError(
            f"at most {_MAX_ALLOWED_TOKEN_IDS} allowed_token_ids", param="allowed_token_ids"
        )
    if req.bad_words and (
        len(req.bad_words) > MAX_STOP_STRINGS
        or any(len(w) > MAX_STOP_STRING_CHARS for w in req.bad_words)
    ):
        raise APIError(
            f"at most {MAX_STOP_STRINGS} bad_words of at most {MAX_STOP_STRING_CHARS} "
            "characters each",
            param="bad_words",
        )
    if req.prompt_logprobs is not None:
        if req.stream:  # as in vLLM: they would all come in the first chunk
            raise APIError("prompt_logprobs are not available with stream=true", param="stream")
        if not 0 <= req.prompt_logprobs <= MAX_LOGPROBS:
            raise APIError(
                f"prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {req.prompt_logprobs}",
                param="prompt_logprobs",
            )
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
        raise APIError(
            f"at most {MAX_STOP_STRINGS} stop strings of at most {MAX_STOP_STRING_CHARS} "
            "characters each",
            param="stop",
        )
    if req.seed is not None and not 0 <= req.seed <= _MAX_SEED:
        raise APIError(f"seed must be between 0 and {_MAX_SEED}, got {req.seed}", param="seed")
    if req.stop_token_ids and len(req.stop_token_ids) > MAX_STOP_STRINGS:
        raise APIError(f"at most {MAX_STOP_STRINGS} stop_token_ids", param="stop_token_ids")

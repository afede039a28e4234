"""A Responses API request as the chat request it is served as: its input items and
instructions as chat messages (after a stored conversation's), its flat function tools as
chat's, text.format as response_format, reasoning.effort as reasoning_effort, and vLLM's
sampling extras as they are. What chat cannot express is a 400 naming the Responses field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from minivllm.entrypoints.openai.params import check_unimplemented
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest
from minivllm.entrypoints.responses.protocol import (
    INCLUDES_WITH_NOTHING_TO_ADD,
    LOGPROBS_INCLUDE,
    ResponsesRequest,
)
from minivllm.entrypoints.server.errors import APIError

# Fields with the same name and meaning in a chat request.
_SAME_FIELDS = (
    "model",
    "temperature",
    "top_p",
    "stream",
    "parallel_tool_calls",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "stop_token_ids",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
    "min_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "bad_words",
    "allowed_token_ids",
    "structured_outputs",
    "chat_template_kwargs",
    "cache_salt",
    "priority",
)
# A chat field's name in the Responses request, for errors found while serving it as chat.
RESPONSES_PARAM = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "logprobs": "include",
}
_ROLES = ("user", "assistant", "system", "developer")


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request that serves req; history: a stored conversation's messages (those of
    previous_response_id), which come after the instructions and before the input."""
    check_unimplemented(req)
    body: dict[str, Any] = {name: getattr(req, name) for name in _SAME_FIELDS}
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body["messages"] = messages + history + input_messages(req.input)
    body["max_completion_tokens"] = req.max_output_tokens
    body["tools"] = _tools(req.tools)
    body["tool_choice"] = _tool_choice(req.tool_choice)
    if req.text is not None:
        check_unimplemented(req.text)
        body["response_format"] = _response_format(req.text.format)
    if req.reasoning is not None:
        body["reasoning_effort"] = req.reasoning.effort
    if _includes(req.include):
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs or 0
    elif req.top_logprobs:
        raise APIError(f'top_logprobs needs include: ["{LOGPROBS_INCLUDE}"]', param="top_logprobs")
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None}
        )
    except ValidationError as e:  # a message built from an input item that chat refuses
        first = e.errors()[0]
        raise APIError(f"invalid input: {first['msg']}", param="input") from None


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input as chat messages: a string is one user message; items in order, where an
    assistant's turn (reasoning, a message, function calls) is one assistant message and a
    function call's output a "tool" message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        kind = item.get("type", "message")
        if kind == "message":
            _add_message(messages, item, where)
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            _assistant_turn(messages).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _output_text(item.get("output"), where),
                }
            )
        elif kind == "reasoning":
            _assistant_turn(messages)["reasoning"] = _reasoning_text(item, where)
        else:
            raise APIError(
                f"{where}: input items of type {kind!r} are not supported (messages, "
                "function_call, function_call_output and reasoning are)",
                param=where,
            )
    return messages


def _add_message(messages: list[dict[str, Any]], item: Mapping[str, Any], where: str) -> None:
    role = item.get("role")
    if role not in _ROLES:
        raise APIError(f"{where}.role must be one of {list(_ROLES)}, got {role!r}", param=where)
    text = _content_text(item.get("content"), where)
    if role == "assistant":
        # After the turn's reasoning (an item of its own before it), in the same message.
        turn = _assistant_turn(messages)
        turn["content"] = turn.get("content", "") + text
        return
    messages.append({"role": "system" if role == "developer" else role, "content": text})


def _assistant_turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message that the next reasoning, text or call of this turn joins: the
    last message when it is the assistant's and has no calls yet (or is adding calls), else a
    new one."""
    last = messages[-1] if messages else None
    if last is None or last["role"] != "assistant":
        last = {"role": "assistant"}
        messages.append(last)
    return last


def _content_text(content: Any, where: str) -> str:
    """A message's content: a string, or parts of text (input_text, output_text) joined;
    images, files and audio are a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where}.content must be a string or a list of parts", param=where)
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("input_text", "output_text", "text"):
            raise APIError(
                f"{where}.content: parts of type {kind!r} are not supported (text only)",
                param=where,
            )
        texts.append(_string(part, "text", f"{where}.content"))
    return "".join(texts)


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    return _content_text(output, f"{where}.output")


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    """A reasoning item's text: its content (reasoning_text parts), else its summary."""
    if item.get("encrypted_content"):
        raise APIError(
            f"{where}: encrypted reasoning is not supported (send the item's content back)",
            param=where,
        )
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        raise APIError(f"{where}.content must be a list of parts", param=where)
    return "".join(_string(p, "text", where) for p in parts if isinstance(p, Mapping))


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _tools(tools: list | None) -> list[dict[str, Any]] | None:
    if not tools:  # [] is no tools, as OpenAI's Responses API takes it (the Agents SDK sends it)
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if tool.type != "function":
            raise APIError(
                f"tools[{index}]: tools of type {tool.type!r} are not supported (only "
                "function tools: this server runs no hosted tools)",
                param=f"tools[{index}]",
            )
        if not tool.name:
            raise APIError(f"tools[{index}] needs a name", param=f"tools[{index}].name")
        function = tool.model_dump(exclude={"type"}, exclude_none=True)
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _tool_choice(choice: Any) -> Any:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        raise APIError(
            f'tool_choice of type {choice.type!r} is not supported ("none", "auto", '
            '"required" or {"type": "function", "name": ...})',
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice.name}}


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.json_schema is None:
        raise APIError('text.format of type "json_schema" needs a schema', param="text.format")
    schema = {"name": fmt.name, "schema": fmt.json_schema, "strict": fmt.strict}
    return {
        "type": "json_schema",
        "json_schema": {k: v for k, v in schema.items() if v is not None},
    }


def _includes(include: list[str] | None) -> bool:
    """Whether include asks for the output's logprobs; a value this server does not know is
    a 400."""
    for value in include or []:
        if value != LOGPROBS_INCLUDE and value not in INCLUDES_WITH_NOTHING_TO_ADD:
            raise APIError(f"include: {value!r} is not supported", param="include")
    return LOGPROBS_INCLUDE in (include or [])

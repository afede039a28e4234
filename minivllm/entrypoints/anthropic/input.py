"""An Anthropic Messages request as the chat request it is served as: `system` as a system
message, content blocks as chat messages (an assistant's `thinking` as its reasoning, its
`tool_use` blocks as tool calls, a user's `tool_result` blocks as tool messages), tools with
their `input_schema` as chat's function tools, `tool_choice` as chat's, `thinking` as the
template's `enable_thinking`. What chat cannot express is a 400 naming the field."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from minivllm.entrypoints.anthropic.protocol import MessagesRequest, _Conversation
from minivllm.entrypoints.openai.params import check_unimplemented
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest
from minivllm.entrypoints.server.errors import APIError

# A chat field's name in the Messages request, for errors found while serving it as chat.
MESSAGES_PARAM = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "response_format": "messages",
}


def chat_request(req: _Conversation) -> ChatCompletionRequest:
    """The chat request that serves req (a MessagesRequest, or a count_tokens request, which
    is rendered the same way)."""
    check_unimplemented(req)
    messages = []
    if req.system:
        messages.append({"role": "system", "content": _text(req.system, "system")})
    for index, message in enumerate(req.messages):
        messages += _chat_messages(message.role, message.content, f"messages[{index}]")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "tools": _tools(req.tools),
        "chat_template_kwargs": _template_kwargs(req),
    }
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
        body["parallel_tool_calls"] = not req.tool_choice.disable_parallel_tool_use
    if isinstance(req, MessagesRequest):
        if req.thinking is not None and req.thinking.type == "enabled":
            body["thinking_token_budget"] = req.thinking.budget_tokens
        body.update(
            max_completion_tokens=req.max_tokens,
            stream=req.stream,
            stop=req.stop_sequences,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
        )
    try:
        return ChatCompletionRequest.model_validate(
            {k: v for k, v in body.items() if v is not None}
        )
    except ValidationError as e:
        raise APIError(f"invalid messages: {e.errors()[0]['msg']}", param="messages") from None


def _chat_messages(role: str, content: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: an assistant's is one message (reasoning, text,
    calls); a user's tool_result blocks are tool messages, in order, and its text a user
    message after them."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if role == "assistant":
        return [_assistant_message(content, where)]
    messages: list[dict[str, Any]] = []
    texts: list[str] = []
    for index, block in enumerate(content):
        at = f"{where}.content[{index}]"
        kind = _kind(block, at)
        if kind == "text":
            texts.append(_string(block, "text", at))
        elif kind == "tool_result":
            result = block.get("content") or ""  # optional in Anthropic's API
            text = result if isinstance(result, str) else _text(result, f"{at}.content")
            if block.get("is_error"):
                text = f"Error: {text}"
            messages.append(
                {"role": "tool", "tool_call_id": _string(block, "tool_use_id", at), "content": text}
            )
        else:
            raise APIError(
                f"{at}: user content blocks of type {kind!r} are not supported (text and "
                "tool_result are)",
                param=at,
            )
    if texts:
        messages.append({"role": "user", "content": "".join(texts)})
    return messages


def _assistant_message(blocks: list, where: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    for index, block in enumerate(blocks):
        at = f"{where}.content[{index}]"
        kind = _kind(block, at)
        if kind == "text":
            message["content"] = message.get("content", "") + _string(block, "text", at)
        elif kind == "thinking":
            message["reasoning"] = message.get("reasoning", "") + _string(block, "thinking", at)
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, Mapping):
                raise APIError(f"{at}.input must be an object", param=f"{at}.input")
            call = {"name": _string(block, "name", at), "arguments": json.dumps(arguments)}
            message.setdefault("tool_calls", []).append(
                {"id": _string(block, "id", at), "type": "function", "function": call}
            )
        elif kind != "redacted_thinking":  # encrypted reasoning of another server: no text
            raise APIError(
                f"{at}: assistant content blocks of type {kind!r} are not supported (text, "
                "thinking and tool_use are)",
                param=at,
            )
    return message


def _kind(block: Any, where: str) -> str:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise APIError(f"{where} must be a content block with a type", param=where)
    return block["type"]


def _string(block: Mapping[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise APIError(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined (system prompts, tool results)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(f"{where} must be a string or a list of text blocks", param=where)
    texts = []
    for index, block in enumerate(content):
        at = f"{where}[{index}]"
        if _kind(block, at) != "text":
            raise APIError(f"{at}: only text blocks are supported here", param=at)
        texts.append(_string(block, "text", at))
    return "".join(texts)


def _tools(tools: list | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise APIError(
                f"tools[{index}]: tools of type {tool.type!r} are not supported (only custom "
                "tools with an input_schema: this server runs no server tools)",
                param=f"tools[{index}]",
            )
        function = {"name": tool.name, "description": tool.description,
                    "parameters": tool.input_schema}  # fmt: skip
        chat_tools.append(
            {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}
        )
    return chat_tools


def _tool_choice(choice: Any) -> Any:
    if choice.type == "tool":
        if not choice.name:
            raise APIError('tool_choice of type "tool" needs a name', param="tool_choice.name")
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


def _template_kwargs(req: _Conversation) -> dict[str, Any] | None:
    """chat_template_kwargs, with enable_thinking from `thinking` (their own key wins)."""
    if req.thinking is None:
        return req.chat_template_kwargs
    thinking = {"enable_thinking": req.thinking.type != "disabled"}
    return thinking | (req.chat_template_kwargs or {})

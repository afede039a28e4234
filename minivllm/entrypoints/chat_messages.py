"""OpenAI chat messages as chat templates read them (text content, earlier tool calls with
their arguments as dicts, tool results with their tool_call_id, earlier reasoning), and a
conversation rendered through the template with its tools. Shared by LLM.chat and the server;
bad input is a ValueError or TypeError."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

# apply_chat_template arguments that chat_template_kwargs may not set (they have their own).
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
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
)


def content_text(content: Any, where: str) -> str:
    """A message's content as text: a string, None (""), or OpenAI's list of text parts
    joined by newlines (other part types are refused)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise TypeError(f"{where}.content must be a string or a list of parts")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") != "text":
            raise ValueError("only text content parts are supported")
        if not isinstance(part.get("text"), str):
            raise TypeError(f"{where}.content: a text part needs a string 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    """An earlier call as templates read it: arguments as a dict (Qwen's and Llama's templates
    write `arguments | tojson`), as vLLM passes them; "" or missing arguments are {}; a text
    that is not JSON (a call cut off by max_tokens) goes to the template as that text, as
    OpenAI takes any string there."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"{where}: each tool call needs function.name")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # kept as the text
        except RecursionError:
            raise ValueError(f"{where}: arguments are nested too deeply") from None
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def template_message(message: Any, index: int) -> dict[str, Any]:
    """One OpenAI-shaped message (a dict) as the template reads it; keys other than role,
    content, name, tool_calls, tool_call_id, reasoning and reasoning_content are dropped."""
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise TypeError(f"{where} must be a dict, got {type(message).__name__}")
    if not isinstance(message.get("role"), str):
        raise ValueError(f"{where} needs a string role")
    entry: dict[str, Any] = {
        "role": message["role"],
        "content": content_text(message.get("content"), where),
    }
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None:
            if not isinstance(message[key], str):
                raise TypeError(f"{where}.{key} must be a string")
            entry[key] = message[key]
    calls = message.get("tool_calls")
    if calls:  # an empty list keeps templates on the plain assistant path, as in vLLM
        if not isinstance(calls, list):
            raise TypeError(f"{where}.tool_calls must be a list")
        entry["tool_calls"] = [_tool_call(c, f"{where}.tool_calls") for c in calls]
    reasoning = message.get("reasoning")
    if reasoning is None:
        reasoning = message.get("reasoning_content")
    if reasoning is not None:  # Qwen3's template reads reasoning_content
        entry["reasoning"] = entry["reasoning_content"] = reasoning
    return entry


def template_conversation(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Each message through template_message."""
    return [template_message(m, i) for i, m in enumerate(messages)]


def render_conversation(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    chat_template: str | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    template_kwargs: Mapping[str, Any] | None = None,
    documents: list[dict[str, str]] | None = None,
) -> str:
    """A template_conversation through the chat template (the tokenizer's, or chat_template),
    as text; tools and documents (for retrieval) reach it as `tools` and `documents`
    (templates that do not read them ignore them). Errors of the template itself propagate
    as raised."""
    kwargs = dict(template_kwargs or {})
    bad = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if bad:
        raise ValueError(f"chat_template_kwargs may not set {bad}")
    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("this model has no chat template; pass one (chat_template)")
    if tools is not None and not isinstance(tools, list):
        raise TypeError(f"tools must be a list of dicts, got {type(tools).__name__}")
    return tokenizer.apply_chat_template(
        conversation,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt and not continue_final_message,
        continue_final_message=continue_final_message,
        tokenize=False,
        tools=tools,
        documents=documents,
        **kwargs,
    )

"""The chat template: a request's messages (with earlier tool calls, tool results and
reasoning) and tools rendered to the prompt, on a tokenizer thread."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from minivllm.entrypoints.async_tokenizer import TokenizerClosedError
from minivllm.entrypoints.openai.errors import APIError
from minivllm.entrypoints.openai.protocol import ChatMessage, ToolCallIn
from minivllm.entrypoints.openai.serving_common import tokenize_text

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


def _tool_call(call: ToolCallIn, index: int) -> dict[str, Any]:
    """An earlier call as templates read it: arguments as a dict (Qwen's and Llama's
    templates write `arguments | tojson`), as vLLM passes them."""
    arguments = call.function.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise APIError(
                f"messages[{index}].tool_calls: arguments must be a JSON text",
                param="messages",
            ) from None
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": "function", "function": function}


def _message(message: ChatMessage, index: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"role": message.role, "content": _content_text(message)}
    if message.name is not None:
        entry["name"] = message.name
    if message.tool_calls:
        entry["tool_calls"] = [_tool_call(c, index) for c in message.tool_calls]
    if message.tool_call_id is not None:
        entry["tool_call_id"] = message.tool_call_id
    reasoning = message.reasoning if message.reasoning is not None else message.reasoning_content
    if reasoning is not None:  # Qwen3's template reads reasoning_content
        entry["reasoning"] = entry["reasoning_content"] = reasoning
    return entry


def _render(tokenizer, messages: list[ChatMessage], **template_kwargs) -> str:
    """The conversation as text (on a tokenizer thread: all of it is per-message work)."""
    conversation = [_message(m, i) for i, m in enumerate(messages)]
    return tokenizer.apply_chat_template(conversation, **template_kwargs)


async def render_chat(
    engine,
    chat_template: str | None,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    continue_final_message: bool,
    template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Prompt token ids of a conversation (rendered to text on a tokenizer thread: a template
    over 10^5 messages takes seconds of Python; then tokenized without adding special tokens,
    as vLLM does); engine: the AsyncLLM (its tokenizer)."""
    text = await render_chat_text(
        engine,
        chat_template,
        messages,
        add_generation_prompt,
        continue_final_message,
        template_kwargs,
        tools,
    )
    return await tokenize_text(engine, text, add_special_tokens=False, param="messages")


async def render_chat_text(
    engine,
    chat_template: str | None,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    continue_final_message: bool,
    template_kwargs: dict[str, Any] | None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The conversation through the chat template, as text (render_chat's first half); tools
    reach the template as `tools` (templates that do not read them ignore them)."""
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
        tools=tools,
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
    return text

"""The chat template: a request's messages (with earlier tool calls, tool results and
reasoning) and tools rendered to the prompt, on a tokenizer thread."""

from __future__ import annotations

from functools import partial
from typing import Any

from minivllm.entrypoints.async_tokenizer import TokenizerClosedError
from minivllm.entrypoints.chat_messages import (
    RESERVED_TEMPLATE_KWARGS,
    render_conversation,
    template_conversation,
)
from minivllm.entrypoints.openai.protocol import ChatMessage, ChatTool
from minivllm.entrypoints.server.errors import APIError
from minivllm.entrypoints.server.serving_common import tokenize_text


def _render(tokenizer, messages: list[ChatMessage], **options) -> str:
    """The conversation as text (on a tokenizer thread: all of it is per-message work); a
    message no template can take is a 400 naming it."""
    try:
        conversation = template_conversation([m.model_dump(exclude_none=True) for m in messages])
    except (ValueError, TypeError) as e:
        raise APIError(str(e), param="messages") from None
    return render_conversation(tokenizer, conversation, **options)


async def render_chat_text(
    engine,
    chat_template: str | None,
    messages: list[ChatMessage],
    add_generation_prompt: bool,
    continue_final_message: bool,
    template_kwargs: dict[str, Any] | None,
    tools: list[ChatTool] | None = None,
    documents: list[dict[str, str]] | None = None,
) -> str:
    """The conversation through the chat template, as text (rendered on a tokenizer thread: a
    template over 10^5 messages takes seconds of Python); tools and documents reach the
    template as `tools` and `documents` (templates that do not read them ignore them). The
    caller tokenizes it without adding special tokens, as vLLM does."""
    tokenizer = engine.tokenizer
    kwargs = dict(template_kwargs or {})
    bad = sorted(set(kwargs) & RESERVED_TEMPLATE_KWARGS)
    if bad:
        raise APIError(f"chat_template_kwargs may not set {bad}", param="chat_template_kwargs")
    if chat_template is None and tokenizer.chat_template is None:
        raise APIError("this model has no chat template; start the server with --chat-template")
    render = partial(
        _render,
        tokenizer,
        messages,
        tools=[t.model_dump(exclude_none=True) for t in tools] if tools else None,
        documents=documents,
        chat_template=chat_template,
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        template_kwargs=kwargs,
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


async def render_chat(
    engine,
    chat_template: str | None,
    messages: list[ChatMessage],
    tools: list[ChatTool] | None,
    template_kwargs: dict[str, Any] | None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    add_special_tokens: bool = False,
) -> list[int]:
    """The prompt's token ids of a conversation (render_chat_text, then tokenized): what
    /tokenize and Anthropic's count_tokens count, as the chat endpoint renders it."""
    text = await render_chat_text(
        engine, chat_template, messages, add_generation_prompt, continue_final_message,
        template_kwargs, tools,
    )  # fmt: skip
    return await tokenize_text(engine, text, add_special_tokens, param="messages")

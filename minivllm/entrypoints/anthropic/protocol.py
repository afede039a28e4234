"""The bodies of POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API,
with vLLM's extra fields). As on the OpenAI routes, a top-level field that neither Anthropic's
API nor vLLM's has is a 400, and their fields this server does not implement are accepted only
at the value that changes nothing. Content blocks and tools are read by input.py."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt

from minivllm.entrypoints.openai.protocol import Number, _Request, _unimplemented


class Message(_Request):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]  # text, tool_use, tool_result, thinking blocks


class Tool(_Request):
    type: str | None = None  # a custom tool; Anthropic's own ("bash_...", ...) are refused
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: StrictBool = False


class Thinking(_Request):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: StrictInt | None = None


class _Conversation(_Request):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's


class MessagesRequest(_Conversation):
    max_tokens: StrictInt
    stream: StrictBool = False
    stop_sequences: list[str] | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    top_k: StrictInt | None = None
    metadata: dict[str, Any] | None = None  # {"user_id"}: nothing in the output depends on it
    service_tier: str | None = None
    # Anthropic's, then vLLM's, that this server does not implement
    container: Any = _unimplemented()
    mcp_servers: Any = _unimplemented()
    context_management: Any = _unimplemented()
    kv_transfer_params: Any = _unimplemented()


class CountTokensRequest(_Conversation):
    pass

"""The body of POST /v1/responses (OpenAI's Responses API, with vLLM's extra sampling fields).

As for chat and completions (openai/protocol.py), a field that neither OpenAI's Responses API nor
vLLM's has is a 400, and their fields this server does not implement are accepted only at the
value that changes nothing. Input items and tools are read by input.py, which turns the
request into the chat request it is served as.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt

from minivllm.entrypoints.openai.protocol import (
    Number,
    StructuredOutputsField,
    _Request,
    _unimplemented,
)

# `include` values: the one that adds something here, and those about tools this server does
# not have or about reasoning it returns in plain text (each has nothing to add).
LOGPROBS_INCLUDE = "message.output_text.logprobs"
INCLUDES_WITH_NOTHING_TO_ADD = frozenset(
    {
        "reasoning.encrypted_content",  # reasoning items carry their text in `content`
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
        "message.input_image.image_url",
    }
)


class FunctionTool(_Request):
    """A tool of the Responses API: a function, flat ({"type", "name", "parameters", ...})."""

    type: str  # only "function" is served (input.py refuses the hosted tools by name)
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ToolChoiceFunction(_Request):
    type: str  # "function" (the hosted tools' types are refused by input.py)
    name: str | None = None


class TextFormat(_Request):
    """text.format: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
    "name", "schema", "description", "strict"} (flat, unlike chat's response_format)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class TextConfig(_Request):
    format: TextFormat | None = None
    verbosity: Any = _unimplemented("medium")


class ReasoningConfig(_Request):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # The reasoning comes whole, in the reasoning item's content; no summary is written.
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(_Request):
    include_obfuscation: StrictBool | None = None  # no obfuscation field is ever added


class ResponsesRequest(_Request):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str | None = None
    # A user message's text, or a list of items: messages, function calls and their outputs,
    # reasoning (input.py)
    input: str | list[dict[str, Any]]
    instructions: str | None = None  # a system message first; not carried to the next turn
    previous_response_id: str | None = None  # a stored response's conversation comes first
    store: StrictBool = True  # as OpenAI: kept for previous_response_id and GET (store.py)
    max_output_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    stream: StrictBool = False
    stream_options: ResponsesStreamOptions | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: StrictBool = True
    max_tool_calls: StrictInt | None = None  # a limit on hosted tools' calls: there are none
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    top_logprobs: StrictInt | None = None
    # OpenAI's, about the account or the caller; nothing in the output depends on them
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    # vLLM's extras, as on chat completions
    top_k: StrictInt | None = None
    min_p: Number | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    repetition_penalty: Number | None = None
    logit_bias: dict[str, Number] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    bad_words: list[str] | None = None
    allowed_token_ids: list[StrictInt] | None = None
    structured_outputs: StructuredOutputsField | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = Field(default=None, min_length=1)
    priority: StrictInt = 0
    # OpenAI's, then vLLM's, that this server does not implement
    background: Any = _unimplemented(False)
    conversation: Any = _unimplemented()
    prompt: Any = _unimplemented()
    truncation: Any = _unimplemented("disabled")
    context_management: Any = _unimplemented()
    request_id: Any = _unimplemented()
    enable_response_messages: Any = _unimplemented(False)
    previous_input_messages: Any = _unimplemented()
    mm_processor_kwargs: Any = _unimplemented()
    media_io_kwargs: Any = _unimplemented()
    kv_transfer_params: Any = _unimplemented()
    vllm_xargs: Any = _unimplemented()

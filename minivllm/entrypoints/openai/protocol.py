"""Request bodies of the OpenAI-compatible API (pydantic), with vLLM's extra sampling fields.

A completion or chat body with a field that neither OpenAI's API nor vLLM's has is a 400, as
in OpenAI's API (vLLM ignores it): a misspelt field would otherwise change the output in
silence. Their fields that this server does not implement are accepted only at the value that
changes nothing (_unimplemented). Nested objects (messages, tools) ignore unknown keys: clients
send back assistant messages as they received them. Responses are built as plain dicts in the
serving modules (their shapes are documented there and in docs/api.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt

# Limits that turn hostile requests into clear 400s (vLLM's max_logprobs default is 20).
# The body size and the completions per request are server flags (ServerLimits).
MAX_N = 128
MAX_LOGPROBS = 20
MAX_STOP_STRINGS = 64
MAX_STOP_STRING_CHARS = 1024


@dataclass(frozen=True)
class ServerLimits:
    """Per-request limits of the server (flags of `minivllm serve`; docs/serving.md)."""

    max_body_bytes: int = 8 << 20  # --max-request-body-bytes: 413 above (Content-Length first)
    read_timeout_s: float = 30.0  # --timeout-request-read: for the head, then for the body
    max_prompts_per_request: int = 1024  # --max-prompts-per-request: prompts x n, 400 above

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1 or self.max_prompts_per_request < 1:
            raise ValueError("--max-request-body-bytes and --max-prompts-per-request must be >= 1")
        if not self.read_timeout_s > 0:
            raise ValueError("--timeout-request-read must be > 0")


def _number(value: Any) -> Any:
    """A JSON number, nothing else: pydantic's lax float would take true (as 1.0) and "0.5"."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    return value


Number = Annotated[float, BeforeValidator(_number)]


class _Request(BaseModel):
    # NaN and infinities are never valid sampling values (vLLM rejects them too).
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False


def _unimplemented(*no_ops: Any) -> Any:
    """A field of OpenAI's or vLLM's requests that this server does not implement: accepted
    when null or one of no_ops (values that change nothing), any other value is a 400 naming
    it (params.check_unimplemented), never a field dropped in silence."""
    return Field(default=None, json_schema_extra={"unimplemented": list(no_ops)})


class _SamplingFields(_Request):
    """Fields shared by completions and chat (OpenAI's, then vLLM's extras)."""

    # A body's fields are these and no others (the module's docstring).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str | None = None
    max_tokens: StrictInt | None = None
    temperature: Number | None = None
    top_p: Number | None = None
    n: StrictInt = 1
    # Accepted only to refuse a value other than n with a clear message (params.py).
    best_of: StrictInt | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[str, Number] | None = None
    user: str | None = None
    # vLLM's extras
    top_k: StrictInt | None = None
    min_p: Number | None = None
    repetition_penalty: Number | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    min_tokens: StrictInt = 0
    skip_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False
    # Per prompt token its logprob and the top k (not streamed: logprobs.prompt_logprobs)
    prompt_logprobs: StrictInt | None = None
    # Only these ids may be sampled (SamplingParams.allowed_token_ids)
    allowed_token_ids: list[StrictInt] | None = None
    # Words never written (SamplingParams.bad_words)
    bad_words: list[str] | None = None
    # Most tokens inside a <think> block, then its end is forced (vLLM's)
    thinking_token_budget: StrictInt | None = None
    # Keep this many prompt tokens (-1: what max_model_len leaves beside max_tokens), cut on
    # the tokenizer's truncation_side (params.truncate_prompt), as vLLM 0.20 does
    truncate_prompt_tokens: StrictInt | None = None
    # The prompt's and the output's token ids beside the text (vLLM's; agents and RL rollouts
    # read them rather than tokenize the text again)
    return_token_ids: StrictBool = False
    # SGLang's: true asks for each choice's routed experts (a 400 where the server records
    # none), false leaves them out; unset, they come whenever the server records them, as in
    # vLLM (openai/routed_experts.py)
    return_routed_experts: StrictBool | None = None
    # Prefix-cache blocks are shared only with requests of the same salt (vLLM's: tenants
    # that must not learn each other's prompts from cache hits)
    cache_salt: str | None = Field(default=None, min_length=1)
    # Under --scheduling-policy priority, a lower value is served first (vLLM's)
    priority: StrictInt = 0
    # The response's id is "{cmpl|chatcmpl}-{request_id}" (vLLM's; X-Request-Id wins)
    request_id: str | None = None
    # Logprobs' tokens as "token_id:{id}" (vLLM's; logprobs.py)
    return_tokens_as_token_ids: StrictBool = False
    guided_decoding_backend: str | None = None  # accepted: llguidance is the one backend
    # OpenAI's, about the account or the caller; nothing in the output depends on them
    store: StrictBool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's that this server does not implement
    use_beam_search: Any = _unimplemented(False)
    length_penalty: Any = _unimplemented(1.0)
    spaces_between_special_tokens: Any = _unimplemented(True)
    kv_transfer_params: Any = _unimplemented()
    vllm_xargs: Any = _unimplemented()
    repetition_detection: Any = _unimplemented()
    # SGLang's, which routers in front of a server add to what they forward (vllm-router
    # sends these values)
    no_stop_trim: Any = _unimplemented(False)
    separate_reasoning: Any = _unimplemented(True)
    stream_reasoning: Any = _unimplemented(True)
    return_hidden_states: Any = _unimplemented(False)


class JsonSchemaFormat(_Request):
    """response_format.json_schema: OpenAI's {"name", "description", "schema", "strict"}."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, populate_by_name=True)
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None  # always enforced: the output is constrained to it


class ResponseFormat(_Request):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsField(_Request):
    """vLLM's `structured_outputs` request field; keys we do not honour are a 400."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: StrictBool | None = None
    disable_any_whitespace: StrictBool | None = None


class _ConstrainedFields(_SamplingFields):
    """Structured outputs (constraints.py): OpenAI's response_format, vLLM's
    structured_outputs, and vLLM's pre-0.12 guided_* fields (honoured here)."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None  # refused: JSON whitespace is llguidance's


class CompletionRequest(_ConstrainedFields):
    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    add_special_tokens: StrictBool = True  # the tokenizer's (BOS) before the prompt's text
    # OpenAI's, then vLLM's, that this server does not implement
    suffix: Any = _unimplemented()
    prompt_embeds: Any = _unimplemented()
    logits_processors: Any = _unimplemented()


class FunctionCallIn(_Request):
    name: str
    arguments: str | dict[str, Any]  # OpenAI sends a JSON string; the template gets a dict


class ToolCallIn(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Request):
    role: str
    # A string, or OpenAI's list of parts (only {"type": "text", "text": ...} is supported).
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a "tool" message: the call it answers
    # An assistant's earlier reasoning (vLLM 0.20's name, then the older one).
    reasoning: str | None = None
    reasoning_content: str | None = None


class FunctionDefinition(_Request):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class ChatTool(_Request):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"] = "function"
    function: NamedFunction


class ChatCompletionRequest(_ConstrainedFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    # The tokenizer's special tokens around the rendered text (vLLM's; the template writes
    # them already, so True doubles a BOS)
    add_special_tokens: StrictBool = False
    # Accepted only to refuse it with a clear message: templates come from the server's flags.
    chat_template: str | None = None
    tools: list[ChatTool] | None = None
    # None: "auto" with tools, "none" without (as vLLM and OpenAI)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool = True
    include_reasoning: StrictBool = True  # vLLM's: False drops the reasoning from the reply
    # vLLM's: the reply's content starts with the last message's, when that is the
    # assistant's (a continued message, continue_final_message)
    echo: StrictBool = False
    # OpenAI's, vLLM's: both reach the chat template, as in vLLM (template_kwargs(); the
    # documents as apply_chat_template's own argument)
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    documents: list[dict[str, str]] | None = None
    # vLLM's, then OpenAI's, that this server does not implement
    media_io_kwargs: Any = _unimplemented()
    mm_processor_kwargs: Any = _unimplemented()
    functions: Any = _unimplemented()
    function_call: Any = _unimplemented()
    audio: Any = _unimplemented()
    modalities: Any = _unimplemented(["text"])
    prediction: Any = _unimplemented()
    web_search_options: Any = _unimplemented()
    verbosity: Any = _unimplemented()

    def template_kwargs(self) -> dict[str, Any] | None:
        """The chat template's keyword arguments: chat_template_kwargs, with reasoning_effort
        when the request has it (chat_template_kwargs' own key wins)."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort} | (self.chat_template_kwargs or {})


class TokenizeRequest(_Request):
    """Either a completion-style prompt or chat-style messages, with the tools the template
    renders beside them (vLLM's /tokenize: the count is the chat request's prompt_tokens).
    Other fields are ignored: vllm-router's cache_aware policy posts a whole chat or
    completion body here to learn its prompt's tokens (docs/serving.md, section 6)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[ChatTool] | None = None
    # None: True for a prompt, False for messages (the chat template writes them), as vLLM
    add_special_tokens: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    return_token_strs: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    chat_template: str | None = None  # refused, as on chat: templates are the server's
    mm_processor_kwargs: Any = _unimplemented()
    media_io_kwargs: Any = _unimplemented()


class DetokenizeRequest(_Request):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model: str | None = None
    tokens: list[StrictInt]

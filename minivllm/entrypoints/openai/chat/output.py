"""What a chat choice's text becomes: reasoning (--reasoning-parser), content and tool calls
(tool_choice, --tool-call-parser), for the whole message or as stream deltas; and the
request's tool mode with the constraint a forced tool choice puts on the output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from minivllm.entrypoints.openai.constraints import named_tool_schema, required_tool_schema
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest
from minivllm.entrypoints.parsers.reasoning import REASONING_PARSERS
from minivllm.entrypoints.parsers.reasoning.constraint import ReasoningStart
from minivllm.entrypoints.parsers.tools import CALL_MARKERS, TOOL_PARSERS
from minivllm.entrypoints.parsers.tools.base import StreamDelta, ToolCall
from minivllm.entrypoints.parsers.tools.forced import (
    NamedToolStream,
    RequiredToolStream,
    extract_required,
)
from minivllm.entrypoints.server.errors import APIError

ToolMode = Literal["none", "auto", "named", "required"]


@dataclass(frozen=True)
class ChatOutputSpec:
    """How one request's choices are parsed (the same for each of its n choices)."""

    tool_mode: ToolMode = "none"
    tool_parser: str | None = None  # for "auto"
    tool_name: str | None = None  # for "named"
    reasoning_parser: str | None = None  # None: no reasoning split
    prompt_opens_reasoning: bool = False
    reasoning_call_marker: str | None = None  # starts content inside the reasoning too
    include_reasoning: bool = True
    parallel_tool_calls: bool = True  # False: "auto" keeps the first call only (as vLLM)
    # The tools' parameter schemas by name: how the XML format's values are typed.
    tool_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def parses(self) -> bool:
        """Whether choices are parsed at all (else the text is the content as it is)."""
        return self.tool_mode != "none" or self.reasoning_parser is not None


def output_spec(
    req: ChatCompletionRequest,
    mode: ToolMode,
    tool_parser: str | None,
    reasoning_parser: str | None,
    start: ReasoningStart,
) -> ChatOutputSpec:
    """The request's ChatOutputSpec; start: where the output starts (reasoning_start)."""
    return ChatOutputSpec(
        tool_mode=mode,
        tool_parser=tool_parser,
        tool_name=req.tool_choice.function.name if mode == "named" else None,
        reasoning_parser=reasoning_parser,
        prompt_opens_reasoning=start == "inside",
        # A call the model writes before it closes its thinking ends the reasoning (as
        # vLLM's qwen3 parser does), so that it reaches the tool parser.
        reasoning_call_marker=CALL_MARKERS.get(tool_parser) if mode == "auto" else None,
        include_reasoning=req.include_reasoning,
        parallel_tool_calls=req.parallel_tool_calls,
        tool_schemas={t.function.name: t.function.parameters or {} for t in req.tools or []},
    )


def tool_mode(
    req: ChatCompletionRequest, tool_parser: str | None
) -> tuple[ToolMode, dict[str, Any] | None]:
    """(the request's tool mode, the JSON schema a forced call constrains the output to), or
    a 400 for a tool_choice the request or the server cannot honour (vLLM's rules)."""
    choice = req.tool_choice
    if req.tools is not None and not req.tools:
        raise APIError("tools must not be an empty array; omit it instead", param="tools")
    if not req.tools:
        if choice not in (None, "none"):
            raise APIError("tool_choice needs tools", param="tool_choice")
        return "none", None
    if choice == "none":
        return "none", None
    if choice == "required":
        return "required", required_tool_schema(req.tools, req.parallel_tool_calls)
    if choice is None or choice == "auto":
        if tool_parser is None:
            raise APIError(
                '"auto" tool choice (the default with tools) requires the server to run with '
                "--enable-auto-tool-choice and --tool-call-parser",
                param="tool_choice",
            )
        return "auto", None
    return "named", named_tool_schema(req.tools, choice)


class ChoiceParser:
    """One choice's text in pieces -> delta fields ({"reasoning", "content", "tool_calls"});
    the final piece also flushes what was held back (the start of a tag)."""

    def __init__(self, spec: ChatOutputSpec) -> None:
        self.spec = spec
        self._reasoning = None
        if spec.reasoning_parser is not None:
            self._reasoning = REASONING_PARSERS[spec.reasoning_parser](
                spec.prompt_opens_reasoning, spec.reasoning_call_marker
            )
        self._tools = None
        if spec.tool_mode == "auto":
            self._tools = TOOL_PARSERS[spec.tool_parser][1](spec.tool_schemas)
        elif spec.tool_mode == "named":
            self._tools = NamedToolStream(spec.tool_name)
        elif spec.tool_mode == "required":
            self._tools = RequiredToolStream()

    def feed(self, text: str, final: bool = False) -> dict[str, Any]:
        reasoning, content = "", text
        if self._reasoning is not None:
            reasoning, content = self._reasoning.feed(text)
            if final:
                more_reasoning, more_content = self._reasoning.finish()
                reasoning, content = reasoning + more_reasoning, content + more_content
        delta = StreamDelta(content=content)
        if self._tools is not None:
            delta = self._tools.feed(content) if content else StreamDelta()
            if final:
                delta.add(self._tools.finish())
        fields: dict[str, Any] = {}
        if reasoning and self.spec.include_reasoning:
            fields.update(reasoning=reasoning, reasoning_content=reasoning)
        if delta.content:
            fields["content"] = delta.content
        calls = delta.tool_calls
        if not self.spec.parallel_tool_calls:
            calls = [d for d in calls if d["index"] == 0]
        if calls:
            fields["tool_calls"] = calls
        return fields

    def finish_reason(self, engine_reason: str | None) -> str | None:
        called = self._tools is not None and self._tools.num_calls > 0
        return "tool_calls" if called and engine_reason == "stop" else engine_reason


def one_delta_per_call(fields: dict[str, Any]) -> list[dict[str, Any]]:
    """A piece's delta fields as consecutive deltas, each with at most one tool-call delta of a
    call (as OpenAI streams): a call's header and its first arguments, which arrive in one
    piece when a step adds several tokens (jump-forward, speculative decoding), become two
    chunks, so that a client reading a chunk's calls by index, or only its first, misses no
    fragment. The first delta keeps the other fields."""
    groups: list[list[dict[str, Any]]] = [[]]
    for call in fields.get("tool_calls", []):
        if any(seen["index"] == call["index"] for seen in groups[-1]):
            groups.append([])
        groups[-1].append(call)
    if len(groups) == 1:
        return [fields]
    return [{**fields, "tool_calls": groups[0]}] + [{"tool_calls": g} for g in groups[1:]]


def full_message(
    spec: ChatOutputSpec, text: str, engine_reason: str | None
) -> tuple[dict, str | None]:
    """(the assistant message, the finish reason) of a whole choice."""
    reasoning = None
    if spec.reasoning_parser is not None:
        parser = REASONING_PARSERS[spec.reasoning_parser](
            spec.prompt_opens_reasoning, spec.reasoning_call_marker
        )
        parts = [parser.feed(text), parser.finish()]
        reasoning = "".join(r for r, _ in parts)
        text = "".join(c for _, c in parts)
    content: str | None = text
    calls: list[ToolCall] | None = None
    if spec.tool_mode == "auto":
        calls, content = TOOL_PARSERS[spec.tool_parser][0](text, spec.tool_schemas)
        calls = calls if spec.parallel_tool_calls else calls[:1]
    elif spec.tool_mode == "named":
        # Nothing after the reasoning (cut short while thinking): no call, as streamed.
        calls, content = ([ToolCall(spec.tool_name, text)] if text else []), None
    elif spec.tool_mode == "required":
        calls, content = extract_required(text), None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None and spec.include_reasoning:
        # vLLM 0.20's field, and the older name many clients still read.
        message.update(reasoning=reasoning or None, reasoning_content=reasoning or None)
    message["tool_calls"] = [c.to_dict() for c in calls or []]
    called = bool(calls) and engine_reason == "stop"
    return message, "tool_calls" if called else engine_reason

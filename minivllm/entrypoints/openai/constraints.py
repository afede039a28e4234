"""A request's structured-output constraint: from response_format, structured_outputs, the
guided_* aliases or a forced tool choice to one StructuredOutputsParams, compiled by the engine
core before the request is queued (once: the request finds it cached there), so that a spec
that cannot be honoured is a 400."""

from __future__ import annotations

from typing import Any

from minivllm.entrypoints.async_llm import AsyncLLM, EngineDeadError
from minivllm.entrypoints.openai.protocol import ChatTool, NamedToolChoice
from minivllm.entrypoints.server.errors import APIError
from minivllm.entrypoints.server.serving_common import as_api_error
from minivllm.structured_output.compiler import CompilerBusy
from minivllm.structured_output.params import StructuredOutputsParams

_GUIDED = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}


def request_constraint(
    req: Any, tool_schema: dict | None = None
) -> tuple[str, StructuredOutputsParams] | None:
    """(the field it came from, the one constraint a request asks for), or None. Two at once
    (response_format and guided_json, a forced tool choice and structured_outputs, ...) are a
    400 naming both; a malformed one a 400 naming its field. tool_schema: a forced tool
    call's schema."""
    if req.guided_whitespace_pattern is not None:
        raise APIError(
            "guided_whitespace_pattern is not supported (JSON whitespace is flexible; "
            "structured_outputs' disable_any_whitespace makes it compact)",
            param="guided_whitespace_pattern",
        )
    given: list[tuple[str, dict[str, Any]]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        given.append(("response_format", _from_response_format(fmt)))
    so = req.structured_outputs
    if so is not None:
        fields = {k: v for k, v in so.model_dump(by_alias=True).items() if v is not None}
        given.append(("structured_outputs", fields))
    for name, kind in _GUIDED.items():
        value = getattr(req, name)
        if value is not None:
            given.append((name, {kind: value}))
    if tool_schema is not None:
        given.append(("tool_choice", {"json": tool_schema}))
    if not given:
        return None
    if len(given) > 1:
        names = " and ".join(name for name, _ in given)
        raise APIError(
            f"only one structured output constraint per request; got {names}",
            param=given[1][0],
        )
    name, fields = given[0]
    try:
        return name, StructuredOutputsParams(**fields)
    except (ValueError, TypeError) as e:
        raise APIError(f"invalid {name}: {e}", param=name) from None


def _from_response_format(fmt: Any) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"json_object": True}
    if fmt.json_schema is None or fmt.json_schema.json_schema is None:
        raise APIError(
            'response_format of type "json_schema" needs json_schema.schema',
            param="response_format.json_schema",
        )
    return {"json": fmt.json_schema.json_schema}


async def check_constraint(
    engine: AsyncLLM, constraint: tuple[str, StructuredOutputsParams] | None
) -> None:
    """Has the engine core compile the constraint (cached by spec) while the loop goes on; a
    schema, regex or grammar the grammar engine cannot honour is a 400 naming the problem and
    the field; no compile worker free, a 503 with Retry-After; a grammar engine that cannot
    run in this environment, a 500 saying why."""
    if constraint is None:
        return
    name, params = constraint
    try:
        await engine.check_grammar(params, refuse_when_busy=True)
    except EngineDeadError as e:
        raise as_api_error(e) from None
    except CompilerBusy as e:  # other requests' compiles hold every worker
        retry = {"Retry-After": str(e.retry_after_s)}
        raise APIError(f"{name}: {e}", status=503, param=name, headers=retry) from None
    except (ValueError, TypeError) as e:
        raise APIError(f"{name}: {e}", param=name) from None
    except RuntimeError as e:  # the grammar backend cannot be built there (an old llguidance)
        raise APIError(f"{name}: {e}", status=500, param=name) from None


# ---- forced tool calls (tool_choice "required" or a named function) --------------------------
# The server reads these outputs, so their whitespace carries nothing: it is fixed (llguidance's
# option), which also keeps a weak model from spending its tokens on free whitespace.
_COMPACT = {"x-guidance": {"whitespace_flexible": False}}


def _parameters(tool: ChatTool) -> dict[str, Any]:
    return tool.function.parameters or {"type": "object", "properties": {}}


def named_tool_schema(tools: list[ChatTool], choice: NamedToolChoice) -> dict[str, Any]:
    """The named function's parameters: the output is its arguments (as vLLM)."""
    for tool in tools:
        if tool.function.name == choice.function.name:
            return {**_COMPACT, **_parameters(tool)}
    raise APIError(
        f"tool_choice names {choice.function.name!r}, which is not in tools",
        param="tool_choice",
    )


def required_tool_schema(tools: list[ChatTool], parallel_tool_calls: bool) -> dict[str, Any]:
    """vLLM's schema for tool_choice "required": a non-empty array of {"name", "parameters"},
    each item one of the tools. Each tool's $defs move to the root, where its "#/$defs/..."
    references point once it is nested."""
    defs: dict[str, Any] = {}
    items = []
    for tool in tools:
        parameters = dict(_parameters(tool))
        tool_defs = parameters.pop("$defs", {})
        if not isinstance(tool_defs, dict):
            raise APIError(
                f"tool {tool.function.name!r}: its schema's $defs must be an object, "
                f"got {type(tool_defs).__name__}",
                param="tools",
            )
        for key, value in tool_defs.items():
            if key in defs and defs[key] != value:
                raise APIError(f"tools define $defs {key!r} differently; rename one", param="tools")
            defs[key] = value
        items.append(
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [tool.function.name]},
                    "parameters": parameters,
                },
                "required": ["name", "parameters"],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = {
        **_COMPACT,
        "type": "array",
        "minItems": 1,
        "items": {"anyOf": items},
    }
    if not parallel_tool_calls:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema

"""Tool-call parsers (--tool-call-parser) and the parsing of forced tool calls."""

from minivllm.entrypoints.parsers.tools import hermes, llama3_json

# name -> (whole-output extractor, stream class); vLLM's names.
TOOL_PARSERS = {
    "hermes": (hermes.extract_tool_calls, hermes.HermesToolStream),
    "llama3_json": (llama3_json.extract_tool_calls, llama3_json.Llama3JsonToolStream),
}
# The text a parser's first call starts with, where it has one.
CALL_MARKERS = {"hermes": hermes.START, "llama3_json": llama3_json.PYTHON_TAG}

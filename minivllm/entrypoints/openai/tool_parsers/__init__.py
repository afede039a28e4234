"""Tool-call parsers (--tool-call-parser) and the parsing of forced tool calls."""

from minivllm.entrypoints.openai.tool_parsers.hermes import HermesToolStream, extract_tool_calls

# name -> (whole-output extractor, stream class); vLLM's names.
TOOL_PARSERS = {"hermes": (extract_tool_calls, HermesToolStream)}

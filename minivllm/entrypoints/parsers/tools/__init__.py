"""Tool-call parsers (--tool-call-parser) and the parsing of forced tool calls."""

from minivllm.entrypoints.parsers.tools import hermes, llama3_json, qwen3_xml

# name -> (whole-output extractor (text, schemas), stream class (schemas)); vLLM's names.
# schemas: the request's tools' parameter schemas by name (qwen3_xml.ToolSchemas), which the
# XML format needs to type its values; the JSON formats carry their types.
TOOL_PARSERS = {
    "hermes": (hermes.extract_tool_calls, hermes.HermesToolStream),
    "llama3_json": (llama3_json.extract_tool_calls, llama3_json.Llama3JsonToolStream),
    "qwen3_coder": (qwen3_xml.extract_tool_calls, qwen3_xml.Qwen3XmlToolStream),
    "qwen3_xml": (qwen3_xml.extract_tool_calls, qwen3_xml.Qwen3XmlToolStream),
}
# The text a parser's first call starts with, where it has one.
CALL_MARKERS = {
    "hermes": hermes.START,
    "llama3_json": llama3_json.PYTHON_TAG,
    "qwen3_coder": qwen3_xml.START,
    "qwen3_xml": qwen3_xml.START,
}

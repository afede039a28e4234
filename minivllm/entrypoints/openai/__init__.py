"""The OpenAI-compatible HTTP server (`minivllm serve`)."""

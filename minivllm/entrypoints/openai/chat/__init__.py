"""The chat endpoint's text work: the chat template (template.py) and what a choice's text
becomes, reasoning, content and tool calls (output.py)."""

"""Anthropic's Messages API (POST /v1/messages), served through the chat path."""

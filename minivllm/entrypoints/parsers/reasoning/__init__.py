"""Reasoning parsers (--reasoning-parser): a choice's text split into reasoning and content."""

from minivllm.entrypoints.parsers.reasoning.think import (
    ThinkReasoningStream,
    prompt_opens_reasoning,
)

# vLLM's names; both models write the same <think>...</think> block.
REASONING_PARSERS = {"qwen3": ThinkReasoningStream, "deepseek_r1": ThinkReasoningStream}

__all__ = ["REASONING_PARSERS", "ThinkReasoningStream", "prompt_opens_reasoning"]

"""The `<think>...</think>` reasoning format (Qwen3, DeepSeek-R1): the block's text is the
reasoning, the text after it the content."""

from __future__ import annotations

from minivllm.entrypoints.parsers.tools.base import first_marker, held_back

START, END = "<think>", "</think>"


def prompt_opens_reasoning(prompt: str) -> bool:
    """The prompt ends inside a think block (a template that writes `<think>` itself, as
    DeepSeek-R1's and Qwen3's thinking-only ones do): the output starts in the reasoning."""
    return prompt.rfind(START) > prompt.rfind(END)


class ThinkReasoningStream:
    """Splits one choice's text, piece by piece, into (reasoning, content). The reasoning is
    a `<think>` block at the start of the output (or from the start, if the prompt opened
    it) up to `</think>`; a block never closed (the output was cut short) is all reasoning.
    call_marker (a tool parser's, e.g. `<tool_call>`): where it comes first inside the block,
    the reasoning ends there and the content starts with it, so that a call the model makes
    while thinking reaches the tool parser. Feeding the whole text at once gives the
    non-streaming split: the two always agree."""

    def __init__(self, in_reasoning: bool = False, call_marker: str | None = None) -> None:
        self._state = "reasoning" if in_reasoning else "start"
        self._buffer = ""
        self._ends = (END, call_marker) if call_marker else (END,)

    @property
    def in_content(self) -> bool:
        return self._state == "content"

    def feed(self, text: str) -> tuple[str, str]:
        """(new reasoning, new content); a piece that may be the start of a tag is held."""
        self._buffer += text
        reasoning = content = ""
        if self._state == "start":
            head = self._buffer.lstrip()
            if START.startswith(head):  # blank, or a part of <think> so far
                return "", ""
            if head.startswith(START):
                self._state, self._buffer = "reasoning", head[len(START) :]
            else:
                self._state = "content"
        if self._state == "reasoning":
            found = first_marker(self._buffer, self._ends)
            if found is None:
                keep = held_back(self._buffer, self._ends)
                reasoning = self._buffer[: len(self._buffer) - keep]
                self._buffer = self._buffer[len(reasoning) :]
                return reasoning, ""
            index, tag = found
            reasoning = self._buffer[:index]
            # </think> is dropped; a call marker starts the content.
            self._buffer = self._buffer[index + len(tag) if tag == END else index :]
            self._state = "content"
        content, self._buffer = self._buffer, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        """What was held back, at the end of the output."""
        held, self._buffer = self._buffer, ""
        if self._state == "reasoning":
            return held, ""
        return "", held

"""A request's thinking budget (vLLM's thinking_token_budget): once the output has spent that
many tokens inside a think block, the next tokens are forced to the block's end marker, one
token at a time, until it is written.

The markers are token sequences (`<think>` and `</think>` as the tokenizer encodes them: one
special token each in Qwen3's and DeepSeek-R1's vocabularies, several for a tokenizer without
them), found by exact match at the end of the output. The state is kept incrementally per
request: each step reads only the tokens added since the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class ThinkingBudget:
    budget: int
    start_ids: list[int]
    end_ids: list[int]
    in_think: bool = False
    count: int = 0  # tokens written inside the open think block
    num_seen: int = 0  # output tokens read so far
    # The last tokens read (as many as the longer marker): where a marker is found.
    tail: list[int] = field(default_factory=list)

    @classmethod
    def after_prompt(
        cls, budget: int, start_ids: list[int], end_ids: list[int], prompt: list[int]
    ) -> ThinkingBudget:
        """The state at the output's start: inside a block when the prompt opens one (the
        template started the thinking), its tokens after the marker counted, as vLLM counts."""
        state = cls(budget, start_ids, end_ids)
        start, end = _last_index(prompt, start_ids), _last_index(prompt, end_ids)
        if start > end:
            state.in_think = True
            state.count = len(prompt) - start - len(start_ids)
        state.tail = prompt[-state._tail_len() :]
        return state

    def read(self, output: list[int]) -> None:
        """Reads the output tokens added since the last call."""
        for token_id in output[self.num_seen :]:
            self._step(token_id)
        self.num_seen = len(output)

    def forced_after(self, drafts: list[int]) -> int | None:
        """The token the next position must be (the end marker's next token, once the budget
        is spent inside a block), or None; drafts: tokens before that position that are not
        in the output yet (speculative drafts), read on a copy."""
        state = self
        if drafts:
            state = replace(self, tail=list(self.tail))
            for token_id in drafts:
                state._step(token_id)
        if not state.in_think or state.count < state.budget:
            return None
        return state.end_ids[_prefix_matched(state.tail, state.end_ids)]

    def _step(self, token_id: int) -> None:
        self.tail.append(token_id)
        del self.tail[: -self._tail_len()]
        if _ends_with(self.tail, self.end_ids) and self.in_think:
            self.in_think = False
        elif _ends_with(self.tail, self.start_ids):
            self.in_think, self.count = True, 0
        elif self.in_think:
            self.count += 1

    def _tail_len(self) -> int:
        return max(len(self.start_ids), len(self.end_ids))


def _ends_with(tokens: list[int], marker: list[int]) -> bool:
    return len(tokens) >= len(marker) and tokens[len(tokens) - len(marker) :] == marker


def _prefix_matched(tokens: list[int], marker: list[int]) -> int:
    """How many of the marker's first tokens the tokens end with (fewer than all of it)."""
    for n in range(min(len(marker) - 1, len(tokens)), 0, -1):
        if tokens[len(tokens) - n :] == marker[:n]:
            return n
    return 0


def _last_index(tokens: list[int], marker: list[int]) -> int:
    """Where the marker last starts in tokens, or -1."""
    for i in range(len(tokens) - len(marker), -1, -1):
        if tokens[i : i + len(marker)] == marker:
            return i
    return -1

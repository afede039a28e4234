"""Text-side processing: prompt text checks, incremental detokenization, stop strings,
logprob text.

Pure Python over a HF tokenizer; never touches tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from minivllm.outputs import LogprobsDict

# Prompt tokens decoded ahead of the first output token, so that it is decoded in context
# (leading spaces of SentencePiece tokenizers, a character split across the boundary).
_NUM_CONTEXT_TOKENS = 5
_REPLACEMENT_CHAR = "\ufffd"


def check_unicode(text: str, what: str = "the prompt") -> None:
    """ValueError unless text is valid Unicode: a lone surrogate ("\\ud800" in JSON, or a
    file read with errors="surrogateescape") is a Python str but no text a tokenizer takes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not valid Unicode: {e}") from None


def bad_words_token_ids(bad_words: list[str], tokenizer: Any) -> list[list[int]]:
    """The token ids of each bad word as the output could write it: at the start of a text
    (the word without leading spaces) and after a space, the latter only where the space
    makes another first token and the same number of tokens (vLLM's rule)."""
    result: list[list[int]] = []
    for word in bad_words:
        alone = tokenizer.encode(word.lstrip(), add_special_tokens=False)
        result.append(alone)
        spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
        if spaced[0] != alone[0] and len(spaced) == len(alone):
            result.append(spaced)
    return result


def think_marker_ids(tokenizer: Any) -> list[list[int]]:
    """The token ids of `<think>` and `</think>` as the tokenizer writes them (one special
    token each in Qwen3's and DeepSeek-R1's vocabularies; several where they are plain text)."""
    return [tokenizer.encode(m, add_special_tokens=False) for m in ("<think>", "</think>")]


def make_decode(tokenizer: Any, skip_special_tokens: bool) -> Callable[[list[int]], str]:
    """tokenizer.decode(ids, skip_special_tokens, clean_up_tokenization_spaces=False) as one
    call. For a plain HF fast tokenizer that is exactly its Rust backend's decode: calling it
    directly skips transformers' Python wrapper, most of the cost of a streamed token."""
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    if isinstance(tokenizer, TokenizersBackend) and (
        type(tokenizer)._decode is TokenizersBackend._decode
        and type(tokenizer).decode is TokenizersBackend.decode
    ):
        return partial(tokenizer._tokenizer.decode, skip_special_tokens=skip_special_tokens)
    # No clean-up of spaces: it is not stable under concatenation (vLLM does not apply it).
    return partial(
        tokenizer.decode,
        skip_special_tokens=skip_special_tokens,
        clean_up_tokenization_spaces=False,
    )


class IncrementalDetokenizer:
    """Turns one sequence's output token ids into text, a delta at a time, and finds stop strings.

    add_tokens returns text that is final: an incomplete multi-byte character is held until
    its last byte arrives (or the output ends: then it is kept as U+FFFD, as the tokenizer
    decodes it), and (unless include_stop_str_in_output) the last
    len(longest stop) - 1 characters are held until they cannot start a stop string.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompt_token_ids: list[int],
        skip_special_tokens: bool = True,
        stop: list[str] | None = None,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._decode = make_decode(tokenizer, skip_special_tokens)
        self.stop = list(stop or [])
        self.include_stop_str_in_output = include_stop_str_in_output
        # Decode window: token_ids[prefix_offset:read_offset] is text already produced.
        self._token_ids = list(prompt_token_ids[-_NUM_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._output_text = ""
        self._num_emitted_chars = 0
        self._stop_reason: str | None = None
        hold = max((len(s) for s in self.stop), default=1) - 1
        self._num_held_chars = 0 if include_stop_str_in_output else hold

    @property
    def text(self) -> str:
        """All output text so far, cut at the stop string (kept when include_stop_str_in_output)."""
        return self._output_text

    @property
    def emitted_text(self) -> str:
        """The text add_tokens has returned so far: final, safe to stream."""
        return self._output_text[: self._num_emitted_chars]

    @property
    def stop_reason(self) -> str | None:
        """The stop string that ended the output, if any."""
        return self._stop_reason

    @property
    def stopped(self) -> bool:
        return self._stop_reason is not None

    def add_tokens(
        self, new_token_ids: list[int], finished: bool = False, stopped_by_token: bool = False
    ) -> str:
        """Adds generated tokens; returns the new text that is safe to show.

        finished: the request ends with these tokens, so nothing is held back.
        stopped_by_token: it ended on an EOS / stop token id (the last one), whose text is
        left out unless include_stop_str_in_output.
        """
        if self.stopped:
            return ""
        token_ids = list(new_token_ids)
        if stopped_by_token and not self.include_stop_str_in_output:
            token_ids = token_ids[:-1]
        old_len = len(self._output_text)
        self._output_text += self._decode_new(token_ids, final=finished or stopped_by_token)
        self._find_stop(old_len)
        end = len(self._output_text)
        if not (finished or stopped_by_token or self.stopped):
            end -= self._num_held_chars
        end = max(end, self._num_emitted_chars)
        delta = self._output_text[self._num_emitted_chars : end]
        self._num_emitted_chars = end
        return delta

    def _decode_new(self, token_ids: list[int], final: bool) -> str:
        """Appends token_ids to the window; returns their text once it is complete, or now
        when final (the output ends here, so no later token can complete a character)."""
        self._token_ids.extend(token_ids)
        prefix_text = self._decode(self._token_ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._token_ids[self._prefix_offset :])
        # A trailing U+FFFD is a character whose remaining bytes are in tokens yet to come.
        if len(new_text) <= len(prefix_text) or (
            new_text.endswith(_REPLACEMENT_CHAR) and not final
        ):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._token_ids)
        return new_text[len(prefix_text) :]

    def _find_stop(self, old_len: int) -> None:
        """Cuts the text at the earliest stop string that ends in the text added after old_len."""
        best: tuple[int, str] | None = None
        for stop in self.stop:
            # A match must end in the new text, else an earlier call would have found it.
            index = self._output_text.find(stop, max(0, old_len - len(stop) + 1))
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return
        index, stop = best
        if self.include_stop_str_in_output:
            index += len(stop)
        self._output_text = self._output_text[:index]
        self._stop_reason = stop


class TokenTexts:
    """The text of single token ids, as logprobs show them: each id decoded once, then read
    from a dict (at most one entry per vocabulary id), not once per logprob entry: a step of
    a thousand rows asking for 5 logprobs would otherwise decode thousands of ids. The ids
    not yet known are decoded together, by the fast tokenizer's own batch decode where there
    is one (`learn`: a third of the cost of decode's Python call per id)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decode_batch = getattr(backend, "decode_batch", None)

    def __call__(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
            self._texts[token_id] = text
        return text

    def learn(self, token_ids: Iterable[int]) -> None:
        """Decodes the ids among token_ids not decoded before, in one batch call where the
        tokenizer has one (a step's logprobs, whose ids are mostly new at first)."""
        texts = self._texts
        missing = {t for t in token_ids if t not in texts}
        if len(missing) > 1 and self._decode_batch is not None:
            missing_list = list(missing)
            texts.update(zip(missing_list, self._decode_batch([[t] for t in missing_list], False)))

    def fill(self, logprobs: list[LogprobsDict]) -> None:
        """Sets decoded_token in every entry of logprobs (a step's dicts), the ids new to it
        decoded in one batch."""
        self.learn(token_id for entry in logprobs for token_id in entry)
        for entry in logprobs:
            decode_logprobs(self, entry)


def decode_logprobs(token_texts: TokenTexts, logprobs: LogprobsDict) -> LogprobsDict:
    """Fills decoded_token of every entry with the text of its single token id; returns it."""
    for token_id, logprob in logprobs.items():
        logprob.decoded_token = token_texts(token_id)
    return logprobs

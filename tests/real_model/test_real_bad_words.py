"""bad_words on the demo model: a banned word, one token or several, is not in the answer,
which goes on around it."""

from __future__ import annotations

from minivllm import SamplingParams

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def answer(llm, bad_words: list[str] | None) -> str:
    params = SamplingParams(temperature=0.0, max_tokens=30, bad_words=bad_words)
    return llm.chat(MESSAGES, params, use_tqdm=False)[0].outputs[0].text


def test_bad_words_are_kept_out_of_the_answer(gguf_llm) -> None:
    free = answer(gguf_llm, None)
    assert "Paris" in free and "capital of France" in free
    # " Paris" is one token; "capital of France" three, its last banned after the other two.
    for word in ("Paris", "capital of France"):
        banned = answer(gguf_llm, [word])
        assert word not in banned and banned.startswith("The capital of"), (word, banned)

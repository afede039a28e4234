"""The yes/no reranker's prompt (Qwen3-Reranker's, from its model card): a system turn that
asks for "yes" or "no", the instruction, query and document in the user turn, an empty
thinking block, and the score read from the logits of "yes" and "no" at the last position.
Applied server-side, so a client sends only the query and the documents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minivllm.pooling.params import PoolingParams

SYSTEM = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
ASSISTANT = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
BODY = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
CHAT_MARKERS = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True)
class RerankTemplate:
    """The template's fixed token ids (prefix, suffix) and the answer tokens' ids."""

    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    false_id: int
    true_id: int

    @property
    def params(self) -> PoolingParams:
        return PoolingParams("score", "last", False, None, (self.false_id, self.true_id))

    def prompt_ids(
        self, tokenizer: Any, query: str, document: str, instruction: str | None = None
    ) -> list[int]:
        """The token ids of one (query, document) pair: prefix, the body tokenized alone
        (as the model card does), suffix."""
        body = BODY.format(
            instruction=DEFAULT_INSTRUCTION if instruction is None else instruction,
            query=query,
            document=document,
        )
        body_ids = tokenizer.encode(body, add_special_tokens=False)
        return [*self.prefix_ids, *body_ids, *self.suffix_ids]


def load_rerank_template(tokenizer: Any) -> RerankTemplate:
    """The template over this tokenizer; ValueError when it lacks what the template needs
    (the ChatML markers as special tokens, "yes" and "no" as single tokens)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    vocab = get_vocab() if callable(get_vocab) else {}
    missing = [t for t in (*CHAT_MARKERS, "yes", "no") if t not in vocab]
    if missing:
        raise ValueError(
            f"this model cannot score with the yes/no reranker template: its tokenizer has "
            f"no token {missing} (a Qwen3-Reranker checkpoint has them)"
        )
    return RerankTemplate(
        prefix_ids=tuple(tokenizer.encode(SYSTEM, add_special_tokens=False)),
        suffix_ids=tuple(tokenizer.encode(ASSISTANT, add_special_tokens=False)),
        false_id=vocab["no"],
        true_id=vocab["yes"],
    )

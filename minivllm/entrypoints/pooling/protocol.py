"""Request bodies of the pooling routes (pydantic): OpenAI's embeddings, Cohere's / Jina's
rerank, vLLM's score. Unknown fields are refused (a 400 naming them), as on completions."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EmbeddingRequest(_Request):
    """input: a text, a list of texts, token ids, or a list of token-id lists (OpenAI's)."""

    model: str | None = None
    input: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: str | None = None  # OpenAI's: accepted, unused


class RerankDocument(_Request):
    text: StrictStr


class RerankRequest(_Request):
    """Cohere's and Jina's shape (vLLM's /v1/rerank and /rerank). top_n 0 or absent: all.
    instruction: the reranker's (vLLM's field; default the model card's)."""

    model: str | None = None
    query: StrictStr
    documents: list[StrictStr | RerankDocument]
    top_n: StrictInt | None = Field(default=None, ge=0)
    return_documents: StrictBool = True
    instruction: StrictStr | None = None


class ScoreRequest(_Request):
    """vLLM's /score: text_1 against text_2 (or queries against documents): one first text
    for every second text, or one for each."""

    model: str | None = None
    text_1: StrictStr | list[StrictStr] | None = None
    text_2: StrictStr | list[StrictStr] | None = None
    queries: StrictStr | list[StrictStr] | None = None
    documents: StrictStr | list[StrictStr] | None = None
    instruction: StrictStr | None = None

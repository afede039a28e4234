"""LLM.score (the yes/no reranker) against transformers: the template's prompt, the last
position's logits of "yes" and "no", sigmoid of their difference; and the template itself."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm import LLM
from minivllm.pooling.rerank import load_rerank_template

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "The quick brown fox.", "Water is wet."]
CPU = dict(dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=256)


def hf_score(model_dir: str, query: str, document: str) -> float:
    """Qwen3-Reranker's model card, written out: the formatted pair, then the logits."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
        'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
        "<|im_end|>\n<|im_start|>user\n"
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    body = (
        "<Instruct>: Given a web search query, retrieve relevant passages that answer the "
        f"query\n<Query>: {query}\n<Document>: {document}"
    )
    ids = (
        tokenizer.encode(prefix, add_special_tokens=False)
        + tokenizer.encode(body, add_special_tokens=False)
        + tokenizer.encode(suffix, add_special_tokens=False)
    )
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    return torch.sigmoid(logits[yes] - logits[no]).item()


def test_scores_equal_transformers(reranker_dir: str) -> None:
    want = [hf_score(reranker_dir, QUERY, d) for d in DOCUMENTS]
    assert max(want) - min(want) > 1e-3  # the documents score apart
    llm = LLM(reranker_dir, task="score", max_num_batched_tokens=32, **CPU)
    got = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS, use_tqdm=False)]
    assert got == pytest.approx(want, abs=1e-5)
    alone = llm.score(QUERY, DOCUMENTS[1], use_tqdm=False)[0].outputs.score
    assert alone == pytest.approx(want[1], abs=1e-5)
    pairwise = llm.score([QUERY, "x"], DOCUMENTS[:2], use_tqdm=False)
    assert pairwise[0].outputs.score == pytest.approx(want[0], abs=1e-5)


def test_score_refuses_bad_input(reranker_dir: str, tiny_qwen3_dir: str) -> None:
    llm = LLM(reranker_dir, task="score", **CPU)
    with pytest.raises(ValueError, match="documents is empty"):
        llm.score(QUERY, [], use_tqdm=False)
    with pytest.raises(ValueError, match="2 queries for 3 documents"):
        llm.score([QUERY, QUERY], DOCUMENTS, use_tqdm=False)
    with pytest.raises(ValueError, match="task='score'"):
        LLM(reranker_dir, task="embed", **CPU).score(QUERY, DOCUMENTS, use_tqdm=False)
    # A tokenizer without "yes" and "no" cannot take the template.
    with pytest.raises(ValueError, match="yes/no reranker"):
        load_rerank_template(AutoTokenizer.from_pretrained(tiny_qwen3_dir))

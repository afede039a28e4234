"""Pooling models: embeddings and reranker scores read from a decoder's hidden states.

params.py (what a pooling request asks, plain data), config.py (the pooling the model's files
declare), ops.py (truncation, normalisation, scores), rerank.py (the reranker's prompt),
outputs.py (vLLM-shaped results). The runner's side is engine/runner/pooling.py.
"""

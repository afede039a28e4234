"""Pooling frontends: the offline LLM.embed / LLM.score (offline.py) and the server's
/v1/embeddings, /v1/rerank, /rerank and /score routes (routes.py)."""

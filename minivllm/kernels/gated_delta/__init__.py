"""Gated DeltaNet kernels (Qwen3.5's linear-attention layers): the causal conv1d (`conv1d.py`),
the chunked gated delta rule for prefill (`chunk_layout.py`, `chunk_kernels.py`, `prefill.py`)
and its one-token recurrent step for decode (`decode.py`). Torch references: `layers/`."""

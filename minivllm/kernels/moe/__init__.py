"""Fused mixture-of-experts kernels: the step's (token, expert) pairs sorted by expert and
padded to row blocks (`align.py`), grouped GEMMs over the blocks (`grouped_gemm.py`), the
per-token sum over the top-k (`topk_sum.py`), tiles per shape (`configs.py`), the whole
layer's launch (`fused_moe.py`). Torch definition: `layers/moe_experts.py`."""

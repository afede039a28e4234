"""Fused mixture-of-experts kernels: the router's top-k (`router.py`), the step's (token,
expert) pairs grouped by expert and padded to row blocks (`align.py`), grouped GEMMs over the
blocks (`grouped_gemm.py`), the per-token sum over the top-k (`topk_sum.py`), tiles per shape
(`configs.py`), the experts' launches (`fused_moe.py`); a small step's GEMVs, without
alignment (`gemv.py`). Torch definitions: `layers/moe_router.py`,
`layers/moe_experts.py`."""

"""Attention tiles per element size: every default config fits shared memory, float32 too."""

from __future__ import annotations

import pytest
import torch
import triton
from test_decode_attention import _run as run_decode
from test_prefill_attention import _run as run_prefill

from minivllm.kernels import decode_attention as decode
from minivllm.kernels import prefill_attention as prefill
from minivllm.kernels.tiling import SHARED_MEMORY_BUDGET, attention_smem_bytes

# Per-block opt-in shared memory of H100/H200 (227 KB), less the few hundred bytes Triton adds.
HOPPER_LIMIT = 232448 - 1024
SHAPES = [(hd, rows, group) for hd in (64, 80, 128, 256) for rows in (16, 8192) for group in (1, 8)]


def test_float32_table_config_overflowed_before() -> None:
    """What crashed on the H200: the 2-byte table's hd128 large tiles in float32."""
    large = dict(prefill._CONFIGS)[128][0]
    block_m, block_n, _, stages = large
    assert attention_smem_bytes(4, 128, block_m, block_n, stages) > HOPPER_LIMIT


@pytest.mark.parametrize("elem_size", [2, 4])
@pytest.mark.parametrize("head_dim,num_rows,group", SHAPES)
def test_default_configs_fit(elem_size: int, head_dim: int, num_rows: int, group: int) -> None:
    block_d = triton.next_power_of_2(head_dim)
    block_m, block_n, _, stages = prefill.prefill_config(head_dim, num_rows, group, 8, elem_size)
    assert attention_smem_bytes(elem_size, block_d, block_m, block_n, stages) <= HOPPER_LIMIT
    assert block_n >= 16 and block_m >= 16 and stages >= 2
    block_n, _, stages = decode.decode_config(head_dim, elem_size)
    assert attention_smem_bytes(elem_size, block_d, 16, block_n, stages) <= SHARED_MEMORY_BUDGET


def test_two_byte_tables_are_unchanged() -> None:
    for bound, (large, small) in prefill._CONFIGS:
        assert prefill.prefill_config(bound, 1 << 20, 1, 8, 2) == large
        assert prefill.prefill_config(bound, 16, 1, 1, 2) == small
    for bound, cfg in decode._CONFIGS:
        assert decode.decode_config(bound, 2) == cfg


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("head_dim", [128, 256])
def test_float32_real_size_default_config(head_dim: int) -> None:
    # 3,600 rows x group 2 x 8 kv heads: the large prefill config, which used to need 256 KB.
    seq_lens, query_lens = [2048, 1000, 600], [2048, 1000, 552]
    run_prefill(
        seq_lens, query_lens, 16, 8, head_dim, 16, torch.float32, block_m=None, block_n=None
    )
    run_decode([1000, 1, 2047, 64], 16, 8, head_dim, 16, torch.float32, 8)

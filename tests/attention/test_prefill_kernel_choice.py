"""Which prefill kernel the triton backend runs (EngineConfig.prefill_attention_kernel): Gluon's
where it can and the prefill is large enough, Triton's elsewhere, and a clear error where
"gluon" is insisted on but cannot run."""

from __future__ import annotations

import re

import pytest
import torch

from minivllm.attention.selector import get_attn_backend
from minivllm.attention.triton import GLUON_MIN_WORK, TritonBackend
from minivllm.config import EngineConfig
from minivllm.kernels import gluon_prefill_attention as gluon
from minivllm.kernels.checks import FP8_KV_DTYPE
from minivllm.kernels.prefill_attention import prefill_attention

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
GLUON_HERE = HOPPER and gluon.GLUON_IMPORT_ERROR is None


def tensors(dtype: torch.dtype, cache_dtype: torch.dtype, device: str, block_size: int = 16):
    q = torch.zeros(32, 4, 128, dtype=dtype, device=device)
    cache = torch.zeros(2, 8, block_size, 2, 128, device=device).to(cache_dtype)
    return q, cache


@pytest.mark.skipif(GLUON_HERE, reason="Gluon runs on this GPU")
def test_gluon_insisted_on_where_it_cannot_run_is_an_error_naming_why():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with pytest.raises(ValueError, match="prefill_attention_kernel='gluon' cannot run here: "):
        TritonBackend(8, 512, 4, 128, device, num_kv_heads=2, prefill_kernel="gluon")
    auto = TritonBackend(8, 512, 4, 128, device, num_kv_heads=2)
    assert auto.prefill_kernel == "triton"
    large = GLUON_MIN_WORK
    assert (
        auto._prefill_fn(*tensors(torch.float32, torch.float32, device), large) is prefill_attention
    )


def test_auto_takes_gluon_only_for_prefills_that_repay_its_launch(monkeypatch):
    """The size rule alone, with Gluon pretended to support the tensors (so it runs anywhere);
    "gluon" insisted on takes it at any size."""
    monkeypatch.setattr(gluon, "supports", lambda q, kv_cache: True)
    auto = TritonBackend(8, 512, 4, 128, "cpu", num_kv_heads=2)
    auto.prefill_kernel = "auto"  # as on a GPU where Gluon runs
    args = tensors(torch.bfloat16, torch.bfloat16, "cpu")
    assert auto._prefill_fn(*args, GLUON_MIN_WORK - 1) is prefill_attention
    assert auto._prefill_fn(*args, GLUON_MIN_WORK) is gluon.gluon_prefill_attention
    auto.prefill_kernel = "gluon"
    assert auto._prefill_fn(*args, 1) is gluon.gluon_prefill_attention
    auto.prefill_kernel = "triton"
    assert auto._prefill_fn(*args, GLUON_MIN_WORK) is prefill_attention


def test_gluon_needs_the_triton_backend_and_not_deterministic_mode(tmp_path):
    with pytest.raises(ValueError, match="needs attention_backend='triton'; got 'torch_sdpa'"):
        get_attn_backend("torch_sdpa", torch.device("cpu"), 4, 64, 8, 512, prefill_kernel="gluon")
    with pytest.raises(ValueError, match="cannot be combined with deterministic=True"):
        EngineConfig(model=str(tmp_path), deterministic=True, prefill_attention_kernel="gluon")
    with pytest.raises(
        ValueError, match=re.escape("prefill_attention_kernel must be auto|triton|gluon")
    ):
        EngineConfig(model=str(tmp_path), prefill_attention_kernel="flash")


@pytest.mark.skipif(not GLUON_HERE, reason="needs a Hopper GPU with Gluon")
def test_auto_takes_gluon_for_16_bit_caches_and_triton_for_fp8():
    auto = TritonBackend(8, 512, 4, 128, "cuda", num_kv_heads=2)
    bf16 = tensors(torch.bfloat16, torch.bfloat16, "cuda")
    large = GLUON_MIN_WORK
    assert auto._prefill_fn(*bf16, large) is gluon.gluon_prefill_attention
    assert auto._prefill_fn(*bf16, large - 1) is prefill_attention
    fp8 = tensors(torch.bfloat16, FP8_KV_DTYPE, "cuda")
    assert auto._prefill_fn(*fp8, large) is prefill_attention
    triton_only = TritonBackend(8, 512, 4, 128, "cuda", num_kv_heads=2, prefill_kernel="triton")
    assert triton_only._prefill_fn(*bf16, large) is prefill_attention
    insisted = TritonBackend(8, 512, 4, 128, "cuda", num_kv_heads=2, prefill_kernel="gluon")
    assert insisted._prefill_fn(*bf16, 1) is gluon.gluon_prefill_attention
    with pytest.raises(ValueError, match="does not support this model and cache"):
        insisted._prefill_fn(*fp8, large)

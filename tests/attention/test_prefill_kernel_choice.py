"""Which prefill kernel the triton backend runs (EngineConfig.prefill_attention_kernel): Gluon's
where it can and the prefill is large enough, Triton's elsewhere, and a clear error where
"gluon" is insisted on but cannot run."""

from __future__ import annotations

import re

import pytest
import torch

from minivllm.attention.base import AttnMetadata
from minivllm.attention.selector import get_attn_backend
from minivllm.attention.triton import GLUON_MIN_STEP_TOKENS, GLUON_MIN_WORK, TritonBackend
from minivllm.config import EngineConfig
from minivllm.kernels import gluon_batch_invariant_attention as gluon_bi
from minivllm.kernels import gluon_prefill_attention as gluon
from minivllm.kernels.batch_invariant_attention import batch_invariant_attention
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
    fp32 = tensors(torch.float32, torch.float32, device)
    assert auto._prefill_fn(*fp32, True) is prefill_attention


def prefill_step(num_decodes: int, prompt_lens: list[int], context: int) -> AttnMetadata:
    """Metadata of a step of num_decodes decode rows and one prefill a prompt length, the
    longest context `context` (only the shapes and host fields matter here)."""
    num_seqs = num_decodes + len(prompt_lens)
    rows = [1] * num_decodes + prompt_lens
    starts = torch.tensor([0] + rows, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return AttnMetadata(
        query_start_loc=starts,
        seq_lens=torch.tensor(rows, dtype=torch.int32),
        block_tables=torch.zeros(num_seqs, 1, dtype=torch.int32),
        slot_mapping=torch.zeros(sum(rows), dtype=torch.int64),
        max_seq_len=context,
        num_decode_tokens=num_decodes,
    )


@pytest.mark.parametrize(
    "num_decodes, prompt_lens, context, large",
    [
        (0, [1000], 1000, False),  # batch-1 TTFT: bound by the launch's host time
        (0, [3000], 3000, False),
        (0, [3583], 3584, False),
        (0, [3584], 3584, True),  # prefill rows x longest context = GLUON_MIN_WORK
        (0, [512], 16384, False),  # a chunk over a long cached prefix
        (0, [1024], 16384, True),
        (16, [GLUON_MIN_STEP_TOKENS - 16], 1200, True),  # a step's tokens
        (15, [GLUON_MIN_STEP_TOKENS - 16], 1200, False),
        (0, [1000] * 8, 1000, True),  # a served wave of prompts
    ],
)
@pytest.mark.parametrize("deterministic", [False, True])
def test_auto_takes_gluon_only_in_steps_large_enough_to_repay_its_launch(
    monkeypatch, num_decodes, prompt_lens, context, large, deterministic
):
    """The size rule through forward(), with the kernels replaced by recorders and Gluon
    pretended to support the tensors (so that it runs anywhere); "gluon" insisted on takes it
    at every size, "triton" never. Deterministic mode picks between its own pair (the Gluon
    kernel of the walk's bits, the walk) by the same rule; its decode rows take the walk."""
    called = []
    kernels = (
        (gluon_bi, "gluon_batch_invariant_attention", "batch_invariant_attention")
        if deterministic
        else (gluon, "gluon_prefill_attention", "prefill_attention")
    )
    module, gluon_name, triton_name = kernels
    monkeypatch.setattr(module, "supports", lambda q, kv_cache: True)
    monkeypatch.setattr(module, gluon_name, lambda *args, **kwargs: called.append("gluon"))
    monkeypatch.setattr(
        f"minivllm.attention.triton.{triton_name}", lambda *a, **k: called.append("triton")
    )
    monkeypatch.setattr(
        "minivllm.attention.batch_invariant.batch_invariant_attention",
        lambda *a, **k: called.append("decode"),
    )
    monkeypatch.setattr("minivllm.attention.triton.decode_attention", lambda *a, **k: None)
    assert GLUON_MIN_WORK == 3584 * 3584  # the cases' threshold
    backend = TritonBackend(64, 32768, 4, 128, "cpu", num_kv_heads=2, deterministic=deterministic)
    meta = prefill_step(num_decodes, prompt_lens, context)
    num_tokens = meta.slot_mapping.shape[0]
    q = torch.zeros(num_tokens, 4, 128)
    cache = torch.zeros(2, 1, 16, 2, 128)
    for choice, expected in (("auto", "gluon" if large else "triton"), ("gluon", "gluon"),
                             ("triton", "triton")):  # fmt: skip
        backend.prefill_kernel = choice  # "auto" as on a GPU where Gluon runs
        backend.forward(q, q[:, :2], q[:, :2], cache, meta, 1.0, write_kv=False)
        assert called.pop() == expected, choice
        assert called == (["decode"] if deterministic and num_decodes else []), choice
        called.clear()


def test_gluon_needs_the_triton_backend(tmp_path):
    with pytest.raises(ValueError, match="needs attention_backend='triton'; got 'torch_sdpa'"):
        get_attn_backend("torch_sdpa", torch.device("cpu"), 4, 64, 8, 512, prefill_kernel="gluon")
    config = EngineConfig(model=str(tmp_path), deterministic=True, prefill_attention_kernel="gluon")
    assert config.prefill_attention_kernel == "gluon"  # the mode's Gluon kernel, same bits
    with pytest.raises(
        ValueError, match=re.escape("prefill_attention_kernel must be auto|triton|gluon")
    ):
        EngineConfig(model=str(tmp_path), prefill_attention_kernel="flash")


@pytest.mark.skipif(not GLUON_HERE, reason="needs a Hopper GPU with Gluon")
def test_auto_takes_gluon_for_16_bit_caches_and_triton_for_fp8():
    auto = TritonBackend(8, 512, 4, 128, "cuda", num_kv_heads=2)
    bf16 = tensors(torch.bfloat16, torch.bfloat16, "cuda")
    assert auto._prefill_fn(*bf16, True) is gluon.gluon_prefill_attention
    assert auto._prefill_fn(*bf16, False) is prefill_attention
    fp8 = tensors(torch.bfloat16, FP8_KV_DTYPE, "cuda")
    assert auto._prefill_fn(*fp8, True) is prefill_attention
    triton_only = TritonBackend(8, 512, 4, 128, "cuda", num_kv_heads=2, prefill_kernel="triton")
    assert triton_only._prefill_fn(*bf16, True) is prefill_attention
    insisted = TritonBackend(8, 512, 4, 128, "cuda", num_kv_heads=2, prefill_kernel="gluon")
    assert insisted._prefill_fn(*bf16, False) is gluon.gluon_prefill_attention
    with pytest.raises(ValueError, match="does not support this model and cache"):
        insisted._prefill_fn(*fp8, True)
    bi = gluon_bi.gluon_batch_invariant_attention
    assert auto._prefill_fn(*bf16, True, deterministic=True) is bi
    assert auto._prefill_fn(*fp8, True, deterministic=True) is batch_invariant_attention

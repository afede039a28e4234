"""TritonBackend vs TorchSDPABackend on mixed steps: decodes, new prompts, chunked
continuations, prefix hits and padded rows; same outputs and the same cache afterwards."""

from __future__ import annotations

import pytest
import torch

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.attention.triton import TritonBackend
from tests.helpers import attn_metadata

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def make_step(seq_lens, query_lens, num_decodes, num_kv_heads, head_dim, block_size, dtype):
    """Cache filled with each request's earlier tokens; the step's k/v rows and metadata."""
    gen = torch.Generator().manual_seed(0)
    counts = [(n + block_size - 1) // block_size for n in seq_lens]
    num_blocks = sum(counts) + 1
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()
    cache = torch.randn(2, num_blocks, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
    block_tables = torch.zeros(len(seq_lens), max(counts), dtype=torch.int32)
    slot_mapping = []
    for i, (seq_len, count) in enumerate(zip(seq_lens, counts, strict=True)):
        blocks = [perm.pop() for _ in range(count)]
        block_tables[i, :count] = torch.tensor(blocks, dtype=torch.int32)
        new_positions = range(seq_len - query_lens[i], seq_len)
        slot_mapping += [
            blocks[p // block_size] * block_size + p % block_size for p in new_positions
        ]
    slot_mapping += [-1, -1]  # padded rows
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    num_tokens = len(slot_mapping)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen).to(dtype)
    meta = attn_metadata(starts, seq_lens, block_tables, slot_mapping, num_decodes, DEVICE)
    return cache.to(DEVICE), k.to(DEVICE), v.to(DEVICE), meta


def _compare(seq_lens, query_lens, num_decodes, num_heads, num_kv_heads, head_dim, dtype,
             block_size=16, max_splits=16):  # fmt: skip
    cache, k, v, meta = make_step(
        seq_lens, query_lens, num_decodes, num_kv_heads, head_dim, block_size, dtype
    )
    q = torch.randn(k.shape[0], num_heads, head_dim, generator=torch.Generator().manual_seed(5))
    q = q.to(dtype).to(DEVICE)
    scale = head_dim**-0.5
    backend = TritonBackend(8, 512, num_heads, head_dim, DEVICE, max_splits=max_splits)
    ref_cache = cache.clone()
    out = backend.forward(q, k, v, cache, meta, scale)
    expected = TorchSDPABackend().forward(q, k, v, ref_cache, meta, scale)
    torch.testing.assert_close(cache, ref_cache, atol=0, rtol=0)
    num_real = int(meta.query_start_loc_cpu[-1])  # padded rows have no defined output
    tol = (
        {"atol": 1e-4, "rtol": 1e-4}
        if dtype == torch.float32 and DEVICE == "cpu"
        else {"atol": 2e-2, "rtol": 2e-2}
    )
    torch.testing.assert_close(out[:num_real], expected[:num_real], **tol)
    return backend, meta


# 3 decodes (a block edge each side), a new prompt, a chunked continuation, a prefix hit.
MIXED = ([33, 17, 16, 20, 40, 35], [1, 1, 1, 20, 8, 3], 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(2, 2, 64), (4, 2, 128), (8, 2, 64)])
def test_mixed_step_matches_sdpa(dtype, num_heads, num_kv_heads, head_dim):
    _compare(*MIXED, num_heads, num_kv_heads, head_dim, dtype)


@pytest.mark.parametrize("max_splits", [1, 16])
def test_decode_only_split_on_and_off(max_splits):
    backend, meta = _compare(
        [300, 15], [1, 1], 2, 4, 1, 64, torch.float32, block_size=8, max_splits=max_splits
    )
    expected_splits = 1 if max_splits == 1 else 2  # 300 tokens -> 2 partitions of >= 256
    assert backend.num_splits(meta.num_seqs, 1, meta.max_seq_len) == expected_splits


def test_prefill_only_step():
    _compare([5, 18], [5, 2], 0, 4, 2, 64, torch.float16, block_size=4)


def test_too_many_decodes_is_a_clear_error():
    cache, k, v, meta = make_step([3] * 9, [1] * 9, 9, 1, 64, 16, torch.float32)
    backend = TritonBackend(8, 64, 2, 64, DEVICE)
    with pytest.raises(ValueError, match="max_num_seqs"):
        backend.forward(torch.zeros(k.shape[0], 2, 64, device=DEVICE), k, v, cache, meta, 1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mixed_step_bf16_real_size():
    seq_lens = [1000, 1, 17, 4000, 600, 1024, 77]
    query_lens = [1, 1, 1, 1, 600, 512, 10]
    _compare(seq_lens, query_lens, 4, 16, 8, 128, torch.bfloat16)


def test_graph_state_replays_a_live_decode_batch():
    """A batch copied into the backend's static buffers (prepare_replay) and run with the
    capture metadata gives the live batch's outputs; padding rows write no KV."""
    seq_lens, query_lens = [300, 15, 40], [1, 1, 1]
    cache, k, v, live = make_step(seq_lens, query_lens, 3, 1, 64, 8, torch.float32)
    k, v = k[:3], v[:3]  # no padded rows: the static buffers pad
    live.slot_mapping = live.slot_mapping[:3]
    q = torch.randn(3, 4, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    backend = TritonBackend(8, 512, 4, 64, DEVICE)
    expected = backend.forward(q, k, v, cache.clone(), live, 0.125)
    backend.init_graph_state(max_batch_size=8, max_num_blocks=64)
    backend.prepare_replay(4, live)
    captured = backend.metadata_for_capture(4)
    assert captured.max_seq_len == 512 and captured.num_decode_tokens == 4
    assert captured.slot_mapping.tolist()[3] == -1 and captured.seq_lens.tolist()[3] == 1
    pad = torch.zeros(1, *q.shape[1:], device=DEVICE)
    graph_cache = cache.clone()
    out = backend.forward(torch.cat([q, pad]), torch.cat([k, pad[:, :1]]),
                          torch.cat([v, pad[:, :1]]), graph_cache, captured, 0.125)  # fmt: skip
    torch.testing.assert_close(out[:3], expected, atol=1e-4, rtol=1e-4)
    expected_cache = cache.clone()
    TorchSDPABackend().forward(q, k, v, expected_cache, live, 0.125)
    torch.testing.assert_close(graph_cache, expected_cache, atol=0, rtol=0)


def test_graph_state_launch_order_puts_padded_rows_last():
    """The live batch's decode_order, then the padded rows in row order, whatever an earlier,
    larger batch left in the buffer; no order given: row order."""
    backend = TritonBackend(8, 512, 4, 64, DEVICE)
    backend.init_graph_state(max_batch_size=8, max_num_blocks=4)
    tables = torch.zeros(3, 4, dtype=torch.int32)

    def live(order, n):
        meta = attn_metadata(list(range(n + 1)), [5] * n, tables[:n], [-1] * n, n, DEVICE)
        if order is not None:
            meta.decode_order = torch.tensor(order, dtype=torch.int32, device=DEVICE)
        return meta

    backend.prepare_replay(8, live([2, 0, 1], 3))
    assert backend.metadata_for_capture(8).decode_order.tolist() == [2, 0, 1, 3, 4, 5, 6, 7]
    backend.prepare_replay(4, live([1, 0], 2))
    assert backend.metadata_for_capture(4).decode_order.tolist() == [1, 0, 2, 3]
    backend.prepare_replay(4, live(None, 3))
    assert backend.metadata_for_capture(4).decode_order.tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("backend_name", ["triton", "torch_sdpa"])
def test_out_is_written_in_place(backend_name):
    """`out` (the piecewise graphs' static buffer) gets the same rows a fresh output would."""
    cache, k, v, meta = make_step(*MIXED[:2], MIXED[2], 2, 64, 16, torch.float32)
    q = torch.randn(k.shape[0], 4, 64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    backend = (
        TritonBackend(8, 512, 4, 64, DEVICE) if backend_name == "triton" else TorchSDPABackend()
    )
    expected = backend.forward(q, k, v, cache.clone(), meta, 0.125)
    out = torch.full_like(q, float("nan"))
    assert backend.forward(q, k, v, cache, meta, 0.125, out=out) is out
    num_real = int(meta.query_start_loc_cpu[-1])
    torch.testing.assert_close(out[:num_real], expected[:num_real], atol=0, rtol=0)

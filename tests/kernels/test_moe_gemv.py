"""The fused MoE's small-step path (kernels/moe/gemv.py) in Triton's interpreter against the
torch definition (layers/moe_experts.py): tokens on disjoint experts, every token on the same
experts, idle experts, ragged N and K tiles, block FP8 against the grouped path; the rule that
picks the path (configs.step_config) at its boundary; deterministic mode keeps the grouped
path, so a token alone equals the token batched, bit for bit."""

from __future__ import annotations

import pytest
import torch
from ordered_dot import ordered_dot  # noqa: F401 (fixture)

from minivllm.kernels.moe.configs import (
    GEMV_MAX_PAIRS,
    GemvTile,
    MoeGemvConfig,
    MoeTileConfig,
    gemv_config,
    gemv_max_pairs,
    moe_config,
    step_config,
)
from minivllm.kernels.moe.fused_moe import fused_moe
from minivllm.layers.fused_moe import FusedMoE
from minivllm.layers.moe_experts import experts_torch
from minivllm.layers.ops import layer_ops
from minivllm.layers.quantization.fp8_math import quantize_weight_blocks

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on the CPU
E, H, INTER, TOP_K = 8, 64, 32, 2


def routes(kind: str, num_tokens: int, num_experts: int, top_k: int) -> torch.Tensor:
    """topk_ids [num_tokens, top_k] int32 of a kind of step."""
    g = torch.Generator().manual_seed(num_tokens)
    if kind == "disjoint":  # no expert shared between tokens (nor within one)
        return torch.randperm(num_experts, generator=g)[: num_tokens * top_k].view(
            num_tokens, top_k).int()  # fmt: skip
    if kind == "same":  # every token on experts 5, 2, ...: the others get nothing
        return torch.tensor([5, 2, 7, 0][:top_k], dtype=torch.int32).repeat(num_tokens, 1)
    scores = torch.rand(num_tokens, num_experts, generator=g)
    return scores.topk(top_k, dim=-1).indices.to(torch.int32)


def case(num_tokens: int, kind: str, dtype: torch.dtype, shape=(E, H, INTER, TOP_K)):
    num_experts, hidden, inter, top_k = shape
    g = torch.Generator().manual_seed(100 + num_tokens)
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    w13 = (torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden**-0.5).to(dtype)
    w2 = (torch.randn(num_experts, hidden, inter, generator=g) * inter**-0.5).to(dtype)
    weights = torch.rand(num_tokens, top_k, generator=g)
    weights = weights / weights.sum(-1, keepdim=True)
    ids = routes(kind, num_tokens, num_experts, top_k)
    return [t.to(DEVICE) for t in (x, w13, w2, weights, ids)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    ("num_tokens", "kind"), [(1, "random"), (4, "disjoint"), (5, "same"), (9, "random")]
)
def test_gemv_matches_torch_and_the_grouped_path(dtype, num_tokens: int, kind: str) -> None:
    x, w13, w2, weights, ids = case(num_tokens, kind, dtype)
    out = fused_moe(x, w13, w2, weights, ids, gemv_config(dtype, False))
    assert out.shape == (num_tokens, H) and out.dtype == dtype
    ref = experts_torch(x.float(), w13.float(), w2.float(), weights, ids)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    grouped = fused_moe(x, w13, w2, weights, ids, moe_config(dtype, (E, H, INTER, TOP_K), 1))
    torch.testing.assert_close(out, grouped, atol=tol, rtol=tol)


@pytest.mark.parametrize("block_n,block_k", [(8, 32), (16, 16), (4, 64)])
def test_gemv_ragged_tiles(block_n: int, block_k: int) -> None:
    """Hidden 48 and intermediate 40: K not a multiple of block_k, a last N tile part-filled;
    top-3 of 6 experts."""
    shape = (6, 48, 40, 3)
    x, w13, w2, weights, ids = case(7, "random", torch.float32, shape)
    tile = GemvTile(block_n, block_k, 4, 2)
    out = fused_moe(x, w13, w2, weights, ids, MoeGemvConfig(tile, GemvTile(block_n, 16, 2, 1)))
    ref = experts_torch(x, w13, w2, weights, ids)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_gemv_block_fp8_matches_the_grouped_path() -> None:
    """Block-FP8 experts (hidden 200: a part-filled last K group): the GEMVs, quantizing x and
    the activation per group of 128 in registers, against the grouped GEMMs, which quantize
    them in their own launches (the same values: the interpreter's e4m3 rounding is off by a
    carry in both, tests/kernels/test_fp8_gemm.py; on a GPU, tests/gpu/test_gpu_moe.py)."""
    num_experts, hidden, inter = 4, 200, 128
    g = torch.Generator().manual_seed(2)

    def stacked(rows: int, cols: int):
        parts = [quantize_weight_blocks(torch.randn(rows, cols, generator=g) / cols**0.5)
                 for _ in range(num_experts)]  # fmt: skip
        return (torch.stack([q for q, _ in parts]).to(DEVICE),
                torch.stack([s for _, s in parts]).to(DEVICE))  # fmt: skip

    (w13, w13_scale), (w2, w2_scale) = stacked(2 * inter, hidden), stacked(hidden, inter)
    x = torch.randn(3, hidden, generator=g).to(DEVICE)
    ids = routes("random", 3, num_experts, TOP_K).to(DEVICE)
    weights = torch.rand(3, TOP_K, generator=g).to(DEVICE)
    shape = (num_experts, hidden, inter, TOP_K)
    config = gemv_config(torch.float32, fp8=True)
    out = fused_moe(x, w13, w2, weights, ids, config, w13_scale, w2_scale)
    grouped = fused_moe(x, w13, w2, weights, ids, moe_config(torch.float32, shape, 3), w13_scale,
                        w2_scale)  # fmt: skip
    torch.testing.assert_close(out, grouped, atol=1e-5, rtol=1e-5)
    bad = MoeGemvConfig(GemvTile(8, 256, 4, 3), config.down)
    with pytest.raises(ValueError, match="block_k"):
        fused_moe(x, w13, w2, weights, ids, bad, w13_scale, w2_scale)
    with pytest.raises(ValueError, match="w2_scale shape"):
        fused_moe(x, w13, w2, weights, ids, config, w13_scale, w2_scale[:, :1])


def test_gemv_bad_inputs_name_the_tensor() -> None:
    x, w13, w2, weights, ids = case(2, "random", torch.float32)
    config = gemv_config(torch.float32, False)
    with pytest.raises(ValueError, match="x.dtype"):
        fused_moe(x.half(), w13, w2, weights, ids, config)
    with pytest.raises(ValueError, match="contiguous"):
        fused_moe(x, w13, w2.transpose(1, 2).contiguous().transpose(1, 2), weights, ids, config)


def test_the_rule_and_its_boundary() -> None:
    """Up to gemv_max_pairs pairs (GEMV_MAX_PAIRS, at most half the experts): the GEMVs; one
    token more: the grouped GEMMs; in deterministic mode (batch_invariant) and for block FP8
    always the grouped ones."""
    assert (gemv_max_pairs(128), gemv_max_pairs(256), gemv_max_pairs(8)) == (16, 16, 4)
    top_k = 8
    shape = (128, H, INTER, top_k)  # Qwen3-30B-A3B's experts and top-k
    last = GEMV_MAX_PAIRS // top_k
    assert isinstance(step_config(torch.float16, shape, last), MoeGemvConfig)
    assert isinstance(step_config(torch.float16, shape, last + 1), MoeTileConfig)
    for num_tokens in (1, last):
        config = step_config(torch.float16, shape, num_tokens, batch_invariant=True)
        assert config == moe_config(torch.float16, shape, num_tokens)
    assert isinstance(step_config(torch.float16, (16, H, INTER, 2), 5), MoeTileConfig)
    assert isinstance(step_config(torch.bfloat16, (128, H, 256, 8), 1, fp8=True), MoeTileConfig)


@pytest.mark.parametrize("num_tokens", [1, 2, 3])  # 2 x top-2 = gemv_max_pairs(8): the last
def test_both_sides_of_the_boundary_match_torch(num_tokens: int) -> None:
    """The default path at the tiny shape's boundary (8 experts: GEMVs up to 4 pairs)."""
    x, w13, w2, weights, ids = case(num_tokens, "random", torch.float32)
    gemv = num_tokens * TOP_K <= gemv_max_pairs(E)
    assert isinstance(step_config(torch.float32, (E, H, INTER, TOP_K), num_tokens),
                      MoeGemvConfig if gemv else MoeTileConfig)  # fmt: skip
    out = fused_moe(x, w13, w2, weights, ids)
    ref = experts_torch(x, w13, w2, weights, ids)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.usefixtures("ordered_dot")
def test_deterministic_layer_token_alone_equals_batched() -> None:
    """FusedMoE built with deterministic mode's ops: a decode-sized step (one token, which
    would take the GEMVs) gives the token's bits of a 40-token step (the grouped GEMMs)."""
    layer = FusedMoE(E, H, INTER, torch.float32, use_triton=True, ops=layer_ops(True))
    x, w13, w2, weights, ids = case(40, "random", torch.float32)
    layer.gate_up_proj.data.copy_(w13.cpu())
    layer.down_proj.data.copy_(w2.cpu())
    layer.to(DEVICE)
    batched = layer(x, weights, ids)
    for t in (0, 23):
        rows = slice(t, t + 1)
        assert torch.equal(layer(x[rows], weights[rows], ids[rows])[0], batched[t])


def test_an_out_of_range_id_stays_inside_the_weights() -> None:
    """A NaN row's router can give an id past the experts: that row's reads stay inside w
    (clamped to the last expert), the other tokens' rows are untouched."""
    x, w13, w2, weights, ids = case(3, "random", torch.float32)
    ids[0, 1] = E
    out = fused_moe(x, w13, w2, weights, ids, gemv_config(torch.float32, False))
    ref = experts_torch(x[1:], w13, w2, weights[1:], ids[1:])
    torch.testing.assert_close(out[1:], ref, atol=1e-5, rtol=1e-5)
    clamped = ids[:1].clamp(max=E - 1)
    torch.testing.assert_close(out[:1], experts_torch(x[:1], w13, w2, weights[:1], clamped))

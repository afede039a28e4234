"""Piecewise graphs for mixed steps (engine/runner/graphs/piecewise_graph.py): the pieces run over
static, padded buffers with attention between them must give what the plain forward gives. On the
CPU the pieces run as plain calls (use_graphs=False): everything but the capture itself
(tests/gpu/test_gpu_engine.py covers the replayed graphs)."""

from __future__ import annotations

import math

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.runner.graphs.piecewise_graph import PiecewiseGraphRunner, mixed_graph_sizes


def test_sizes_cover_every_step_with_bounded_padding() -> None:
    sizes = mixed_graph_sizes(4096)
    assert sizes[0] == 16 and sizes[-1] == 4096 and sizes == sorted(set(sizes))
    assert all(s % 16 == 0 for s in sizes)
    for n in range(1, 4097):
        padding = next(s for s in sizes if s >= n) - n
        assert padding < max(16, n) and padding < (256 if n <= 2048 else 512)
    assert mixed_graph_sizes(50) == [16, 32, 64]
    assert mixed_graph_sizes(100_000)[-1] == 100_000


def generate(llm: LLM) -> list[tuple[list[int], list[float]]]:
    prompts = [[(7 * i + 3 * j) % 200 + 1 for j in range(n)] for i, n in enumerate([5, 37, 61, 9])]
    params = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    result = []
    for out in outs:
        completion = out.outputs[0]
        chosen = [lp[t].logprob for t, lp in zip(completion.token_ids, completion.logprobs)]
        result.append((list(completion.token_ids), chosen))
    return result


@pytest.mark.parametrize("arch_dir", ["tiny_qwen3_dir", "tiny_llama_dir"])
def test_pieces_over_padded_buffers_equal_the_plain_forward(
    arch_dir: str, request: pytest.FixtureRequest
) -> None:
    # Chunked prefill (48-token budget) mixes prefill chunks with decodes, and step sizes
    # like 37 or 48 are padded up to 64-row buckets.
    options = dict(dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=128,
                   max_num_batched_tokens=48, enable_prefix_caching=False)  # fmt: skip
    llm = LLM(request.getfixturevalue(arch_dir), **options)
    expected = generate(llm)

    runner = llm.engine.executor.runner
    pieces = PiecewiseGraphRunner(runner.model, 48, torch.device("cpu"))
    pieces.capture(use_graphs=False)
    assert pieces.sizes == [16, 32, 48]
    runs = []
    real_run = pieces.run

    def run(ids: torch.Tensor, pos: torch.Tensor, meta) -> torch.Tensor:
        # Padding rows hold NaN: a piece that let them leak into real rows would show.
        runs.append(ids.shape[0])
        for buf in (pieces.q, pieces.k, pieces.v, pieces.attn_out, pieces.residual):
            buf[ids.shape[0] :].fill_(math.nan)
        return real_run(ids, pos, meta)

    pieces.run = run
    runner.mixed_graphs = pieces
    got = generate(llm)

    assert any(n not in pieces.sizes for n in runs), runs  # some steps were padded
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lp_got), (_, lp_expected) in zip(got, expected):
        assert lp_got == pytest.approx(lp_expected, abs=1e-4)


def test_max_mixed_graph_tokens_is_validated(tiny_qwen3_dir: str) -> None:
    with pytest.raises(ValueError, match="max_mixed_graph_tokens"):
        LLM(tiny_qwen3_dir, device="cpu", max_mixed_graph_tokens=-1)


def test_triton_layers_write_kv_from_the_pieces_and_never_from_padding(
    tiny_qwen3_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The CUDA path's layers in the interpreter: the RoPE kernel writes K/V into the cache from
    # inside the pieces (slots from the runner's static buffer), the backend does not. Stale
    # slots on padding rows would overwrite real tokens' K/V: run() must reset them to -1.
    import minivllm.attention.selector as selector
    import minivllm.model_loader as model_loader

    monkeypatch.setattr(model_loader, "use_triton_kernels", lambda device: True)
    monkeypatch.setattr(selector, "resolve_backend_name", lambda name, device: "triton")
    options = dict(dtype="float32", device="cpu", block_size=4, num_gpu_blocks_override=128,
                   max_num_batched_tokens=48, enable_prefix_caching=False)  # fmt: skip
    llm = LLM(tiny_qwen3_dir, **options)
    runner = llm.engine.executor.runner
    assert runner.model.model.layers[0].self_attn.attn.kv_written_by_rope
    expected = generate(llm)

    pieces = PiecewiseGraphRunner(runner.model, 48, torch.device("cpu"))
    pieces.capture(use_graphs=False)
    real_run = pieces.run
    written: list[torch.Tensor] = []  # slots that hold real tokens' K/V

    def run(ids: torch.Tensor, pos: torch.Tensor, meta) -> torch.Tensor:
        # Padding rows get a token unlike any real one and, as stale slots, slots that hold
        # real tokens' K/V: a padding row that wrote would corrupt them.
        pieces.input_ids.fill_(1)
        pieces.positions.fill_(0)
        if written:
            rows = pieces.slot_mapping.shape[0]
            stale = torch.cat(written).repeat(rows)[:rows]
            pieces.slot_mapping.copy_(stale)
        written.append(meta.slot_mapping.clone())
        return real_run(ids, pos, meta)

    pieces.run = run
    runner.mixed_graphs = pieces
    got = generate(llm)
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    for (_, lp_got), (_, lp_expected) in zip(got, expected):
        assert lp_got == pytest.approx(lp_expected, abs=1e-4)

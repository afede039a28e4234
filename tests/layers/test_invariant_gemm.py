"""InvariantGemm (deterministic mode's GEMM on CUDA): the fast GEMM runs only at rungs of the
ladder where the check found it equal to the reference (and, at the small row counts, not
clearly slower), the reference everywhere else; TunedGemm (the default mode's): cuBLAS, except
at the small row counts where the alternative gives its bits clearly faster. CPU stand-ins:
the reference computes every row alone (invariant by construction); the fast ones are the
same, or other bits above 16 rows (as cuBLAS is where it switches to split-K); timers that
return set figures."""

from __future__ import annotations

import bisect
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from minivllm.attention.torch_sdpa import TorchSDPABackend
from minivllm.engine.runner.graphs.cuda_graph import graph_batch_sizes
from minivllm.engine.runner.graphs.piecewise_graph import mixed_graph_sizes
from minivllm.layers import invariant_gemm
from minivllm.layers.invariant_gemm import (
    FASTER,
    SMALL_ROWS,
    InvariantGemm,
    gemm_ladder,
    rungs_matching,
)
from minivllm.layers.ops import layer_ops
from minivllm.layers.tuned_gemm import TunedGemm
from minivllm.model_loader import build_model
from minivllm.models.model_config import ModelConfig

CPU = torch.device("cpu")


def row_alone(x, w, b=None):
    """Every row computed by itself: the same bits whatever the batch."""
    return torch.cat([F.linear(x[i : i + 1], w, b) for i in range(x.shape[0])])


def shifts_above_16(x, w, b=None):
    """Like a library that switches kernels at 17 rows: other bits there."""
    out = row_alone(x, w, b)
    return out * (1 + 2**-10) if x.shape[0] > 16 else out


class Spy:
    """Records the row counts the wrapped GEMM is called with."""

    def __init__(self, gemm):
        self.gemm, self.rows = gemm, []

    def __call__(self, x, w, b=None):
        self.rows.append(x.shape[0])
        return self.gemm(x, w, b)


def test_ladder_holds_every_graph_size_and_pads_little() -> None:
    ladder = gemm_ladder(16384)
    assert ladder == sorted(set(ladder)) and ladder[0] == 1 and ladder[-1] == 16384
    # Graph replays run at a rung: no padding copy inside the graphs.
    assert set(graph_batch_sizes(1024)) <= set(ladder)
    assert set(mixed_graph_sizes(16384)) <= set(ladder)
    for rows in range(1, 16385, 7):
        rung = ladder[bisect.bisect_left(ladder, rows)]
        assert rows <= rung <= max(rows * 1.125, rows + 8)
    assert gemm_ladder(1000)[-1] == 1008 and gemm_ladder(1) == [1]


def test_the_check_finds_the_rungs_where_a_gemm_matches_the_reference() -> None:
    rungs = gemm_ladder(40)
    assert rungs == [1, 2, 4, 8, 16, 24, 32, 40]
    assert rungs_matching(row_alone, row_alone, 24, 16, torch.float32, True, rungs, CPU) == rungs
    got = rungs_matching(shifts_above_16, row_alone, 24, 16, torch.float32, False, rungs, CPU)
    assert got == [1, 2, 4, 8, 16]


def test_verified_shapes_run_fast_at_rungs_and_others_fall_back() -> None:
    fast, reference = Spy(row_alone), Spy(row_alone)
    gemm = InvariantGemm(reference, max_rows=40, fast=fast)
    assert gemm.verify([(24, 16, torch.float32, False)], CPU) == {(24, 16, torch.float32, False): 8}
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(100, 16, generator=gen), torch.randn(24, 16, generator=gen)
    fast.rows.clear(), reference.rows.clear()
    for rows in (1, 3, 13, 40):
        out = gemm(x[:rows], w)
        assert torch.equal(out, row_alone(x[:rows], w))
    assert fast.rows == [1, 4, 16, 40] and reference.rows == []
    # Past the top rung: chunks of it, the rest padded to a rung.
    fast.rows.clear()
    assert torch.equal(gemm(x, w), row_alone(x, w))
    assert fast.rows == [40, 40, 24]
    # A shape nobody verified (here: with a bias) goes to the reference.
    b = torch.randn(24, generator=gen)
    assert torch.equal(gemm(x[:5], w, b), row_alone(x[:5], w, b))
    assert reference.rows == [5]


def test_rungs_that_fail_the_check_run_the_reference() -> None:
    fast, reference = Spy(shifts_above_16), Spy(row_alone)
    gemm = InvariantGemm(reference, max_rows=40, fast=fast)
    key = (24, 16, torch.float32, False)
    assert gemm.verify([key], CPU) == {key: 5}
    fast.rows.clear(), reference.rows.clear()
    x, w = torch.randn(100, 16), torch.randn(24, 16)
    for rows in (3, 16, 17, 30, 100):  # 100: chunks of 40, 40 and 20 (rung 24)
        assert torch.equal(gemm(x[:rows], w), row_alone(x[:rows], w))
    assert fast.rows == [4, 16] and reference.rows == [17, 30, 40, 40, 20]


def differs_at(*bad_rows):
    """Like a library that picks a split-K kernel at a few row counts: other bits there."""

    def gemm(x, w, b=None):
        out = row_alone(x, w, b)
        return out * (1 + 2**-10) if x.shape[0] in bad_rows else out

    return gemm


def test_a_failed_rung_runs_fast_padded_to_a_near_rung_that_passed() -> None:
    """256 failed and 272 (1.0625x) passed: 256's calls run fast at 272; 16 and 24 failed and
    the next pass (32) is more than an eighth above both: the reference."""
    fast, reference = Spy(differs_at(16, 24, 256)), Spy(row_alone)
    gemm = InvariantGemm(reference, max_rows=300, fast=fast)
    key = (24, 16, torch.float32, False)
    gemm.verify([key], CPU)
    assert gemm.run_at[key][256] == 272 and 24 not in gemm.run_at[key]
    fast.rows.clear(), reference.rows.clear()
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(300, 16, generator=gen), torch.randn(24, 16, generator=gen)
    for rows in (250, 256, 13, 20, 257):
        assert torch.equal(gemm(x[:rows], w), row_alone(x[:rows], w))
    assert fast.rows == [272, 272, 272] and reference.rows == [13, 20]


def test_the_check_stays_within_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(invariant_gemm, "CHECK_BYTES", 64 << 10)
    checked = Spy(row_alone)
    gemm = InvariantGemm(row_alone, max_rows=16384, fast=checked)
    key = (1024, 8, torch.float32, False)  # 4 KiB a row: 16 rows fit in 64 KiB
    gemm.verify([key], CPU)
    assert max(checked.rows) == 16 and gemm.top_rung[key] == 16


def test_verify_model_checks_every_layer_shape(tiny_qwen2_dir: str) -> None:
    """Qwen2's q/k/v have a bias: checked with it and without (TP ranks > 0 add none)."""
    config = ModelConfig.from_hf(tiny_qwen2_dir)
    ops = layer_ops(deterministic=True)
    fast = Spy(row_alone)
    gemm = InvariantGemm(ops.gemm, max_rows=8, fast=fast)
    model = build_model(
        config, TorchSDPABackend(), dtype=torch.float32, device=CPU, model_dir=tiny_qwen2_dir,
        ops=replace(ops, gemm=gemm),
    )  # fmt: skip
    gemm.verify_model(model, CPU)
    h, inter = config.hidden_size, config.intermediate_size
    qkv = (config.num_attention_heads + 2 * config.num_key_value_heads) * config.head_dim
    expected = {
        (qkv, h, torch.float32, True),
        (qkv, h, torch.float32, False),
        (h, config.num_attention_heads * config.head_dim, torch.float32, False),
        (2 * inter, h, torch.float32, False),
        (h, inter, torch.float32, False),
        (model.lm_head.weight.shape[0], h, torch.float32, False),  # vocab padded
    }
    assert set(gemm.run_at) == expected


def test_verify_model_passes_over_the_experts(tiny_qwen3_moe_dir: str) -> None:
    """A MoE model's experts run their own GEMMs: the check reads the linear layers only."""
    config = ModelConfig.from_hf(tiny_qwen3_moe_dir)
    ops = layer_ops(deterministic=True)
    gemm = InvariantGemm(ops.gemm, max_rows=8, fast=Spy(row_alone))
    model = build_model(
        config, TorchSDPABackend(), dtype=torch.float32, device=CPU, model_dir=tiny_qwen3_moe_dir,
        ops=replace(ops, gemm=gemm),
    )  # fmt: skip
    gemm.verify_model(model, CPU)
    h = config.hidden_size
    assert (h, config.num_attention_heads * config.head_dim, torch.float32, False) in gemm.run_at


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_layer_ops_use_them_on_cuda_only(device: str) -> None:
    ops = layer_ops(deterministic=True, device=torch.device(device), max_rows=64)
    assert isinstance(ops.gemm, InvariantGemm) == (device == "cuda")
    default = layer_ops(deterministic=False, device=torch.device(device)).gemm
    assert isinstance(default, TunedGemm) if device == "cuda" else default is F.linear


def timer_of(times: dict[str, dict[int, float]]):
    """A timer that answers times[gemm's name][rows] (µs) for the stand-ins below."""
    return lambda gemm, x, w, b: times[gemm.name][x.shape[0]]


class Named(Spy):
    def __init__(self, gemm, name: str):
        super().__init__(gemm)
        self.name = name


def test_invariant_gemm_keeps_the_reference_where_it_is_clearly_faster() -> None:
    """At the small row counts both are timed: the reference (the Triton GEMM) runs where it
    takes at most FASTER of cuBLAS's time, cuBLAS at the other rungs where it matched."""
    ref_us = {1: 6.0, 2: 6.0, 4: 9.0, 8: 9.0}
    fast_us = {1: 12.0, 2: 6.5, 4: 9.0, 8: 8.0}
    assert ref_us[1] <= FASTER * fast_us[1] and ref_us[2] > FASTER * fast_us[2]
    reference, fast = Named(row_alone, "reference"), Named(row_alone, "fast")
    timer = timer_of({"reference": ref_us, "fast": fast_us})
    gemm = InvariantGemm(reference, max_rows=40, fast=fast, timer=timer)
    key = (24, 16, torch.float32, False)
    assert gemm.verify([key], CPU) == {key: 7}
    assert gemm.matched_rungs(key) == frozenset({2, 4, 8, 16, 24, 32, 40})
    x, w = torch.randn(40, 16), torch.randn(24, 16)
    fast.rows.clear(), reference.rows.clear()
    for rows in (1, 2, 3, 9):
        assert torch.equal(gemm(x[:rows], w), row_alone(x[:rows], w))
    assert reference.rows == [1] and fast.rows == [2, 4, 16]


def test_tuned_gemm_takes_the_alternative_only_with_cublas_bits_and_clearly_faster() -> None:
    """The default mode's GEMM: the alternative where it matched cuBLAS's bits and took at most
    FASTER of its time, at exactly that row count; cuBLAS everywhere else (other rows, other
    shapes, a shape whose bits differ, a bias the check did not see)."""

    def other_bits(x, w, b=None):
        return row_alone(x, w, b) * (1 + 2**-10)

    alternative = Named(row_alone, "alt")
    cublas = Named(row_alone, "cublas")
    slow = {r: 10.0 for r in SMALL_ROWS}
    alt_us = {1: 5.0, 2: 9.0, 4: 5.0, 8: 11.0}
    gemm = TunedGemm(alternative, cublas=cublas, timer=timer_of({"alt": alt_us, "cublas": slow}))
    key = (24, 16, torch.float32, False)
    gemm.verify([key], CPU)
    assert gemm.alternative_at == {(key, 1), (key, 4)}
    x, w = torch.randn(16, 16), torch.randn(24, 16)
    alternative.rows.clear(), cublas.rows.clear()
    for rows in (1, 2, 3, 4, 8, 16):
        assert torch.equal(gemm(x[:rows], w), row_alone(x[:rows], w))
    assert alternative.rows == [1, 4] and cublas.rows == [2, 3, 8, 16]
    gemm(x[:1], w, torch.randn(24))  # with a bias: not checked, so cuBLAS
    assert cublas.rows[-1] == 1
    differs = TunedGemm(Named(other_bits, "alt"), cublas=cublas,
                        timer=timer_of({"alt": alt_us, "cublas": slow}))  # fmt: skip
    differs.verify([key], CPU)
    assert differs.alternative_at == set()  # never other bits, however fast


def test_tuned_gemm_keeps_cublas_where_the_alternative_cannot_run() -> None:
    def broken(x, w, b=None):
        raise RuntimeError("no Triton backend for this GPU")

    gemm = TunedGemm(broken, cublas=row_alone, timer=timer_of({}))
    gemm.verify([(24, 16, torch.float32, False)], CPU)
    assert gemm.alternative_at == set()
    x, w = torch.randn(1, 16), torch.randn(24, 16)
    assert torch.equal(gemm(x, w), row_alone(x, w))


def test_without_a_timer_nothing_is_timed_on_the_cpu() -> None:
    gemm = TunedGemm(row_alone)
    gemm.verify([(24, 16, torch.float32, False)], CPU)
    assert gemm.alternative_at == set()
    invariant = InvariantGemm(row_alone, max_rows=8, fast=row_alone)
    key = (24, 16, torch.float32, False)
    assert invariant.verify([key], CPU) == {key: 4}  # matched rungs only, untimed

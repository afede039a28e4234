"""Kernel arguments that change from step to step are excluded from Triton's value/alignment
specialization, so a new batch shape never triggers a JIT compile mid-run."""

from __future__ import annotations

import pytest

from minivllm.kernels import (
    batch_invariant_attention,
    decode_attention,
    filter_thresholds,
    kv_store,
    logprobs,
    penalties,
    prefill_attention,
    rope,
    sampling,
    verify,
)
from minivllm.kernels.moe import grouped_gemm


def _option(kernel, name: str) -> list[str]:
    # JITFunction keeps the lists as attributes, the interpreter's InterpretedFunction in kwargs.
    value = getattr(kernel, name, None)
    if value is None:
        value = getattr(kernel, "kwargs", {}).get(name)
    return list(value or [])


PENALTY_PTRS = ("row_slots_ptr", "counts_ptr", "prompt_ptr", "rep_ptr", "freq_ptr", "pres_ptr")

# kernel -> (batch-dependent integers, batch-dependent pointers that may be slices)
VARYING = {
    prefill_attention._prefill_kernel: (
        {"num_seqs", "start_row", "stride_bt"},
        {"block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"},
    ),
    # num_splits (at most MAX_SPLITS values) stays specialized on purpose.
    decode_attention._decode_kernel: (
        {"stride_bt"},
        {"block_table_ptr", "seq_lens_ptr", "order_ptr"},
    ),
    batch_invariant_attention._bi_attention_kernel: (
        {"num_seqs", "start_row", "stride_bt"},
        {"block_table_ptr", "seq_lens_ptr", "query_start_loc_ptr"},
    ),
    batch_invariant_attention._fold_kernel: (set(), {"seq_lens_ptr"}),
    kv_store._store_kv_kernel: (set(), {"slot_ptr"}),
    rope._rope_kernel: (set(), {"positions_ptr", "slot_ptr"}),
    # Views into one per-step staging tensor (engine/runner/sampling/sampling_state.py), and
    # the penalties' tables and rows (stand-ins where no row is penalized).
    sampling._chunk_max_kernel: (
        {"stride_table", "table_width"},
        {"temperature_ptr", "seeds_ptr", "offsets_ptr", *PENALTY_PTRS},
    ),
    filter_thresholds._chunk_top_kernel: (
        {"stride_table", "table_width", "has_penalties"},
        set(PENALTY_PTRS),
    ),
    filter_thresholds._threshold_kernel: (
        {"has_top_k", "has_top_p", "has_min_p", "stride_table", "table_width", "has_penalties"},
        {"temperature_ptr", "top_k_ptr", "top_p_ptr", "min_p_ptr", *PENALTY_PTRS},
    ),
    # A step's most logprobs asked for, and the rows that asked (a view into its upload).
    logprobs._chunk_kernel: ({"k"}, {"rows_ptr"}),
    logprobs._row_kernel: ({"k"}, {"rows_ptr"}),
    # The penalized rows' views into the step's upload; drafts_ptr is rows_ptr without drafts.
    penalties._penalties_kernel: (
        set(),
        {"rows_ptr", "slots_ptr", "rep_ptr", "freq_ptr", "pres_ptr", "drafts_ptr"},
    ),
    # The step's pairs (tokens x top_k); its pair lists are fresh allocations.
    grouped_gemm._grouped_gemm_kernel: ({"num_pairs"}, set()),
    # The step's most drafts a request changes from step to step; its inputs are staged views.
    verify._verify_exact_kernel: (
        {"num_cols"},
        {"target_ptr", "drafts_ptr", "num_drafts_ptr", "starts_ptr"},
    ),
}


@pytest.mark.parametrize("kernel", list(VARYING), ids=lambda k: k.fn.__name__)
def test_batch_dependent_args_are_not_specialized(kernel):
    ints, ptrs = VARYING[kernel]
    no_value = set(_option(kernel, "do_not_specialize"))
    no_align = set(_option(kernel, "do_not_specialize_on_alignment"))
    # Triton silently ignores a misspelled name, so every listed name must be a parameter.
    assert no_value | no_align <= set(kernel.arg_names)
    assert ints <= no_value
    assert ptrs <= no_align | no_value
    # Model constants stay specialized: the V offset's divisibility lets V loads vectorize.
    assert "v_cache_offset" not in no_value

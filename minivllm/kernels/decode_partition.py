"""How the decode attention kernel cuts contexts into partitions (its split-KV plan): an even
split for small batches (occupancy), fixed-size partitions for large ones (load balance)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SPLITS = 16  # partitions per request at most: the size of the backend's scratch


@dataclass(frozen=True)
class DecodePlan:
    """num_splits: the grid's partition axis. partition_len: 0 splits each context evenly in
    num_splits (today's flash-decoding); > 0 gives each partition max(partition_len,
    cdiv(seq_len, num_splits)) tokens, so partitions are of equal size across requests and a
    short context is one program, a long one several. Both derive each program's range from
    the live seq_len inside the kernel, so a plan made for a longer max_seq_len (a captured
    graph) stays correct: the extra programs exit at once."""

    num_splits: int
    partition_len: int = 0


@dataclass(frozen=True)
class DecodePolicy:
    """The plan's knobs. DEFAULT_POLICY below is the one table the H200 sweep sets
    (`python benchmarks/bench_decode_balance.py`; docs/kernels.md says how to read it)."""

    max_splits: int = MAX_SPLITS
    # Even split: each partition keeps at least this many tokens.
    min_split_tokens: int = 256
    # Balanced plan once a batch gives at least this many SMs' worth of (request, kv head)
    # programs; below it the occupancy split applies. float("inf") turns balancing off.
    balance_min_waves: float = 1.0
    # Balanced partition length in tokens per KV element size in bytes (1: fp8, 2: bf16/fp16,
    # 4: float32), rounded up to the kernel's BLOCK_N; 0 turns balancing off for that size.
    partition_len: tuple[tuple[int, int], ...] = ((1, 1024), (2, 512), (4, 512))

    def __post_init__(self) -> None:
        if not 1 <= self.max_splits <= 256:
            raise ValueError(f"max_splits must be in [1, 256], got {self.max_splits}")
        if self.min_split_tokens < 1 or self.balance_min_waves < 0:
            raise ValueError("min_split_tokens must be >= 1 and balance_min_waves >= 0")
        if any(n < 0 for _, n in self.partition_len):
            raise ValueError(f"partition lengths must be >= 0, got {self.partition_len}")

    def partition_len_for(self, kv_elem_size: int) -> int:
        return dict(self.partition_len).get(kv_elem_size, 0)


DEFAULT_POLICY = DecodePolicy()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def choose_num_splits(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, max_splits: int = MAX_SPLITS,
    min_split_tokens: int = 256,
) -> int:  # fmt: skip
    """Even-split partitions per request so that num_seqs * num_kv_heads * splits fills ~2
    waves of SMs; 1 (no split) once the batch alone fills the GPU or contexts are short."""
    programs = num_seqs * num_kv_heads
    if programs >= num_sms:
        return 1
    by_occupancy = _cdiv(2 * num_sms, programs)
    by_length = _cdiv(max_seq_len, min_split_tokens)
    return max(1, min(max_splits, by_occupancy, by_length))


def choose_decode_plan(
    num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int, kv_elem_size: int = 2,
    policy: DecodePolicy = DEFAULT_POLICY,
) -> DecodePlan:  # fmt: skip
    """The plan of one decode launch. max_seq_len bounds every live context (a captured graph
    passes max_model_len). Large batches: partitions of the policy's length, at most
    max_splits of them (longer contexts get longer partitions); small batches: the even split.
    Whichever plan, the kernel reads each K/V byte once: only the tail and the count of
    programs change."""
    programs = num_seqs * num_kv_heads
    partition_len = policy.partition_len_for(kv_elem_size)
    if partition_len and programs >= policy.balance_min_waves * num_sms:
        num_splits = min(policy.max_splits, _cdiv(max_seq_len, partition_len))
        return DecodePlan(num_splits, partition_len) if num_splits > 1 else DecodePlan(1)
    splits = choose_num_splits(
        num_seqs, num_kv_heads, max_seq_len, num_sms, policy.max_splits, policy.min_split_tokens
    )
    return DecodePlan(splits)

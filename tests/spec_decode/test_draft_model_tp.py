"""The draft model under tensor parallelism (gloo, CPU): it runs whole on rank 0, beside the
sharded target, and the tokens are TP=1's, with and without it; async scheduling stays on."""

from __future__ import annotations

from minivllm import LLM, SamplingParams

PROMPTS = [([5, 6, 7, 8, 9] * 8)[: 10 + 3 * i] for i in range(3)]
PARAMS = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _run(model_dir: str, tp: int, spec: dict | None) -> tuple[list[list[int]], int]:
    """Each prompt's tokens, and the accepted drafts (0 without speculation)."""
    llm = LLM(model_dir, dtype="float32", device="cpu", block_size=4, tensor_parallel_size=tp,
              speculative_config=spec)  # fmt: skip
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
        speculator = llm.engine.scheduler.speculator
        accepted = 0 if speculator is None else speculator.stats.num_accepted_tokens
        if spec is not None and tp > 1:  # rank 0's draft model is whole
            draft = llm.engine.executor.runner.drafter.proposer.runner
            qkv = draft.model.model.layers[0].self_attn.qkv_proj
            assert qkv.tp_size == 1
        return [list(o.outputs[0].token_ids) for o in outs], accepted
    finally:
        llm.shutdown()


def test_draft_model_tp2_matches_tp1(tiny_qwen3_dir: str) -> None:
    spec = {"method": "draft_model", "model": tiny_qwen3_dir, "num_speculative_tokens": 3}
    ref, _ = _run(tiny_qwen3_dir, 1, None)
    tp1, accepted_tp1 = _run(tiny_qwen3_dir, 1, spec)
    tp2, accepted_tp2 = _run(tiny_qwen3_dir, 2, spec)
    assert tp1 == ref and tp2 == ref
    # The draft is the target itself: every draft is accepted, at either TP size.
    assert accepted_tp1 > 0 and accepted_tp2 == accepted_tp1

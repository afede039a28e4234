"""GPU: Qwen3.5 (hybrid Gated DeltaNet + gated attention) through the engine on CUDA (the
Triton gated-delta, conv and attention kernels at head_dim 256). A tiny random model in
float32 matches HF's float32 argmax; a mid-size random model in bf16 agrees with HF's bf16
forward (its torch path) on most teacher-forced tokens; prefix-cache hits (restored state
snapshots) with CUDA graphs on match HF and the engine without prefix caching; the dummy
Qwen3.5-9B runs, and a shared prefix hits there."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PROMPTS = [[5, 17, 42, 99, 3], list(range(20, 90)), [11], list(range(400, 270, -1))]
# Hidden 1024, 8 layers (6 Gated DeltaNet, 2 full attention at head_dim 256).
MID_SIZES = dict(
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=8,
    linear_num_value_heads=16,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    max_position_embeddings=4096,
    initializer_range=0.02,
)


def _generate(llm, prompts: list[list[int]], max_tokens: int) -> list:
    from minivllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=0)
    requests = [{"prompt_token_ids": p} for p in prompts]
    return [o.outputs[0] for o in llm.generate(requests, params, use_tqdm=False)]


@torch.no_grad()
def _hf_argmax(hf, prompt: list[int], tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    ids = torch.tensor([prompt + tokens], device="cuda")
    logits = hf(ids).logits[0, len(prompt) - 1 : -1].float()
    return logits.argmax(-1).tolist(), logits.log_softmax(-1)


def _assert_matches_hf(hf, prompts: list[list[int]], completions: list) -> None:
    """Greedy tokens are HF's argmax under teacher forcing, chosen-token logprobs HF's to 1e-3."""
    for prompt, completion in zip(prompts, completions, strict=True):
        tokens = list(completion.token_ids)
        expected, logprobs = _hf_argmax(hf, prompt, tokens)
        assert tokens == expected
        for i, token in enumerate(tokens):
            ours = completion.logprobs[i][token].logprob
            assert ours == pytest.approx(logprobs[i, token].item(), abs=1e-3)


@pytest.mark.parametrize(
    "options",
    [{}, {"enforce_eager": True}, {"max_num_batched_tokens": 40}, {"deterministic": True}],
    ids=["graphs", "eager", "chunked", "deterministic"],
)  # fmt: skip
def test_tiny_float32_matches_hf(tmp_path, options: dict) -> None:
    """Greedy tokens are HF's float32 argmax under teacher forcing, chosen-token logprobs HF's
    to 1e-3; batched equals alone. By default decode steps replay CUDA graphs (the state slots
    a static input)."""
    from transformers import AutoModelForCausalLM

    from minivllm import LLM
    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "q35"), "Qwen3_5ForCausalLM")
    llm = LLM(model_dir, dtype="float32", gpu_memory_utilization=0.3, **options)
    try:
        batched = _generate(llm, PROMPTS, 16)
        alone = [_generate(llm, [p], 16)[0] for p in PROMPTS]
    finally:
        llm.shutdown()
    assert [c.token_ids for c in alone] == [c.token_ids for c in batched]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    _assert_matches_hf(hf, PROMPTS, batched)


@pytest.mark.parametrize(
    "options",
    [{}, {"async_scheduling": False}, {"max_num_batched_tokens": 40}],
    ids=["graphs", "sync", "chunked"],
)  # fmt: skip
def test_tiny_float32_prefix_hits_match_hf(tmp_path, options: dict) -> None:
    """Prefix-cache hits with CUDA graphs on (blocks of 16): a 150-token prompt, then the
    next turn (it, its answer, more tokens) hits the answer's snapshot at 160 (150 and 15 of
    the answer's 16 tokens computed), and two prompts diverging inside its last block hit the
    prompt's at 144; the hits' greedy tokens are HF's float32 argmax (logprobs to 1e-3) and
    the engine's without prefix caching."""
    from transformers import AutoModelForCausalLM

    from minivllm import LLM
    from minivllm.tiny_model import build_tiny_model

    model_dir = build_tiny_model(str(tmp_path / "q35"), "Qwen3_5ForCausalLM")
    base = [3 + (7 * i) % 400 for i in range(150)]
    llm = LLM(model_dir, dtype="float32", gpu_memory_utilization=0.3, **options)
    try:
        assert llm.engine.executor.runner.graphs is not None
        first = llm.generate([{"prompt_token_ids": base}], _greedy(), use_tqdm=False)[0]
        prompts = [
            base + list(first.outputs[0].token_ids) + [5, 6, 7],
            base[:147] + [11, 12],
            base[:146] + [13] * 20,
        ]
        hits = llm.generate([{"prompt_token_ids": p} for p in prompts], _greedy(), use_tqdm=False)
    finally:
        llm.shutdown()
    assert [o.num_cached_tokens for o in hits] == [160, 144, 144]
    plain = LLM(model_dir, dtype="float32", gpu_memory_utilization=0.3,
                enable_prefix_caching=False)  # fmt: skip
    try:
        expected = _generate(plain, prompts, 16)
    finally:
        plain.shutdown()
    assert [o.outputs[0].token_ids for o in hits] == [c.token_ids for c in expected]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    for prompt, output in zip(prompts, hits, strict=True):
        tokens = list(output.outputs[0].token_ids)
        argmax, logprobs = _hf_argmax(hf, prompt, tokens)
        assert tokens == argmax
        for i, token in enumerate(tokens):
            ours = output.outputs[0].logprobs[i][token].logprob
            assert ours == pytest.approx(logprobs[i, token].item(), abs=1e-3)


def _greedy():
    from minivllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0)


def _mid_model_dir(out_dir: str) -> str:
    """Random bf16 weights at MID_SIZES, embeddings scaled by 8 so that logits are peaked (see
    make_parity_model_dir), norms moved off their initial values."""
    from transformers import AutoModelForCausalLM

    from minivllm.tiny_model import build_tiny_model

    build_tiny_model(out_dir, "Qwen3_5ForCausalLM", **MID_SIZES)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator).to(param.dtype))
    model.save_pretrained(out_dir)
    return out_dir


def test_mid_size_bf16_agrees_with_hf(tmp_path) -> None:
    """bf16 rounds differently in every implementation: at least 90% of the engine's greedy
    tokens are HF's bf16 argmax under teacher forcing, and its first token always."""
    from transformers import AutoModelForCausalLM

    from minivllm import LLM

    model_dir = _mid_model_dir(str(tmp_path / "q35-mid"))
    prompts = PROMPTS + [list(range(1, 300)), [7] * 200]
    llm = LLM(model_dir, dtype="bfloat16", gpu_memory_utilization=0.3)
    try:
        completions = _generate(llm, prompts, 32)
    finally:
        llm.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    agree = total = 0
    for prompt, completion in zip(prompts, completions, strict=True):
        tokens = list(completion.token_ids)
        expected, _ = _hf_argmax(hf, prompt, tokens)
        assert tokens[0] == expected[0]
        agree += sum(a == b for a, b in zip(tokens, expected))
        total += len(tokens)
    assert agree / total >= 0.9, f"{agree}/{total} tokens agree"


def test_dummy_qwen3_5_9b_runs(tmp_path) -> None:
    """Qwen3.5-9B's shapes with dummy weights: the state pool and the KV cache share the
    budget, and a batch of long and short prompts runs to its token count."""
    from minivllm import LLM
    from minivllm.tiny_model import make_dummy_model_dir

    model_dir = make_dummy_model_dir("qwen3.5-9b", str(tmp_path / "q35-9b"))
    llm = LLM(model_dir, load_format="dummy", max_model_len=4096, gpu_memory_utilization=0.85)
    try:
        runner = llm.engine.executor.runner
        assert runner.num_state_slots > 0 and llm.engine.num_blocks > 0
        assert llm.engine.scheduler.block_manager.snapshots.num_slots > 0
        prompts = [list(range(1, 1 + n)) for n in (1, 63, 64, 65, 1000, 3000)]
        completions = _generate(llm, prompts, 16)
        # The 1,000-token prompt left a snapshot at its last block boundary.
        again = list(range(1, 1001)) + [7] * 10
        hit = llm.generate([{"prompt_token_ids": again}], _greedy(), use_tqdm=False)[0]
    finally:
        llm.shutdown()
    assert [len(c.token_ids) for c in completions] == [16] * len(prompts)
    assert hit.num_cached_tokens == 992 and len(hit.outputs[0].token_ids) == 16


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}  # fmt: skip
REPEATING_PROMPTS = [[5, 6, 7, 8, 9], [30, 31, 32], [100, 7, 200, 9, 77, 12], [3, 4] * 4,
                     list(range(50, 90)), [11]]  # fmt: skip


@pytest.mark.parametrize("options", [{}, {"deterministic": True}], ids=["graphs", "deterministic"])
def test_tiny_float32_speculative_decoding(repeating_qwen3_5_dir: str, options: dict) -> None:
    """n-gram speculative decoding on the repetitive tiny Qwen3.5 (tests/conftest.py) with the
    Triton kernels (verify steps eager, the one-token step reading and writing other slots;
    plain decode steps replay CUDA graphs): drafts accepted and rejected part-way; the greedy
    tokens are the engine's without speculation and HF's float32 argmax; in deterministic mode
    the logprobs are the same bits too."""
    from transformers import AutoModelForCausalLM

    from minivllm import LLM

    def generate(spec):
        llm = LLM(repeating_qwen3_5_dir, dtype="float32", gpu_memory_utilization=0.3,
                  speculative_config=spec, **options)  # fmt: skip
        try:
            out = _generate(llm, REPEATING_PROMPTS, 40)
            return out, llm.engine.stats()
        finally:
            llm.shutdown()

    plain, _ = generate(None)
    ours, stats = generate(NGRAM)
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    assert stats.spec_accepted_per_pos[0] > stats.spec_accepted_per_pos[-1]
    assert [c.token_ids for c in ours] == [c.token_ids for c in plain]
    if options.get("deterministic"):
        for mine, theirs in zip(ours, plain, strict=True):
            assert [e[t].logprob for e, t in zip(mine.logprobs, mine.token_ids)] == [
                e[t].logprob for e, t in zip(theirs.logprobs, theirs.token_ids)
            ]
    hf = AutoModelForCausalLM.from_pretrained(repeating_qwen3_5_dir, dtype=torch.float32)
    hf = hf.cuda().eval()
    for prompt, completion in zip(REPEATING_PROMPTS, ours, strict=True):
        tokens = list(completion.token_ids)
        assert tokens == _hf_argmax(hf, prompt, tokens)[0]


def test_dummy_qwen3_5_9b_speculative_decoding_deterministic(tmp_path) -> None:
    """Qwen3.5-9B's shapes, dummy weights, bf16, deterministic mode: the draft-state slots fit the
    budget beside the running slots and the KV, and n-gram drafting on repeating prompts (as
    much as the dummy weights' text repeats) gives the tokens of decoding without it."""
    from minivllm import LLM
    from minivllm.tiny_model import make_dummy_model_dir

    model_dir = make_dummy_model_dir("qwen3.5-9b", str(tmp_path / "q35-9b"))
    prompts = [([11, 12, 13, 14, 15, 16] * 40)[: 100 + 9 * i] for i in range(4)]
    results = []
    ngram = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1}
    for spec in (None, ngram):
        llm = LLM(model_dir, load_format="dummy", max_model_len=4096, deterministic=True,
                  gpu_memory_utilization=0.85, speculative_config=spec)  # fmt: skip
        try:
            results.append([c.token_ids for c in _generate(llm, prompts, 32)])
            if spec is not None:
                # k draft-state slots for each of the 16 requests that may draft at once.
                assert llm.engine.scheduler.block_manager.num_free_draft_state_slots == 4 * 16
        finally:
            llm.shutdown()
    assert results[0] == results[1]

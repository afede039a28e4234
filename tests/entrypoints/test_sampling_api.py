"""The sampling and output surface through LLM: seeds, n, stop strings and tokens, min_tokens,
logprobs against HF, chat template, generation_config EOS, metrics."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minivllm import LLM, SamplingParams

PROMPT = {
    "prompt_token_ids": [
        11,
        22,
        33,
        44,
        55,
        66,
        77,
        88,
        99,
        111,
        122,
        133,
        144,
        155,
        166,
        177,
        188,
        199,
        201,
        202,
    ]
}
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir: str) -> LLM:
    return LLM(tiny_qwen3_dir, dtype="float32", device="cpu", block_size=4)


def tokens(outputs) -> list[list[int]]:
    return [c.token_ids for o in outputs for c in o.outputs]


def test_seed_reproduces_alone_or_batched(llm: LLM) -> None:
    seeded = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    other = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    alone = tokens(llm.generate(PROMPT, seeded, use_tqdm=False))[0]
    batched = llm.generate(
        [{"prompt_token_ids": [5, 6, 7]}, PROMPT, {"prompt_token_ids": [9] * 9}],
        [other, seeded, other],
        use_tqdm=False,
    )
    assert batched[1].outputs[0].token_ids == alone
    reseeded = SamplingParams(temperature=1.0, seed=4321, max_tokens=12, ignore_eos=True)
    assert tokens(llm.generate(PROMPT, reseeded, use_tqdm=False))[0] != alone


def test_top_k_one_is_greedy(llm: LLM) -> None:
    greedy = tokens(llm.generate(PROMPT, GREEDY, use_tqdm=False))[0]
    top1 = SamplingParams(temperature=0.8, top_k=1, max_tokens=16, ignore_eos=True)
    assert tokens(llm.generate(PROMPT, top1, use_tqdm=False))[0] == greedy


def test_n_samples_share_the_prompt(llm: LLM) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True)
    out = llm.generate(PROMPT, params, use_tqdm=False)
    assert len(out) == 1 and [c.index for c in out[0].outputs] == [0, 1, 2]
    assert all(len(c.token_ids) == 8 for c in out[0].outputs)
    assert len({tuple(c.token_ids) for c in out[0].outputs}) > 1
    # Samples 1 and 2 reuse sample 0's full prompt blocks (16 of 20 tokens).
    assert out[0].num_cached_tokens == 16


def test_cache_salt_shares_prefix_blocks_only_within_a_salt(llm: LLM) -> None:
    ids = list(range(300, 341))  # 41 tokens: 10 full blocks of 4 can be hit

    def run(salt: str | None) -> tuple[int, list[int]]:
        prompt = (
            {"prompt_token_ids": ids}
            if salt is None
            else {"prompt_token_ids": ids, "cache_salt": salt}
        )
        out = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
        return out.num_cached_tokens, out.outputs[0].token_ids

    first = run("tenant-a")
    assert first[0] == 0
    assert run("tenant-a") == (40, first[1])  # the same salt hits
    assert run("tenant-b") == (0, first[1])  # another salt, and none, do not
    assert run(None) == (0, first[1])
    assert run(None) == (40, first[1])
    with pytest.raises(ValueError, match="cache_salt"):
        llm.generate({"prompt_token_ids": ids, "cache_salt": ""}, GREEDY, use_tqdm=False)


def test_thinking_budget_forces_the_end_of_the_block(llm: LLM) -> None:
    tokenizer = llm.get_tokenizer()
    end = tokenizer.encode("</think>", add_special_tokens=False)
    prompt = {"prompt": "Question?<think>"}  # the prompt opens the block (a template would)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    free = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].token_ids
    assert free[3 : 3 + len(end)] != end
    budget = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                            thinking_token_budget=3)  # fmt: skip
    out = llm.generate(prompt, budget, use_tqdm=False)[0].outputs[0].token_ids
    assert out[:3] == free[:3]  # free until the budget is spent
    assert out[3 : 3 + len(end)] == end  # then the end marker, token by token
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=-1)


def test_stop_string_spanning_tokens(llm: LLM) -> None:
    full = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0].outputs[0]
    tok = llm.tokenizer
    pieces = [tok.decode(full.token_ids[:i]) for i in range(len(full.token_ids) + 1)]
    # A stop string made of the last char of token 2's text and the first of token 3's.
    boundary = len(pieces[3])
    assert len(pieces[4]) > boundary and boundary > 0
    stop = full.text[boundary - 1 : boundary + 1]
    first = full.text.find(stop)
    out = llm.generate(
        PROMPT,
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop]),
        use_tqdm=False,
    )[0].outputs[0]
    assert out.text == full.text[:first]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    kept = llm.generate(
        PROMPT,
        SamplingParams(
            temperature=0.0,
            max_tokens=16,
            ignore_eos=True,
            stop=[stop],
            include_stop_str_in_output=True,
        ),
        use_tqdm=False,
    )[0].outputs[0]
    assert kept.text == full.text[: first + len(stop)]


def test_logit_bias_forces_and_bans_tokens(llm: LLM) -> None:
    full = tokens(llm.generate(PROMPT, GREEDY, use_tqdm=False))[0]
    forced = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={7: 100})
    assert tokens(llm.generate(PROMPT, forced, use_tqdm=False))[0] == [7] * 6
    banned = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={full[0]: -100}
    )
    out = tokens(llm.generate(PROMPT, banned, use_tqdm=False))[0]
    assert full[0] not in out
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate(PROMPT, SamplingParams(logit_bias={10**6: 1.0}), use_tqdm=False)


def test_allowed_token_ids_restrict_every_sampled_token(llm: LLM) -> None:
    full = tokens(llm.generate(PROMPT, GREEDY, use_tqdm=False))[0]
    allowed = [full[0], 5, 9]  # the unrestricted first token among them: it stays first
    params = SamplingParams(
        temperature=0.0, max_tokens=8, ignore_eos=True, allowed_token_ids=allowed
    )
    out = tokens(llm.generate(PROMPT, params, use_tqdm=False))[0]
    assert out[0] == full[0] and set(out) <= set(allowed)
    params = SamplingParams(
        temperature=1.0, seed=0, max_tokens=32, ignore_eos=True, allowed_token_ids=[5, 9]
    )
    out = tokens(llm.generate(PROMPT, params, use_tqdm=False))[0]
    assert set(out) == {5, 9}
    with pytest.raises(ValueError, match="allowed_token_ids token id"):
        llm.generate(PROMPT, SamplingParams(allowed_token_ids=[10**6]), use_tqdm=False)


def test_stop_token_ids_and_min_tokens(llm: LLM) -> None:
    full = tokens(llm.generate(PROMPT, GREEDY, use_tqdm=False))[0]
    stop_id = full[3]
    params = SamplingParams(temperature=0.0, max_tokens=16, stop_token_ids=[stop_id])
    out = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0]
    cut = full.index(stop_id) + 1
    assert out.token_ids == full[:cut]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    held = SamplingParams(
        temperature=0.0, max_tokens=16, stop_token_ids=[stop_id], min_tokens=cut + 2
    )
    out = llm.generate(PROMPT, held, use_tqdm=False)[0].outputs[0]
    assert len(out.token_ids) >= cut + 2
    assert stop_id not in out.token_ids[: cut + 2]


def test_detokenize_false_gives_the_same_tokens_without_text(llm: LLM) -> None:
    """vLLM's detokenize=False: the same tokens, logprobs and finish, but no text (the output's
    text "", every logprob entry's decoded_token None); stop strings need text."""
    options = dict(temperature=0.8, seed=3, n=2, max_tokens=12, logprobs=2, prompt_logprobs=1)
    with_text = llm.generate(PROMPT, SamplingParams(**options), use_tqdm=False)[0]
    plain = llm.generate(PROMPT, SamplingParams(**options, detokenize=False), use_tqdm=False)[0]
    assert [o.token_ids for o in plain.outputs] == [o.token_ids for o in with_text.outputs]
    assert all(o.text for o in with_text.outputs) and all(o.text == "" for o in plain.outputs)
    for ours, theirs in zip(plain.outputs, with_text.outputs, strict=True):
        assert ours.finish_reason == theirs.finish_reason == "length"
        assert [{t: lp.logprob for t, lp in d.items()} for d in ours.logprobs] == [
            {t: lp.logprob for t, lp in d.items()} for d in theirs.logprobs
        ]
        assert all(lp.decoded_token is None for d in ours.logprobs for lp in d.values())
        assert all(lp.decoded_token is not None for d in theirs.logprobs for lp in d.values())
    entries = [d for d in plain.prompt_logprobs if d is not None]
    assert entries and all(lp.decoded_token is None for d in entries for lp in d.values())
    with pytest.raises(ValueError, match="stop strings are only supported when detokenize"):
        SamplingParams(stop=["x"], detokenize=False)
    with pytest.raises(TypeError, match="detokenize must be a bool"):
        SamplingParams(detokenize="no")


def test_logprobs_match_hf(llm: LLM, tiny_qwen3_dir: str) -> None:
    params = SamplingParams(
        temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2
    )
    out = llm.generate(PROMPT, params, use_tqdm=False)[0]
    completion = out.outputs[0]
    hf = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32)
    ids = PROMPT["prompt_token_ids"] + completion.token_ids
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    num_prompt = len(PROMPT["prompt_token_ids"])
    assert len(completion.logprobs) == 6
    for i, (token_id, entry) in enumerate(zip(completion.token_ids, completion.logprobs)):
        row = ref[num_prompt - 1 + i]
        assert entry[token_id].rank == 1
        assert entry[token_id].logprob == pytest.approx(row[token_id].item(), abs=1e-4)
        top3 = set(row.topk(3).indices.tolist())
        assert set(entry) == top3
        assert entry[token_id].decoded_token == llm.tokenizer.decode([token_id])
    prompt_lp = out.prompt_logprobs
    assert len(prompt_lp) == num_prompt and prompt_lp[0] is None
    for pos in range(1, num_prompt):
        token_id = ids[pos]
        entry = prompt_lp[pos]
        assert entry[token_id].logprob == pytest.approx(ref[pos - 1, token_id].item(), abs=1e-4)
        assert entry[token_id].rank == int((ref[pos - 1] > ref[pos - 1, token_id]).sum()) + 1
        assert len(entry) in (2, 3)


def test_chat_applies_template(llm: LLM, tiny_qwen3_dir: str) -> None:
    messages = [{"role": "user", "content": "Hello there, how are you?"}]
    expected = AutoTokenizer.from_pretrained(tiny_qwen3_dir).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True
    )
    if isinstance(expected, dict) or hasattr(expected, "input_ids"):
        expected = expected["input_ids"]
    out = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert out[0].prompt_token_ids == list(expected)
    two = llm.chat(
        [messages, messages], SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in two] == [out[0].outputs[0].token_ids] * 2


def test_generation_config_eos(llm: LLM, tiny_qwen3_dir: str, tmp_path) -> None:
    full = tokens(llm.generate(PROMPT, GREEDY, use_tqdm=False))[0]
    eos = full[5]
    target = tmp_path / "eos-model"
    shutil.copytree(tiny_qwen3_dir, target)
    gen_path = target / "generation_config.json"
    gen = json.loads(gen_path.read_text())
    gen["eos_token_id"] = [eos]
    gen["max_new_tokens"] = 6  # vLLM's default max_tokens from the file
    gen_path.write_text(json.dumps(gen))
    eos_llm = LLM(str(target), dtype="float32", device="cpu", block_size=4)
    assert eos_llm.get_default_sampling_params().max_tokens == 6
    out = eos_llm.generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)[
        0
    ]
    assert out.outputs[0].token_ids == full[: full.index(eos) + 1]
    assert out.outputs[0].finish_reason == "stop"
    ignored = eos_llm.generate(PROMPT, GREEDY, use_tqdm=False)[0]
    assert ignored.outputs[0].token_ids == full


def test_metrics(llm: LLM) -> None:
    out = llm.generate(PROMPT, GREEDY, use_tqdm=False)[0]
    m = out.metrics
    assert m.arrival_time <= m.first_scheduled_time <= m.first_token_time <= m.finished_time

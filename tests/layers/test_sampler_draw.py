"""The CUDA sampling path of non-plain batches draws with the fused kernel's keyed noise
(through Triton's interpreter on a CPU, on the GPU where there is one): a row without filters
gets exactly the token a plain batch gives it, and a filtered row never leaves its support."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from minivllm.kernels.sampling import sample_plain
from minivllm.layers.sampler import Sampler

# The kernel takes tensors on the device Triton runs on: the GPU, else the interpreter's CPU.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_unfiltered_row_draws_like_a_plain_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(3, 64, device=DEVICE)
    temperature = torch.tensor([0.7, 1.0, 0.0], device=DEVICE)
    seeds = torch.tensor([11, 22, 33], device=DEVICE)
    offsets = torch.tensor([5 << 32, 0, 0], device=DEVICE)
    meta = SimpleNamespace(temperature=temperature, seeds=seeds, offsets=offsets)
    # Row 1 is filtered (top-k style: half its tokens dropped); rows 0 and 2 are not.
    filtered = logits / torch.where(temperature == 0, 1.0, temperature).unsqueeze(1)
    dropped = torch.zeros_like(filtered, dtype=torch.bool)
    dropped[1, logits[1].argsort()[:32]] = True
    filtered = filtered.masked_fill(dropped, -torch.inf)
    drawn = Sampler(use_triton=True).draw_kept(
        logits.masked_fill(filtered == -torch.inf, -torch.inf), meta
    )
    plain = sample_plain(logits, temperature, seeds, offsets)
    assert drawn[0] == plain[0] and drawn[2] == plain[2] == logits[2].argmax()
    assert not dropped[1, drawn[1]]


def test_filtered_rows_stay_in_support() -> None:
    torch.manual_seed(1)
    logits = torch.randn(1, 16, device=DEVICE).repeat(200, 1)
    keep = torch.zeros(16, dtype=torch.bool, device=DEVICE)
    keep[[2, 5, 7]] = True
    filtered = logits.masked_fill(~keep, -torch.inf)
    meta = SimpleNamespace(
        temperature=torch.ones(200, device=DEVICE),
        seeds=torch.arange(200, dtype=torch.int64, device=DEVICE),
        offsets=torch.zeros(200, dtype=torch.int64, device=DEVICE),
    )
    drawn = Sampler(use_triton=True).draw_kept(
        logits.masked_fill(filtered == -torch.inf, -torch.inf), meta
    )
    assert set(drawn.tolist()) <= {2, 5, 7}
    assert len(set(drawn.tolist())) == 3


def test_penalties_read_by_the_kernels_sample_as_the_penalized_copy() -> None:
    # A step whose only edit is penalties (a quarter of the rows penalized, every row
    # filtered, some with logprobs): the filters and draw penalize as they read, without a
    # float32 copy, and give the tokens and logprobs the copy gives. Later steps count the
    # sampled tokens on the device first.
    from dataclasses import replace

    from minivllm.engine.runner.sampling.sampling_state import SamplingState
    from minivllm.engine.types import NewRequestData
    from minivllm.sampling_params import SamplingParams

    vocab = 300
    state = SamplingState(DEVICE, max_num_seqs=8, vocab_size=vocab)
    state.keyed_draws = True  # as on CUDA, where the Triton sampler draws keyed noise
    gen = torch.Generator().manual_seed(5)
    req_ids = [f"r{i}" for i in range(8)]
    for i, req_id in enumerate(req_ids):
        penalties = {"repetition_penalty": 1.5, "frequency_penalty": 0.5} if i % 4 == 0 else {}
        if i == 5:
            penalties = {"presence_penalty": 2.0}
        params = SamplingParams(temperature=[0.7, 1.0][i % 2], top_k=20, top_p=0.9,
                                logprobs=2 if i % 3 == 0 else None, **penalties)  # fmt: skip
        prompt = torch.randint(vocab, (40,), generator=gen).tolist()
        state.add_request(NewRequestData(req_id, prompt, params))
    sampler = Sampler(use_triton=True)
    for _ in range(2):
        meta = state.build_metadata(req_ids)
        # Logits whose top tokens are the prompts' (the penalties decide among them).
        logits = torch.randn(8, vocab, generator=gen).to(DEVICE) * 2
        for row, req_id in enumerate(req_ids):
            logits[row, state.requests[req_id].prompt_token_ids] += 3
        on_read = sampler.penalties_on_read(meta)
        assert on_read is not None
        assert on_read.row_slots.tolist().count(-1) == 5
        got = sampler(logits.clone(), meta)
        copy = replace(meta, penalty_row_slots=None)
        assert sampler.penalties_on_read(copy) is None
        expected = sampler(logits.clone(), copy)
        assert got.sampled_token_ids.tolist() == expected.sampled_token_ids.tolist()
        assert torch.equal(got.logprobs, expected.logprobs)
        unpenalized = replace(copy, no_penalties=True)
        state.record_sampled(meta, got.sampled_token_ids)
        state.append_tokens(req_ids, got.sampled_token_ids.tolist())
    # The penalties changed some penalized row's token (the case is not trivial).
    assert sampler(logits.clone(), unpenalized).sampled_token_ids.tolist() != (
        got.sampled_token_ids.tolist()
    )


def test_triton_logprobs_are_the_raw_logits_log_softmax_at_the_drawn_tokens() -> None:
    # A penalized, filtered step whose rows ask for 2 or 5 logprobs or none: the Triton path
    # reads them from the raw logits after its draw (kernels/logprobs.py) and gives what
    # log_softmax and gather_logprobs give for its tokens; 21 is past the kernels' cap, where
    # torch gives them; an all-greedy step reads them too.
    from minivllm.engine.runner.sampling.sampling_state import SamplingState
    from minivllm.engine.types import NewRequestData
    from minivllm.layers.sampler import gather_logprobs
    from minivllm.sampling_params import SamplingParams

    vocab = 300
    gen = torch.Generator().manual_seed(7)
    sampler = Sampler(use_triton=True)
    for most, temperature in ((5, 0.8), (21, 0.8), (5, 0.0)):
        state = SamplingState(DEVICE, max_num_seqs=6, vocab_size=vocab)
        state.keyed_draws = True
        req_ids = [f"r{i}" for i in range(6)]
        for i, req_id in enumerate(req_ids):
            params = SamplingParams(temperature=temperature, top_k=20, top_p=0.9,
                                    repetition_penalty=1.2 if i % 2 else 1.0,
                                    logprobs=[2, None, most][i % 3])  # fmt: skip
            state.add_request(NewRequestData(req_id, [1, 2, 3], params))
        meta = state.build_metadata(req_ids)
        logits = torch.randn(6, vocab, generator=gen).to(DEVICE) * 3
        raw = logits.clone()
        out = sampler(logits, meta)
        assert torch.equal(logits, raw)
        rows = out.logprob_rows
        assert rows is not None and rows.tolist() == [0, 2, 3, 5]
        ids, values, ranks = gather_logprobs(
            torch.log_softmax(raw[rows], dim=-1), out.sampled_token_ids[rows], most
        )
        assert out.logprob_token_ids.tolist() == ids.tolist()
        assert out.ranks.tolist() == ranks.tolist()
        torch.testing.assert_close(out.logprobs, values, rtol=0, atol=2e-5)


def test_an_all_greedy_penalized_step_takes_the_draw_kernels_argmax() -> None:
    # Greedy rows, a repetition penalty on some (batch-1 latency with the checkpoints'
    # penalty): the draw kernel's argmax of the logits penalized as read, the copy's tokens.
    from dataclasses import replace

    from minivllm.engine.runner.sampling.sampling_state import SamplingState
    from minivllm.engine.types import NewRequestData
    from minivllm.sampling_params import SamplingParams

    vocab = 200
    state = SamplingState(DEVICE, max_num_seqs=4, vocab_size=vocab)
    state.keyed_draws = True
    gen = torch.Generator().manual_seed(3)
    req_ids = ["a", "b", "c"]
    for i, req_id in enumerate(req_ids):
        params = SamplingParams(temperature=0.0, repetition_penalty=[3.0, 1.0, 2.0][i])
        prompt = torch.randint(vocab, (30,), generator=gen).tolist()
        state.add_request(NewRequestData(req_id, prompt, params))
    sampler = Sampler(use_triton=True)
    meta = state.build_metadata(req_ids)
    assert meta.all_greedy and meta.seeds.tolist() == [0, 0, 0]
    assert sampler.penalties_on_read(meta) is not None
    # The prompts' tokens lead: the penalty moves rows a and c elsewhere.
    logits = torch.randn(3, vocab, generator=gen).to(DEVICE)
    for row, req_id in enumerate(req_ids):
        logits[row, state.requests[req_id].prompt_token_ids] += 1.5
    got = sampler(logits.clone(), meta).sampled_token_ids.tolist()
    copy = replace(meta, penalty_row_slots=None)
    assert got == sampler(logits.clone(), copy).sampled_token_ids.tolist()
    unpenalized = logits.argmax(dim=-1).tolist()
    assert got[1] == unpenalized[1] and got != unpenalized

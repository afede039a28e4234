"""The hybrid model's decode graphs on the CPU: capture_graph stood in by a replay that runs the
captured function again over the same static buffers, so that what a replay reads (token ids,
positions, attention metadata, the rows' state slots, padded rows at slot -1) is checked
against eager steps: the same greedy tokens and logprobs."""

from __future__ import annotations

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine.runner.graphs import cuda_graph
from minivllm.engine.runner.graphs.hybrid_graph import HybridCUDAGraphRunner

PROMPTS = [[5, 17, 42, 99, 3], list(range(20, 90)), [11]]
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=1)


class ReplayByRerun:
    """A stand-in CUDA graph: replay() calls the captured function again."""

    def __init__(self, fn, args) -> None:
        self.fn, self.args = fn, args

    def replay(self) -> None:
        self.fn(*self.args)

    def pool(self) -> None:
        return None


def fake_capture(pool, fn, *args):
    return ReplayByRerun(fn, args), fn(*args)


def _generate(llm: LLM) -> list[tuple]:
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], PARAMS, use_tqdm=False)
    return [
        (o.outputs[0].token_ids, [sorted(e.items()) for e in o.outputs[0].logprobs]) for o in outs
    ]


def test_decode_graphs_read_the_state_slots(
    tiny_qwen3_5_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = dict(dtype="float32", device="cpu", block_size=4, attention_backend="triton",
                   max_num_seqs=4)  # fmt: skip
    eager = _generate(LLM(tiny_qwen3_5_dir, **options))
    llm = LLM(tiny_qwen3_5_dir, **options)
    monkeypatch.setattr(cuda_graph, "capture_graph", fake_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)
    runner = llm.engine.executor.runner
    graphs = runner.graph_capture.decode_graphs()
    assert isinstance(graphs, HybridCUDAGraphRunner) and graphs.sizes == [1, 2, 4]
    replays = []
    run = graphs.run
    monkeypatch.setattr(graphs, "run", lambda *args: replays.append(1) or run(*args))
    runner.graphs = graphs
    # Three requests in a graph of four rows, then fewer as they finish: padded rows.
    replayed = _generate(llm)
    assert len(replays) >= 5
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(replayed, eager, strict=True):
        assert tokens == ref_tokens
        for entry, ref_entry in zip(logprobs, ref_logprobs, strict=True):
            assert [t for t, _ in entry] == [t for t, _ in ref_entry]
            ours = [lp.logprob for _, lp in entry]
            assert ours == pytest.approx([lp.logprob for _, lp in ref_entry], abs=1e-5)

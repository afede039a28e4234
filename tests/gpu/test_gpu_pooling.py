"""GPU, bf16, Qwen3-0.6B shape (Qwen3-Embedding-0.6B's): embeddings against transformers on the
same GPU, through the piecewise graphs and chunked prefill; deterministic mode gives a text
the same bits alone and batched; a pooling request beside generation leaves both right."""

from __future__ import annotations

import gc
import logging
import shutil

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.tiny_model import write_sentence_transformers_files
from tests.gpu.conftest import prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
PROMPTS = [p[: 16 + 37 * i] for i, p in enumerate(prompts(12, 512, seed=3))]


def _pooling_model_dir(model_dir: str, tmp_path_factory, pooling: str, normalize: bool) -> str:
    """A copy of model_dir with sentence-transformers' files for this pooling."""
    out = str(tmp_path_factory.mktemp(f"embed-{pooling}") / "m")
    shutil.copytree(model_dir, out)
    write_sentence_transformers_files(out, pooling, normalize)
    return out


@pytest.fixture(scope="module")
def embed_dir(model_dir: str, tmp_path_factory) -> str:
    return _pooling_model_dir(model_dir, tmp_path_factory, "last", True)


def _embed(
    model_dir: str, batch: list[list[int]], **options
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The batch's vectors, and the first three prompts' each embedded alone."""
    llm = LLM(model_dir, task="embed", dtype="bfloat16", **options)
    outs = llm.embed([{"prompt_token_ids": p} for p in batch], use_tqdm=False)
    alone = [llm.embed({"prompt_token_ids": p}, use_tqdm=False)[0] for p in batch[:3]]
    llm.shutdown()
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [torch.tensor(o.outputs.embedding) for o in outs], [
        torch.tensor(o.outputs.embedding) for o in alone
    ]


def test_embeddings_match_transformers(embed_dir: str) -> None:
    from transformers import AutoModel

    model = AutoModel.from_pretrained(embed_dir, dtype=torch.bfloat16).cuda()
    batched, alone = _embed(embed_dir, PROMPTS, max_num_batched_tokens=1024)
    for prompt, got in zip(PROMPTS, batched):
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([prompt], device="cuda")).last_hidden_state
        want = torch.nn.functional.normalize(hidden[0, -1].float(), dim=0).cpu()
        assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.999
        assert abs(got.norm().item() - 1.0) < 1e-4
    for a, b in zip(alone, batched):
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.999


def test_deterministic_same_bits(embed_dir: str) -> None:
    batched, alone = _embed(embed_dir, PROMPTS, deterministic=True, max_num_batched_tokens=512)
    for a, b in zip(alone, batched):
        assert torch.equal(a, b)


def test_pooling_beside_generation(embed_dir: str) -> None:
    llm = LLM(embed_dir, task="embed", dtype="bfloat16")
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    ref = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:4]], params, use_tqdm=False)
    want = llm.embed([{"prompt_token_ids": p} for p in PROMPTS[4:8]], use_tqdm=False)
    mixed_prompts = [{"prompt_token_ids": p} for p in PROMPTS[:8]]
    mixed_params = [params] * 4 + [
        SamplingParams(max_tokens=1, temperature=0.0, pooling=llm.pooling.embed_params())
    ] * 4
    mixed = llm.generate(mixed_prompts, mixed_params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in mixed[:4]] == [o.outputs[0].token_ids for o in ref]
    for got, w in zip(mixed[4:], want):
        got_t, w_t = torch.tensor(got.pooled), torch.tensor(w.outputs.embedding)
        assert torch.nn.functional.cosine_similarity(got_t, w_t, dim=0) > 0.999
    llm.shutdown()


@pytest.fixture(scope="module")
def mean_dir(model_dir: str, tmp_path_factory) -> str:
    return _pooling_model_dir(model_dir, tmp_path_factory, "mean", False)


def test_mean_pooling_and_its_reserve(mean_dir: str, caplog) -> None:
    """Mean pooling (segment sums across chunks): the prompts' mean final states as
    transformers computes them; in deterministic mode the same bits alone, batched, and
    chunked under another step budget; the memory profile keeps the pooling runner's worst
    case (pooling_reserve_bytes at the engine's max_num_seqs) out of the KV cache."""
    from transformers import AutoConfig, AutoModel

    from minivllm.engine.runner.pooling import pooling_reserve_bytes

    with caplog.at_level(logging.INFO, logger="minivllm.engine.runner.cache.profiling"):
        batched, alone = _embed(mean_dir, PROMPTS, deterministic=True, max_num_seqs=1024,
                                max_num_batched_tokens=512)  # fmt: skip
    hidden_size = AutoConfig.from_pretrained(mean_dir).hidden_size
    reserve = pooling_reserve_bytes(hidden_size, torch.bfloat16, 1024)
    assert f"pooling state {reserve / 2**30:.2f} GiB" in caplog.text
    for a, b in zip(alone, batched):
        assert torch.equal(a, b)
    rechunked, _ = _embed(mean_dir, PROMPTS, deterministic=True, max_num_batched_tokens=200)
    assert all(torch.equal(a, b) for a, b in zip(rechunked, batched))
    model = AutoModel.from_pretrained(mean_dir, dtype=torch.bfloat16).cuda()
    for prompt, got in zip(PROMPTS, batched):
        with torch.no_grad():
            hidden = model(input_ids=torch.tensor([prompt], device="cuda")).last_hidden_state
        want = hidden[0].float().mean(0).cpu()
        assert torch.nn.functional.cosine_similarity(got, want, dim=0) > 0.999

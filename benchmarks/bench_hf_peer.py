"""HF transformers `generate_batch` (continuous batching) on the headline workload
(docs/performance.md), the second peer. Random Qwen3-0.6B-shaped weights (speed does not
depend on them). As in the published figure, every request runs to 1,024 new tokens (one
GenerationConfig for the batch); output tok/s counts the tokens actually generated. Prints one
JSON line."""

from __future__ import annotations

import argparse
import json
import time

from common import dummy_model_dir, headline_workload


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-seqs", type=int, default=256)
    parser.add_argument("--attn", default="sdpa_paged")
    args = parser.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    model_dir = dummy_model_dir("qwen3-0.6b")
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(
        config, dtype=torch.bfloat16, attn_implementation=args.attn
    )
    model = model.cuda().eval()
    prompts, _ = headline_workload(args.num_seqs)
    gen_config = GenerationConfig(
        max_new_tokens=1024, do_sample=True, temperature=0.6, eos_token_id=-1, pad_token_id=0
    )
    model.generate_batch(inputs=[[1, 2, 3, 4]], generation_config=gen_config, progress_bar=False)
    start = time.perf_counter()
    outputs = model.generate_batch(inputs=prompts, generation_config=gen_config, progress_bar=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.generated_tokens) for o in outputs.values())
    print(
        json.dumps(
            {
                "bench": "hf_generate_batch",
                "num_seqs": args.num_seqs,
                "attn": args.attn,
                "generated": generated,
                "seconds": round(seconds, 3),
                "output_tok_s": round(generated / seconds, 1),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

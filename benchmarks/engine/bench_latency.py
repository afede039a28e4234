"""Batch-1 latency on dummy weights: time to first token for a 1,000-token prompt (median of
--ttft-samples, each a new prompt; its quartiles too) and time per output token over 256 greedy
tokens (median of 3). Prints one JSON line."""

from __future__ import annotations

import argparse
import json

from benchmarks.common import dummy_model_dir, require_cuda
from benchmarks.workloads import measure_batch1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-name", default="qwen3-0.6b")
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--deterministic", action="store_true")
    parser.add_argument(
        "--max-mixed-graph-tokens", type=int, default=None, help="0: eager (default: the engine's)"
    )
    parser.add_argument(
        "--prefill-attention-kernel", default=None, help="auto|triton|gluon (default: the engine's)"
    )
    parser.add_argument("--ttft-samples", type=int, default=15)
    args = parser.parse_args()
    require_cuda(parser.prog, f"{args.model_name} at batch 1 would take hours on a CPU")

    from minivllm import LLM, SamplingParams

    options = {
        name: getattr(args, name)
        for name in ("max_mixed_graph_tokens", "prefill_attention_kernel")
        if getattr(args, name) is not None
    }
    llm = LLM(
        dummy_model_dir(args.model_name),
        load_format="dummy",
        max_model_len=4096,
        enable_prefix_caching=False,
        enforce_eager=args.enforce_eager,
        deterministic=args.deterministic,
        **options,
    )

    def generate(prompt: list[int], max_tokens: int) -> None:
        params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)
        llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)

    latency = measure_batch1(generate, ttft_samples=args.ttft_samples)
    print(
        json.dumps(
            {
                "bench": "latency",
                "model": args.model_name,
                "enforce_eager": args.enforce_eager,
                "deterministic": args.deterministic,
                "max_mixed_graph_tokens": llm.config.max_mixed_graph_tokens,
                "prefill_attention_kernel": llm.config.prefill_attention_kernel,
            }
            | latency.fields()
        ),
        flush=True,
    )
    llm.shutdown()


if __name__ == "__main__":
    main()

"""Host cost of a step's outputs at large batch (no model, no GPU): the runner's read of the
step's logprob rows into dicts (to_runner_logprobs) and OutputProcessor.process over one new
token a request, with the `chat` workload's sampling options (logprobs 5 on an eighth of the
requests) or temperature alone, with text (detokenize, the default) and without
(detokenize=False: token ids only). Random ids over Qwen3's vocabulary (the dummy models'
word-level tokenizer), as the dummy-weight benchmarks sample them. The offline loop does this
on the thread that schedules the next step, with its full collections made rarer as there
(entrypoints/gc_pauses.py).

python -m benchmarks.cpu.bench_output_cpu [--num-seqs 900] [--steps 200]

Prints one JSON line: milliseconds of the thread's CPU time a step (mean) for each mix.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time

from benchmarks.common import dummy_model_dir
from benchmarks.workloads import chat_sampling
from minivllm.engine.runner.sampling.logprob_packing import to_runner_logprobs
from minivllm.engine.types import EngineOutput
from minivllm.entrypoints.gc_pauses import fewer_full_collections
from minivllm.entrypoints.output_processor import OutputProcessor
from minivllm.sampling_params import SamplingParams

VOCAB = 151936
NUM_LOGPROBS = 5  # chat's


def step_ms(tokenizer, options: list[dict], detokenize: bool, num_seqs: int, steps: int) -> float:
    """Mean thread CPU ms a step of reading the step's logprob rows and processing its
    outputs, for num_seqs requests that each get a token a step."""
    rng = random.Random(0)
    processor = OutputProcessor(tokenizer)
    num_logprobs = []
    for i in range(num_seqs):
        params = SamplingParams(max_tokens=None, ignore_eos=True, detokenize=detokenize,
                                **options[i % len(options)])  # fmt: skip
        processor.add_request(f"r{i}", None, [1, 2, 3], params, 0.0)
        num_logprobs.append(params.logprobs)
    total = 0.0
    for _ in range(steps):
        sampled = [rng.randrange(VOCAB) for _ in range(num_seqs)]
        # pack_logprobs' rows as the host reads them: ids, logprobs, the sampled token's rank.
        packed = [
            [float(sampled[i])] + [float(rng.randrange(VOCAB)) for _ in range(NUM_LOGPROBS)]
            + [-1.0] * (NUM_LOGPROBS + 1) + [3.0]
            for i in range(num_seqs) if num_logprobs[i] is not None
        ]  # fmt: skip
        start = time.thread_time()
        rows = to_runner_logprobs(packed, num_logprobs)
        outputs = [
            EngineOutput(f"r{i}", [sampled[i]], new_logprobs=None if rows[i] is None else [rows[i]])
            for i in range(num_seqs)
        ]
        processor.process(outputs)
        total += time.thread_time() - start
    return total / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-seqs", type=int, default=900)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(dummy_model_dir("qwen3-0.6b"))
    gc.collect()
    gc.freeze()  # as the engine does after its start: what exists is not walked again
    mixes = {"chat": chat_sampling(random.Random(0), 1000), "temperature": [{"temperature": 0.7}]}
    result: dict[str, object] = {"num_seqs": args.num_seqs, "steps": args.steps}
    for name, options in mixes.items():
        for detokenize in (True, False):
            with fewer_full_collections():
                ms = step_ms(tokenizer, options, detokenize, args.num_seqs, args.steps)
            result[f"{name}{'' if detokenize else '_no_text'}_ms"] = round(ms, 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

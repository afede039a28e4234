"""The offline frontend's ceiling: tokens/s one LLM process can route when its engine cores
cost nothing. Each replica (data_parallel_size=N, core processes) runs FakeEngineCore, which
emits one token per running request every --step-ms; the parent does what it does for a real
model (routing, unpickling, output processing). Prints one JSON line: output tok/s and the
parent's CPU microseconds per token.

python -m benchmarks.cpu.bench_frontend_cpu [--data-parallel-size 2] [--num-seqs 1024]
    [--output-len 200] [--step-ms 0] [--max-num-seqs 256] [--stop]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import time

from benchmarks.common import dummy_model_dir


class FakeEngineCore:
    """EngineCore's interface to core_process, with free steps: up to max_num_seqs running
    requests get one (random) token a step; no model, no KV cache."""

    def __init__(self, config, model_config) -> None:
        from minivllm.engine.stats import CoreInfo

        self.model_config = model_config
        self.info = CoreInfo(
            max_model_len=config.max_model_len or 4096,
            vocab_size=self.model_config.vocab_size,
            num_blocks=1 << 20,
            block_size=config.block_size,
            pid=os.getpid(),
        )
        self.max_num_seqs = config.max_num_seqs or 256
        self.step_s = float(os.environ.get("FAKE_CORE_STEP_MS", "0")) / 1000
        self.waiting: dict[str, int] = {}
        self.running: dict[str, int] = {}
        self.rng = random.Random(0)

    def add_requests(self, requests) -> None:  # EngineRequests
        for request in requests:
            self.waiting[request.req_id] = request.sampling_params.max_tokens

    def abort_requests(self, req_ids) -> None:
        for req_id in req_ids:
            self.waiting.pop(req_id, None)
            self.running.pop(req_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def stats(self):
        from minivllm.engine.stats import EngineStats

        return EngineStats(num_running=len(self.running), num_waiting=len(self.waiting))

    def step(self) -> list:
        from minivllm.engine.types import EngineOutput

        while self.waiting and len(self.running) < self.max_num_seqs:
            req_id = next(iter(self.waiting))
            self.running[req_id] = self.waiting.pop(req_id)
        if self.step_s:
            time.sleep(self.step_s)
        outputs = []
        for req_id, left in list(self.running.items()):
            done = left == 1
            token = self.rng.randrange(10, 10000)
            outputs.append(EngineOutput(req_id, [token], done, "length" if done else None))
            if done:
                del self.running[req_id]
            else:
                self.running[req_id] = left - 1
        return outputs

    def shutdown(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data-parallel-size", type=int, default=2)
    parser.add_argument("--num-seqs", type=int, default=1024)
    parser.add_argument("--input-len", type=int, default=100)
    parser.add_argument("--output-len", type=int, default=200)
    parser.add_argument("--step-ms", type=float, default=0.0)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--stop", action="store_true", help="stop strings: detokenize per step")
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    # The core processes import the fake core as this module (they start in this directory,
    # the repository's root, where `-m` puts it first on their path too).
    os.environ["MINIVLLM_CORE_FACTORY"] = f"{__spec__.name}:FakeEngineCore"
    os.environ["FAKE_CORE_STEP_MS"] = str(args.step_ms)

    from minivllm import LLM, SamplingParams

    llm = LLM(
        args.model or dummy_model_dir("qwen3-0.6b"),
        device="cpu",
        load_format="dummy",
        max_model_len=4096,
        max_num_seqs=args.max_num_seqs,
        data_parallel_size=args.data_parallel_size,
    )
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(10, 10000) for _ in range(args.input_len)]}
        for _ in range(args.num_seqs)
    ]
    stop = ["\x00never"] if args.stop else None
    params = SamplingParams(max_tokens=args.output_len, ignore_eos=True, stop=stop)
    llm.generate(prompts[:8], params, use_tqdm=False)  # warm-up
    cpu0, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    num_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    llm.shutdown()
    result = {
        "bench": "frontend_cpu",
        "dp": args.data_parallel_size,
        "num_seqs": args.num_seqs,
        "output_len": args.output_len,
        "step_ms": args.step_ms,
        "max_num_seqs": args.max_num_seqs,
        "stop_strings": args.stop,
        "output_tok_s": round(num_tokens / seconds),
        "parent_cpu_us_per_token": round(cpu / num_tokens * 1e6, 2),
        "parent_cpu_util": round(cpu / seconds, 2),
        "seconds": round(seconds, 3),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

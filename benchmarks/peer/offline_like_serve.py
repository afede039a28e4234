"""The serving benchmark's requests run offline through LLM.generate: N random prompts of 1,000
token ids and 200 output tokens (ignore_eos, temperature 1.0 as the server's default), dummy
weights. Prints one JSON line (output tok/s, TTFT and TPOT medians), so that the server's rate
at high concurrency can be set against the engine's offline rate.

Usage: python -m benchmarks.peer.offline_like_serve MODEL_DIR [NUM_PROMPTS] [INPUT_LEN] [OUTPUT_LEN]
       [MAX_NUM_SEQS] [MAX_NUM_BATCHED_TOKENS] [MAX_MIXED_GRAPH_TOKENS]
MAX_NUM_SEQS: e.g. 128, the concurrency the server was driven at; MAX_NUM_BATCHED_TOKENS: e.g.
8192, the server's default (the log's "scheduler limits (server)"), so that the comparison is
the same engine with and without the serving path; both default to the offline engine's.
MAX_MIXED_GRAPH_TOKENS: the largest mixed step replayed as piecewise CUDA graphs.
"""

from __future__ import annotations

import json
import sys
import time

from benchmarks.common import percentile
from benchmarks.workloads import random_prompts
from minivllm import LLM, SamplingParams

model_dir = sys.argv[1]
num_prompts = int(sys.argv[2]) if len(sys.argv) > 2 else 512
input_len = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
output_len = int(sys.argv[4]) if len(sys.argv) > 4 else 200
limits = {}
names = ((5, "max_num_seqs"), (6, "max_num_batched_tokens"), (7, "max_mixed_graph_tokens"))
for index, name in names:
    if len(sys.argv) > index:
        limits[name] = int(sys.argv[index])

llm = LLM(model_dir, load_format="dummy", max_model_len=4096, **limits)
# `vllm bench serve` sends no temperature: the server samples at its default, 1.0 (the dummy
# model has no generation_config sampling defaults). The same here.
params = SamplingParams(temperature=1.0, ignore_eos=True, max_tokens=output_len)
prompts = [{"prompt_token_ids": p} for p in random_prompts(num_prompts, input_len)]
llm.generate(prompts[:4], SamplingParams(max_tokens=8), use_tqdm=False)  # warm-up
start = time.perf_counter()
outputs = llm.generate(prompts, params, use_tqdm=False)
seconds = time.perf_counter() - start
num_output = sum(len(o.outputs[0].token_ids) for o in outputs)
# Per request, as `vllm bench serve` reports them for the server: TTFT from the call's start
# (the request's arrival), TPOT over the rest of its tokens.
ttfts = [o.metrics.first_token_time - o.metrics.arrival_time for o in outputs]
tpots = [
    (o.metrics.finished_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
    for o in outputs
]
print(
    json.dumps(
        {
            "benchmark": "offline_like_serve",
            "num_prompts": num_prompts,
            "input_len": input_len,
            "output_len": output_len,
            **llm.engine.setup.limits._asdict(),
            "options": limits,
            "seconds": round(seconds, 3),
            "output_tok_s": round(num_output / seconds, 1),
            "ttft_p50_ms": round(1000 * percentile(ttfts, 0.5), 2),
            "tpot_p50_ms": round(1000 * percentile(tpots, 0.5), 3),
            # Requests in the engine (scheduled, not yet finished), averaged over the run:
            # set against the server's sampled num_requests_running (peer_serve.sh).
            "mean_running": round(
                sum(o.metrics.finished_time - o.metrics.first_scheduled_time for o in outputs)
                / seconds,
                1,
            ),
        }
    )
)
llm.shutdown()

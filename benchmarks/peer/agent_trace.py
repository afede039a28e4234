"""A multi-turn agent trace through either engine: how much of each prompt the prefix cache
serves (the case of hybrid models, whose hits need a recurrent-state snapshot). CONVERSATIONS
conversations share a system prompt with tool definitions (4,000 ids); each turn's prompt is
the conversation so far (the turn before's prompt and answer) and a new message (the user's
request first, then a tool's result); every conversation's turn k runs in one generate.
Answer and message lengths are seeded, the same for both engines. Prints one JSON line: prompt
tokens, those served from the cache (each output's num_cached_tokens), the hit rate over all
turns and over turns 2 on, its ceiling (the share of prompt tokens seen before, in an earlier
prompt or answer: the rest no cache can serve; 0.902 at the default shape), and the time.

Usage: [GPU_UTIL=0.9] [ENGINE_OPTIONS='{"enable_prefix_caching": true}']
       python -m benchmarks.peer.agent_trace ENGINE MODEL_DIR [CONVERSATIONS] [TURNS]
            ENGINE: minivllm | vllm; MODEL_DIR: a checkpoint's directory (dummy weights), e.g.
            python -c "from benchmarks.common import dummy_model_dir as d; print(d('qwen3.5-9b'))"
            CONVERSATIONS: 32; TURNS: 8
Engines are built as peer_workload_bench.py builds them (its environment variables too).
"""

from __future__ import annotations

import json
import random
import sys
import time

from benchmarks.peer.peer_workload_bench import ENGINES, build, scheduler_limits
from benchmarks.workloads import MAX_TOKEN_ID

SYSTEM_TOKENS = 4000


def _ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(10, MAX_TOKEN_ID) for _ in range(n)]


def trace_shape(conversations: int, turns: int, seed: int = 0):
    """(system ids, first messages [c], later messages [t - 1][c], answer lengths [t][c])."""
    rng = random.Random(seed)
    system = _ids(rng, SYSTEM_TOKENS)
    first = [_ids(rng, rng.randint(100, 400)) for _ in range(conversations)]
    later = [[_ids(rng, rng.randint(100, 1500)) for _ in range(conversations)]
             for _ in range(turns - 1)]  # fmt: skip
    answers = [[rng.randint(30, 200) for _ in range(conversations)] for _ in range(turns)]
    return system, first, later, answers


def run_trace(llm, params, conversations: int, turns: int) -> dict:
    system, first, later, answers = trace_shape(conversations, turns)
    prompts = [system + message for message in first]
    per_turn = []
    start = time.perf_counter()
    for turn in range(turns):
        requests = [params(n, temperature=0.0) for n in answers[turn]]
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], requests,
                               use_tqdm=False)  # fmt: skip
        per_turn.append((sum(map(len, prompts)), sum(o.num_cached_tokens or 0 for o in outputs)))
        if turn + 1 < turns:
            prompts = [p + list(o.outputs[0].token_ids) + m
                       for p, o, m in zip(prompts, outputs, later[turn], strict=True)]  # fmt: skip
    seconds = time.perf_counter() - start
    prompt_tokens = sum(n for n, _ in per_turn)
    never_seen = len(system) + sum(map(len, first)) + sum(len(m) for turn in later for m in turn)
    cached = sum(c for _, c in per_turn)
    later_prompt = sum(n for n, _ in per_turn[1:])
    later_cached = sum(c for _, c in per_turn[1:])
    return {
        "conversations": conversations,
        "turns": turns,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": cached,
        "hit_rate": round(cached / prompt_tokens, 4),
        "hit_rate_after_first_turn": round(later_cached / max(later_prompt, 1), 4),
        "hit_rate_by_turn": [round(c / n, 4) for n, c in per_turn],
        "hit_rate_ceiling": round(1 - never_seen / prompt_tokens, 4),
        "seconds": round(seconds, 2),
        "prompt_tok_per_s": round(prompt_tokens / seconds, 1),
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3, 4) or argv[0] not in ENGINES:
        print(__doc__, file=sys.stderr)
        return 2
    engine, model_dir = argv[:2]
    conversations = int(argv[2]) if len(argv) >= 3 else 32
    turns = int(argv[3]) if len(argv) == 4 else 8
    max_model_len = SYSTEM_TOKENS + 400 + turns * (200 + 1500) + 256
    llm, params = build(engine, model_dir, max_model_len)
    llm.generate([{"prompt_token_ids": [11, 12, 13, 14]}], params(8), use_tqdm=False)  # warm-up
    result = {"engine": engine, "bench": "agent_trace"} | scheduler_limits(engine, llm)
    print(json.dumps(result | run_trace(llm, params, conversations, turns)), flush=True)
    if engine == "minivllm":
        llm.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env bash
# vLLM and minivllm side by side on one GPU: each named workload (benchmarks/workloads.py, or
# `latency` for batch 1) through benchmarks/peer/peer_workload_bench.py, the engines alternating,
# twice each, so that a claim is a median of alternating runs in one call. vLLM must be
# importable from $VLLM_SITE; KV_CACHE_DTYPE=fp8, DETERMINISTIC=1 with VLLM_BATCH_INVARIANT=1,
# and TP=2 pass through to both engines. One JSON line per run.
# LLG_SITE: a site with llguidance (minivllm imports it; the GPU image lacks it).
# A comma-separated WORKLOAD (chat,chat-temperature) runs its workloads on one engine start.
# ROUNDS: runs of each engine (default 2); TIMEOUT: seconds a run may take (default 300).
# Usage: [VLLM_SITE=/tmp/vsite] [LLG_SITE=/tmp/site] [MODEL=/tmp/q06] [ROUNDS=2] [TIMEOUT=300]
#        bash benchmarks/peer/peer_run.sh [WORKLOAD ...]
#        (default: headline short long prefix latency)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
VSITE=${VLLM_SITE:-/tmp/vsite}
MODEL=${MODEL:-/tmp/q06}
[ -d "$MODEL" ] || PYTHONPATH=$PWD python3 -c "import sys; from minivllm.tiny_model import \
make_dummy_model_dir; make_dummy_model_dir('qwen3-0.6b', sys.argv[1])" "$MODEL"
for workload in ${*:-headline short long prefix latency}; do
  for round in $(seq "${ROUNDS:-2}"); do
    PYTHONPATH=$VSITE timeout "${TIMEOUT:-300}" python3 -m benchmarks.peer.peer_workload_bench vllm "$MODEL" "$workload" 2>&1 | grep '^{'
    PYTHONPATH=$PWD${LLG_SITE:+:$LLG_SITE} timeout "${TIMEOUT:-300}" python3 -m benchmarks.peer.peer_workload_bench minivllm "$MODEL" "$workload" 2>&1 | grep '^{'
  done
done

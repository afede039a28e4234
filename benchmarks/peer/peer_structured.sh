#!/usr/bin/env bash
# Structured outputs side by side on one GPU, minivllm and vLLM 0.20.2 (xgrammar), the headline
# workload with every request under bench_structured.py's JSON schema.
# Usage: VLLM_SITE=/tmp/vsite LLG_SITE=/tmp/site bash benchmarks/peer/peer_structured.sh DIR [PART]
# DIR: `python -m benchmarks.engine.bench_structured make DIR` (a real tokenizer). LLG_SITE: a site with
# llguidance >= 1.9 (and, for PART served, fastapi / uvicorn / pydantic), put ahead of VLLM_SITE
# for minivllm (vLLM's wheels pin llguidance 1.3, which minivllm refuses).
# PART offline (default): ours constrained, ours unconstrained and vLLM constrained, alternating,
# twice (~6 minutes). served: `minivllm serve` constrained and unconstrained, then `vllm serve`
# constrained, each server alone on the GPU, 128 clients (bench_serving.py), twice (~7 minutes).
# ttft: batch-1 TTFT with a cached grammar (bench_grammar_ttft.py). shape: ours only, the serving
# benchmark's requests offline at the server's limits (bench_structured.py --served-shape),
# constrained and unconstrained alternating, each with --phases and then with --gpu-profile.
set -u
DIR=$(cd "${1:?usage: peer_structured.sh DIR [offline|served|ttft|shape]}" && pwd)
PART=${2:-offline}
VSITE=${VLLM_SITE:-/tmp/vsite}
LSITE=${LLG_SITE:-/tmp/site}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
cd "$(dirname "$0")/../.."  # the repository's root: the benchmarks run as its modules
ROOT=$PWD
# shellcheck source=peer_lib.sh
. benchmarks/peer/peer_lib.sh

ours() {  # bench_structured.py flags
  PYTHONPATH=$ROOT:$LSITE:$VSITE timeout 200 python3 -m benchmarks.engine.bench_structured run minivllm "$DIR" "$@" \
    2> "$OUT/ours_err.log" | grep '^{' || tail -5 "$OUT/ours_err.log"
}
theirs() {
  PYTHONPATH=$VSITE timeout 240 python3 -m benchmarks.engine.bench_structured run vllm "$DIR" "$@" \
    2> "$OUT/vllm_err.log" | grep '"engine"' || tail -5 "$OUT/vllm_err.log"
}
served() {  # name port bench_serving.py flags: one round against a server on port
  local name=$1 port=$2
  shift 2
  PYTHONPATH=$ROOT:$LSITE:$VSITE timeout 200 python3 -m benchmarks.engine.bench_serving --model "$DIR" --port "$port" \
    --skip-offline "$@" 2> "$OUT/client_$name.log" | grep '^{' | sed "s/^/$name /" \
    || tail -5 "$OUT/client_$name.log"
}

case $PART in
  offline)
    ours --max-tokens 16 --num-requests 8 > /dev/null  # the first process compiles the kernels
    for _ in 1 2; do
      ours
      ours --unconstrained
      theirs
    done
    ;;
  served)
    for round in 1 2; do
      PYTHONPATH=$ROOT:$LSITE:$VSITE setsid python3 -m minivllm serve "$DIR" --load-format dummy \
        --max-model-len 4096 --port 8012 --disable-log-requests --disable-uvicorn-access-log \
        > "$OUT/minivllm_serve.log" 2>&1 &
      pid=$!
      # Seeds: each run's prompts new to its server (its prefix cache would skip their
      # prefill); vLLM's constrained run gets ours.
      if wait_healthy 8012 240; then
        served "minivllm_constrained_$round" 8012 --json-schema --seed "1$round"
        served "minivllm_free_$round" 8012 --seed "2$round"
      else tail -5 "$OUT/minivllm_serve.log"; fi
      stop $pid
      PYTHONPATH=$VSITE setsid python3 -m vllm.entrypoints.cli.main serve "$DIR" --load-format dummy \
        --max-model-len 4096 --port 8011 --disable-uvicorn-access-log > "$OUT/vllm_serve.log" 2>&1 &
      pid=$!
      if wait_healthy 8011 240; then
        served "vllm_constrained_$round" 8011 --json-schema --seed "1$round"
      else tail -5 "$OUT/vllm_serve.log"; fi
      stop $pid
    done
    ;;
  shape)
    ours --max-tokens 16 --num-requests 8 > /dev/null  # the first process compiles the kernels
    for flags in --phases --gpu-profile; do
      ours --served-shape "$flags"
      ours --served-shape --unconstrained "$flags"
    done
    ;;
  ttft)
    PYTHONPATH=$ROOT:$LSITE timeout 200 python3 -m benchmarks.engine.bench_grammar_ttft "$DIR" 2> "$OUT/ttft_err.log" \
      | grep '^{' || tail -5 "$OUT/ttft_err.log"
    ;;
  *)
    echo "unknown part '$PART': offline, served, ttft or shape" >&2
    exit 2
    ;;
esac

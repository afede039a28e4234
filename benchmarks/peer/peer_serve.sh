#!/usr/bin/env bash
# Serving side by side on one GPU: `vllm serve` and `minivllm serve`, both driven by vLLM's own
# load generator (`vllm bench serve`), Qwen3-0.6B dummy weights, random 1,000-token prompts and
# 200 output tokens (--ignore-eos); then the same requests offline through minivllm's
# LLM.generate (benchmarks/peer/offline_like_serve.py). vLLM must be importable from $VLLM_SITE.
# Prints the summary; the logs go into one archive, $OUT/peer_serve_logs.tgz (a device call
# returns at most 8 files).
# Usage: [VLLM_SITE=/tmp/vsite] bash benchmarks/peer/peer_serve.sh [GPU_INDEX] [PART]
# PART: all (default): serve, then offline. serve: both servers up on the GPU (0.42 of it each)
# and driven in turn, twice each, at 10 req/s (300 prompts) and at 128 clients (512 prompts).
# offline: the offline runs only (the vLLM start-up and both parts may not fit one 600 s call).
# alone: minivllm's server alone on the GPU (as a user runs it, and as the offline runs run) at
# 128 clients twice, then the offline runs: served against offline.
# each-alone: the two servers at 128 clients, alternating, each started alone on the GPU for its
# round and stopped after it (twice each: ~6 minutes, vLLM's start-up is ~95 s), then offline.
# OFFLINE=0 leaves out the offline runs (each-alone and the install then fit one 600 s call).
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
export CUDA_VISIBLE_DEVICES=${1:-0}
PART=${2:-all}
case $PART in
  all | serve | offline | alone | each-alone) ;;
  *) echo "unknown part '$PART': all, serve, offline, alone or each-alone" >&2; exit 2 ;;
esac
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
LOGS=$(mktemp -d)
trap 'tar -czf "$OUT/peer_serve_logs.tgz" -C "$LOGS" . && rm -rf "$LOGS"' EXIT
MODEL=/tmp/q06
[ -d $MODEL ] || PYTHONPATH=$PWD python3 -c "import sys; from minivllm.tiny_model import \
make_dummy_model_dir; make_dummy_model_dir('qwen3-0.6b', sys.argv[1])" $MODEL
VSITE=${VLLM_SITE:-/tmp/vsite}
# shellcheck source=peer_lib.sh
. "$(dirname "$0")/peer_lib.sh"

thread_ticks() {  # pid: CPU ticks (utime + stime) of the process's main thread; for a server,
  # its event loop; for the load generator, its asyncio loop
  sed 's/.*) //' "/proc/$1/task/$1/stat" 2>/dev/null | awk '{print $12 + $13}'
}

sample_running() {  # port server_pid client_pid file: every 50 ms, the server's
  # num_requests_running and num_requests_waiting (vLLM's names, ours under the minivllm:
  # prefix) and the CPU ticks of the server's and the client's main threads, until killed
  while sleep 0.05; do
    counts=$(curl -s "http://127.0.0.1:$1/metrics" | awk '
      /^(vllm|minivllm):num_requests_running/ {r = $NF} /^(vllm|minivllm):num_requests_waiting/ {w = $NF}
      END {print r + 0, w + 0}')
    echo "$(date +%s.%N) $counts $(thread_ticks "$2") $(thread_ticks "$3")"
  done > "$4"
}

summarize_samples() {  # file: while requests ran (the idle samples before and after left out),
  # the mean numbers running and waiting, and how busy each main thread was (1.0: a saturated
  # core, that loop is the bound)
  awk -v hz="$(getconf CLK_TCK)" '$2 > 0 && NF == 5 {
      if (n) { dt += $1 - t; ds += $4 - s; dc += $5 - c }
      t = $1; s = $4; c = $5; r += $2; w += $3; n++ }
    END { if (n > 1) printf "at 128 clients: running mean %.1f, waiting mean %.1f, over %d samples; main thread busy: server %.2f, client %.2f\n", r / n, w / n, n, ds / hz / dt, dc / hz / dt }' "$1"
}

server_latency() {  # port: "ttft_sum ttft_count queue_sum queue_count", the server's own
  # histograms (TTFT from the request's arrival at the engine, after tokenization)
  curl -s "http://127.0.0.1:$1/metrics" | awk '
    $1 ~ /time_to_first_token_seconds_sum/ {a = $NF} $1 ~ /time_to_first_token_seconds_count/ {b = $NF}
    $1 ~ /request_queue_time_seconds_sum/ {c = $NF} $1 ~ /request_queue_time_seconds_count/ {d = $NF}
    END {print a + 0, b + 0, c + 0, d + 0}'
}

print_server_latency() {  # before after: the means over the requests between the two scrapes
  echo "$1 $2" | awk '{n = $6 - $2; q = $8 - $4; if (n > 0 && q > 0) printf "server view: TTFT mean %.1f ms, queue mean %.1f ms over %d requests\n", 1000 * ($5 - $1) / n, 1000 * ($7 - $3) / q, n}'
}

bench() {  # name port seed server_pid (a new seed per round: no prefix-cache hits from the round before)
  local common="--backend openai --base-url http://127.0.0.1:$2 --model $MODEL --dataset-name random
    --random-input-len 1000 --random-output-len 200 --ignore-eos
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99"
  if [ "$PART" = all ] || [ "$PART" = serve ]; then
    PYTHONPATH=$VSITE timeout 200 python3 -m vllm.entrypoints.cli.main bench serve $common \
      --num-prompts 300 --request-rate 10 --seed $3 --save-result --save-detailed \
      --result-dir "$LOGS" --result-filename "serve_${1}_rate10.json" > "$LOGS/serve_${1}_rate10.log" 2>&1
  fi
  local before
  before=$(server_latency "$2")
  PYTHONPATH=$VSITE timeout 200 python3 -m vllm.entrypoints.cli.main bench serve $common \
    --num-prompts 512 --request-rate inf --max-concurrency 128 --seed $(($3 + 100)) > "$LOGS/serve_${1}_c128.log" 2>&1 &
  local timer=$!
  sleep 0.5
  sample_running "$2" "$4" "$(pgrep -P $timer | head -1)" "$LOGS/running_${1}_c128.txt" &
  local sampler=$!
  wait $timer
  kill $sampler
  summarize_samples "$LOGS/running_${1}_c128.txt"
  print_server_latency "$before" "$(server_latency "$2")"
  for f in rate10 c128; do
    [ -f "$LOGS/serve_${1}_$f.log" ] || continue
    echo "== $1 $f"
    grep -E "Successful|Failed|throughput|TTFT|TPOT|ITL|E2EL" "$LOGS/serve_${1}_$f.log" | grep -v "^--" | head -20
  done
}

start_vllm() {  # [memory fraction]: starts `vllm serve` on port 8011, sets vpid
  PYTHONPATH=$VSITE setsid python3 -m vllm.entrypoints.cli.main serve $MODEL --load-format dummy \
    --max-model-len 4096 --port 8011 --gpu-memory-utilization "${1:-0.9}" \
    --disable-uvicorn-access-log > "$LOGS/vllm_serve.log" 2>&1 &
  vpid=$!
  wait_healthy 8011 240 || tail -5 "$LOGS/vllm_serve.log"
}

start_minivllm() {  # [memory fraction]: starts `minivllm serve` on port 8012, sets mpid
  PYTHONPATH=$VSITE:$PWD setsid python3 -m minivllm serve $MODEL --load-format dummy \
    --max-model-len 4096 --port 8012 --gpu-memory-utilization "${1:-0.9}" \
    --disable-log-requests --disable-uvicorn-access-log > "$LOGS/minivllm_serve.log" 2>&1 &
  mpid=$!
  wait_healthy 8012 240 || tail -5 "$LOGS/minivllm_serve.log"
}

if [ "$PART" = each-alone ]; then
  for round in 1 2; do
    start_vllm
    bench vllm_$round 8011 $round $vpid
    stop $vpid
    start_minivllm
    bench minivllm_$round 8012 $round $mpid
    stop $mpid
    wait $mpid; echo "minivllm serve exit code: $?"
  done
elif [ "$PART" = alone ]; then
  start_minivllm
  for round in 1 2; do
    bench minivllm_$round 8012 $round $mpid
  done
  stop $mpid
  wait $mpid; echo "minivllm serve exit code: $?"
elif [ "$PART" != offline ]; then
  # Both servers stay up on the same GPU (0.42 of it each: the load is 128 sequences at most) and
  # are driven in turn, twice each, so that a claim is a median of alternating runs.
  start_vllm 0.42
  start_minivllm 0.42
  for round in 1 2; do
    bench vllm_$round 8011 $round $vpid
    bench minivllm_$round 8012 $round $mpid
  done
  curl -s http://127.0.0.1:8012/metrics | grep -E "^minivllm:(num_preemptions|prefix_cache|generation_tokens|request_success)" | head -12
  stop $vpid
  stop $mpid
  wait $mpid; echo "minivllm serve exit code: $?"
  echo "Triton compiles after minivllm's warm-up: $(grep -c 'Triton compiled' "$LOGS/minivllm_serve.log")"
  grep "Triton compiled" "$LOGS/minivllm_serve.log" | cut -c1-300 | head -5
fi

if [ "$PART" != serve ] && [ "${OFFLINE:-1}" = 1 ]; then
  # The same requests offline, at the server's concurrency (128 in flight): twice with the
  # server's scheduler limits (the same engine without the serving path), once at the offline
  # defaults (max_num_batched_tokens 16,384 instead of the server's 8,192).
  limit=$(grep -so "max_num_batched_tokens=[0-9]*" "$LOGS/minivllm_serve.log" | head -1 | cut -d= -f2)
  for round in 1 2; do
    PYTHONPATH=$PWD timeout 200 python3 -m benchmarks.peer.offline_like_serve $MODEL 512 1000 200 128 ${limit:-8192} 2>&1 | tail -1
  done
  PYTHONPATH=$PWD timeout 200 python3 -m benchmarks.peer.offline_like_serve $MODEL 512 1000 200 128 2>&1 | tail -1
fi

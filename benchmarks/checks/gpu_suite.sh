#!/usr/bin/env bash
# One batched GPU measurement on the device machine (see docs/performance.md), a part a call:
#   tests   every GPU test but the streamed server test (320-500 s on an H100)
#   server  the streamed server test (512 requests at 128 clients against the same offline)
#   bench   the kernel rates, throughput, decode profile and latency
# Usage: bash benchmarks/checks/gpu_suite.sh tests|server|bench   (results under $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
part=${1:-tests}
server_test=tests/entrypoints/server/test_server_gpu.py
if [ "$part" = tests ]; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
  timeout 560 python3 -m pytest -q -m gpu -s -rfEs -p no:cacheprovider --durations=25 tests \
    --ignore "$server_test" 2>&1 | tee "$OUT/gpu_tests.log" \
    | grep -E "GPU-|passed|failed|FAILED|ERROR|SKIPPED" | tail -40
elif [ "$part" = server ]; then
  timeout 560 python3 -m pytest -q -m gpu -s -p no:cacheprovider "$server_test" 2>&1 | tee "$OUT/gpu_server.log" | tail -15
else
  timeout 200 python3 -m benchmarks.kernels.bench_kernels 2>&1 | tee "$OUT/bench_kernels.jsonl" | tail -60
  for args in "" "--no-async-scheduling" "--enforce-eager"; do
    timeout 240 python3 -m benchmarks.engine.bench_throughput $args 2>&1 | tee -a "$OUT/throughput.log" | grep -E "^\{|Error|error|memory profile|KV cache" | tail -8
  done
  for args in "" "--no-async-scheduling"; do
    timeout 150 python3 -m benchmarks.engine.profile_decode $args 2>&1 | tee -a "$OUT/profile.log" | grep -E "^\{|Error|error" | tail -4
  done
  timeout 120 python3 -m benchmarks.engine.bench_latency 2>&1 | tee -a "$OUT/latency.log" | grep -E "^\{|Error|error" | tail -5
fi

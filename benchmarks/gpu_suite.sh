#!/usr/bin/env bash
# One batched GPU measurement on the device machine (see docs/performance.md).
# Usage: bash benchmarks/gpu_suite.sh tests|bench   (results under $OUT)
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
part=${1:-tests}
if [ "$part" = tests ]; then
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
  python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$OUT/gpu.txt"
  timeout 330 python3 -m pytest -q -m gpu -s -p no:cacheprovider tests/kernels tests/attention tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "GPU-|passed|failed|Error|error" | tail -40
  timeout 200 python3 benchmarks/bench_kernels.py 2>&1 | tee "$OUT/bench_kernels.jsonl" | tail -60
else
  for args in "" "--no-async-scheduling" "--enforce-eager"; do
    timeout 240 python3 benchmarks/bench_throughput.py $args 2>&1 | tee -a "$OUT/throughput.log" | grep -E "^\{|Error|error|memory profile|KV cache" | tail -8
  done
  for args in "" "--no-async-scheduling"; do
    timeout 150 python3 benchmarks/profile_decode.py $args 2>&1 | tee -a "$OUT/profile.log" | grep -E "^\{|Error|error" | tail -4
  done
  timeout 120 python3 benchmarks/bench_latency.py 2>&1 | tee -a "$OUT/latency.log" | grep -E "^\{|Error|error" | tail -5
fi

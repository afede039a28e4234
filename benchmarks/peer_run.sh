#!/usr/bin/env bash
# Side-by-side run on the device machine: vLLM 0.20.2 and minivllm on the same GPU, same
# workload (../shared/peer/). Needs the vLLM wheel parts in /tmp/vparts (earlier calls) and
# the peer scripts carried in .whl/peer. Results under $OUT.
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/out}
cp .whl/vllm-parts/part_06 .whl/vllm-parts/SHA256SUMS /tmp/vparts/ 2>/dev/null
bash .whl/peer/vllm_install.sh /tmp/vparts > "$OUT/vllm_install.log" 2>&1 || { tail -5 "$OUT/vllm_install.log"; }
python3 .whl/peer/make_dummy_model.py qwen3-0.6b /tmp/q06 > /dev/null
for round in 1 2; do
  (export PYTHONPATH=/tmp/vsite VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
   timeout 200 python3 .whl/peer/peer_bench.py vllm /tmp/q06 2>&1 | tee -a "$OUT/vllm.log" | grep '^{')
  (export PYTHONPATH=$PWD
   timeout 120 python3 .whl/peer/peer_bench.py minivllm /tmp/q06 2>&1 | tee -a "$OUT/minivllm.log" | grep '^{')
done
(export PYTHONPATH=/tmp/vsite VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
 timeout 150 python3 .whl/peer/peer_latency.py vllm /tmp/q06 2>&1 | tee -a "$OUT/vllm.log" | grep '^{')
(export PYTHONPATH=$PWD
 timeout 100 python3 .whl/peer/peer_latency.py minivllm /tmp/q06 2>&1 | tee -a "$OUT/minivllm.log" | grep '^{')

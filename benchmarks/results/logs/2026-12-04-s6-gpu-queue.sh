#!/usr/bin/env bash
# The sixth session's H200 queue, run from /tmp/work (a copy of the commit's tree) as
#   SGLANG_SM120_COMMIT=<sha> bash deploy/bg.sh start q -- bash benchmarks/results/logs/2026-12-04-s6-gpu-queue.sh
# Base 0.5.16 with patch 0302 reading SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE (set by the DSA NVFP4
# test server). Phase A, side by side (KV pools capped): the serving suite of all eight tiny models
# and the greedy-repeat probe (its marlin-atomic variant turns the ordered reduce off). Phase B
# alone: the self-check and check tests (one times a self-check). Phase C alone: the GLM-5 launch
# line (its literal --mem-fraction-static 0.7 cannot share the GPU).
export SGLANG_SM120_COMMIT="${SGLANG_SM120_COMMIT:?the commit measured}" PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny
R=/tmp/res
cd /tmp/work
mkdir -p $R
say() { echo "[queue $(date +%T)] $*"; }
GPU_SUITE_K="test_serving_tiny" bash lab/measure_all.sh $R/suite-serving gpu-suite &
sleep 20
SGLANG_SM120_GPU_MAX_TOKENS=2200000 bash lab/measure_all.sh $R/probe repeat-probe &
wait
say "phase A serving/probe done"
GPU_SUITE_K="test_fp4_selfcheck or test_sm120_check" bash lab/measure_all.sh $R/suite-checks gpu-suite
say "phase B checks done"
bash lab/measure_all.sh $R/launch glm5-launch-line
echo "queue done"

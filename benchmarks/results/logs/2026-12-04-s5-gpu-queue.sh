#!/usr/bin/env bash
# The 2026-12-04 (fifth session) H200 queue, run from /tmp/work (a copy of `git archive HEAD`) as
#   bash deploy/bg.sh start q -- bash benchmarks/results/logs/2026-12-04-s5-gpu-queue.sh
# Base 0.5.16 with patch 0303 in its final form (module-level import of the pinned-plan hooks):
# Phase A, side by side (KV pools capped): the whole layerwise grid of all eight tiny models, and the
# kernel and lean-MoE GPU tests.
# Phase B: the serving suite beside the trap tests (four models), then the two tests that time a
# self-check (< 1 s) alone.
export SGLANG_SM120_COMMIT="${SGLANG_SM120_COMMIT:?the commit measured}" PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny  # the grid step builds every model there first
R=/tmp/res
cd /tmp/work
mkdir -p $R
say() { echo "[queue $(date +%T)] $*"; }
CORRECTNESS_FULL_ZERO_COPY_MODELS= CORRECTNESS_FULL_STAGGER_S=8 bash lab/measure_all.sh $R/grid correctness-full &
sleep 90
GPU_SUITE_K="test_kernels or test_lean_moe" bash lab/measure_all.sh $R/suite-kernels gpu-suite &
wait
say "phase A done"
GPU_SUITE_K="test_serving_tiny" bash lab/measure_all.sh $R/suite-serving gpu-suite &
sleep 20
SGLANG_SM120_GPU_MAX_TOKENS=2200000 TRAPS_K="qwen3_moe" bash lab/measure_all.sh $R/traps-qwen3_moe traps &
sleep 8
SGLANG_SM120_GPU_MAX_TOKENS=2200000 TRAPS_K="glm_moe_dsa" bash lab/measure_all.sh $R/traps-glm_moe_dsa traps &
wait
say "phase B serving/traps done"
GPU_SUITE_K="test_fp4_selfcheck or test_sm120_check" bash lab/measure_all.sh $R/suite-checks gpu-suite
echo "queue done"

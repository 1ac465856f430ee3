#!/usr/bin/env bash
# The 2026-12-04 (fourth session) H200 queue, run from /tmp/work (a copy of `git archive HEAD`) as
#   bash deploy/bg.sh start q -- bash benchmarks/results/logs/2026-12-04-s4-gpu-queue.sh
# Phase A, side by side (KV pools capped): the whole layerwise grid of all eight tiny models
# (base 0.5.16 after the two-base restructuring); glm4_moe bf16's grid with the captured prefill
# attention on FA2 (upstream's plan, SM120's); deepseek_v2 bf16's quick grid (control + layerwise)
# three times as an A/B on the layerwise-mode divergence at bs 1/3 (lab/variants/sitecustomize.py):
# without the warm pass's replay-metadata step, without the overlap scheduler, and with upstream's
# MoE path (SGLANG_SM120_LEAN_MOE=0); the kernel and lean-MoE GPU tests.
# Phase B: the serving suite beside the trap tests (four models), then the two tests that time a
# self-check (< 1 s) alone.
export SGLANG_SM120_COMMIT="${SGLANG_SM120_COMMIT:?the commit measured}" PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny  # the grid step builds every model there first
R=/tmp/res
cd /tmp/work
mkdir -p $R/fa2 $R/v-no-warm-meta $R/v-no-overlap $R/v-upstream-moe
say() { echo "[queue $(date +%T)] $*"; }
grid() {  # grid LABEL KEYWORDS ENV... : one pytest process of the grid, results in $R/LABEL
  local label=$1 k=$2; shift 2
  say "$label: start"
  env "$@" SGLANG_SM120_RESULTS_DIR=$R/$label python3 -m pytest -m gpu -q -p no:cacheprovider \
    --basetemp /tmp/sm120-$label test/gpu/test_layerwise_correctness.py -k "$k" > $R/$label.log 2>&1
  say "$label: rc $? $(grep -E 'passed|failed' $R/$label.log | tail -n 1)"
}
CORRECTNESS_FULL_ZERO_COPY_MODELS= CORRECTNESS_FULL_STAGGER_S=8 bash lab/measure_all.sh $R/grid correctness-full &
sleep 70
grid fa2 glm4_moe-bf16 SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=fa2 SGLANG_SM120_GPU_MAX_TOKENS=2200000 &
sleep 8
for v in no-warm-meta:no-warm-replay-metadata no-overlap:no-overlap-schedule; do
  grid v-${v%%:*} "deepseek_v2-bf16 and not every_size" SGLANG_SM120_GPU_QUICK=1 SGLANG_SM120_GPU_MAX_TOKENS=700000 \
    SGLANG_SM120_LAB_VARIANT=${v#*:} PYTHONPATH=/tmp/work/lab/variants:/tmp/site &
  sleep 8
done
grid v-upstream-moe "deepseek_v2-bf16 and not every_size" SGLANG_SM120_GPU_QUICK=1 SGLANG_SM120_GPU_MAX_TOKENS=700000 \
  SGLANG_SM120_LEAN_MOE=0 &
sleep 8
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

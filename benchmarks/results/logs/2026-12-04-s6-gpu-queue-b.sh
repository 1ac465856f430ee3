#!/usr/bin/env bash
# The sixth session's second H200 queue, run from /tmp/work (a copy of the commit's tree) as
#   SGLANG_SM120_COMMIT=<sha> bash deploy/bg.sh start q -- bash benchmarks/results/logs/2026-12-04-s6-gpu-queue-b.sh
# Base 0.5.16. Alone, one after the other: where the self-check's seconds go (cuBLAS's start or the
# check), the self-check and check tests (the check now times the self-check after cuBLAS's start),
# and the GLM-5 launch line.
export SGLANG_SM120_COMMIT="${SGLANG_SM120_COMMIT:?the commit measured}" PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny
R=/tmp/res
cd /tmp/work
mkdir -p $R
say() { echo "[queue $(date +%T)] $*"; }
python3 lab/selfcheck_cost.py --out $R/selfcheck-cost.json --trials 3 2>&1 | tee $R/selfcheck-cost.log
say "self-check cost done"
GPU_SUITE_K="test_fp4_selfcheck or test_sm120_check" bash lab/measure_all.sh $R/suite-checks gpu-suite
say "checks done"
bash lab/measure_all.sh $R/launch glm5-launch-line
echo "queue done"

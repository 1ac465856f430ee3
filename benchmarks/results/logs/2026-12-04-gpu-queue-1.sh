#!/usr/bin/env bash
# One GPU-host session's queue (run from /tmp/work, a copy of `git archive HEAD`), in priority order.
export PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1
export SGLANG_SM120_TINY_DIR=/tmp/tiny SGLANG_SM120_RESULTS_DIR=/tmp/res
mkdir -p /tmp/res /tmp/tiny
cd /tmp/work
step() { local name=$1; shift; echo "=== $(date -u +%T) $name: $*"; local t0=$SECONDS
  timeout "$STEP_LIMIT" "$@" > "/tmp/res/$name.log" 2>&1; local rc=$?
  echo "=== $(date -u +%T) $name rc=$rc in $((SECONDS - t0)) s"; tail -5 "/tmp/res/$name.log"; }
STEP_LIMIT=1000 step launch-line python3 -m pytest -m gpu -q -s test/gpu/test_glm5_launch_line.py
STEP_LIMIT=600 step check-full python3 -m sglang.sm120 check --json /tmp/res/sm120-check-h200-full.json --tiny-dir /tmp/tiny
STEP_LIMIT=900 step check-tests python3 -m pytest -m gpu -q test/gpu/test_fp4_selfcheck_gpu.py test/gpu/test_sm120_check_gpu.py
STEP_LIMIT=900 step traps-glm python3 -m pytest -m gpu -q test/gpu/test_layerwise_traps.py -k glm_moe_dsa
SGLANG_SM120_GPU_QUICK=1 STEP_LIMIT=1200 step grid-glm-dsa-nvfp4 python3 -m pytest -m gpu -q test/gpu/test_layerwise_correctness.py -k "glm_moe_dsa-nvfp4"
echo "=== all done"

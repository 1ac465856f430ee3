#!/usr/bin/env bash
# Second GPU-host queue of the session (fresh host): the check kit with upstream's backends, its
# self-check fallback tests, then the DSA eager-prefill trap stacks on a short-capture server.
export PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1
export SGLANG_SM120_TINY_DIR=/tmp/tiny SGLANG_SM120_RESULTS_DIR=/tmp/res
mkdir -p /tmp/res /tmp/tiny
cd /tmp/work
step() { local name=$1; shift; echo "=== $(date -u +%T) $name: $*"; local t0=$SECONDS
  timeout "$STEP_LIMIT" "$@" > "/tmp/res/$name.log" 2>&1; local rc=$?
  echo "=== $(date -u +%T) $name rc=$rc in $((SECONDS - t0)) s"; tail -5 "/tmp/res/$name.log"; }
STEP_LIMIT=400 step check-quick python3 -m sglang.sm120 check --quick --json /tmp/res/sm120-check-h200-quick.json --tiny-dir /tmp/tiny
STEP_LIMIT=600 step selfcheck-tests python3 -m pytest -m gpu -q -rA test/gpu/test_fp4_selfcheck_gpu.py
STEP_LIMIT=500 step dsa-prefill-traps bash /tmp/work/dsa_traps.sh
echo "=== all done"

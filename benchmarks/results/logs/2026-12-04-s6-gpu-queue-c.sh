#!/usr/bin/env bash
# The sixth session's third H200 call, run from /tmp/work (a copy of the commit's tree): the
# greedy-repeat tests of the two NVFP4 models whose Marlin MoE reduces in order (glm_moe_dsa through
# SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE, qwen3_moe through --enable-deterministic-inference), after
# patch 0302 moved to resolving that once at the first MoE call.
export PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_RESULTS_DIR=$OUT/serving
cd /tmp/work
python3 -m pytest -m gpu -q -rA -p no:cacheprovider test/gpu/test_serving_tiny.py \
  -k "(glm_moe_dsa-nvfp4 or qwen3_moe-nvfp4) and (greedy or shutdown)" 2>&1 | tee $OUT/serving-pytest.log

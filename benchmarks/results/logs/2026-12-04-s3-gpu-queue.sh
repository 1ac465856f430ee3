#!/usr/bin/env bash
# The 2026-12-04 (third session) H200 queue, run from /tmp/work (a copy of `git archive HEAD`) as
#   bash deploy/bg.sh start q -- bash benchmarks/results/logs/2026-12-04-s3-gpu-queue.sh
# Every job is a lab/measure_all.sh step. The check runs alone (its timing table); the DSA trap test
# and the full layerwise grid of the GLM models (and two of the older models: base 0.5.16 after the
# two-base restructuring) share the GPU, KV pools capped; the literal launch line runs last, alone
# (its --mem-fraction-static 0.7 claims the GPU).
export SGLANG_SM120_COMMIT="${SGLANG_SM120_COMMIT:?the commit measured}" PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_TINY_DIR=/tmp/tiny
R=/tmp/res
cd /tmp/work
bash lab/measure_all.sh $R/check sm120-check
for q in bf16 nvfp4; do
  SGLANG_SM120_GPU_MAX_TOKENS=2200000 TRAPS_K="glm_moe_dsa and $q" bash lab/measure_all.sh $R/traps-$q traps &
  sleep 8
done
CORRECTNESS_FULL_MODELS="glm_moe_dsa-nvfp4 glm_moe_dsa-bf16 glm4_moe-bf16 glm4_moe-nvfp4 qwen3_moe-nvfp4 deepseek_v2-bf16" \
  CORRECTNESS_FULL_ZERO_COPY_MODELS= CORRECTNESS_FULL_STAGGER_S=8 bash lab/measure_all.sh $R/grid correctness-full
wait
bash lab/measure_all.sh $R/launch glm5-launch-line
echo "queue done"

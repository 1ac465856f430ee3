#!/usr/bin/env bash
# The 2026-12-04 (fourth session) second H200 queue, run from /tmp/work as
#   bash deploy/bg.sh start q -- bash benchmarks/results/logs/2026-12-04-s4b-gpu-queue.sh
# Patch 0303 (FlashInfer MLA fast plan waits for its previous plan copy) under the conditions that
# showed the race: deepseek_v2 bf16's quick grid (graphs disabled, upstream's full graphs, layerwise),
# overlap scheduler on, three processes with the patch and two with it undone
# (lab/variants/sitecustomize.py no-pinned-plan-wait), side by side with a bf16 GEMM loop that
# keeps the GPU busy, so the scheduler runs ahead of the GPU.
export SGLANG_SM120_COMMIT="${SGLANG_SM120_COMMIT:?the commit measured}" PYTHONPATH=/tmp/site TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONUNBUFFERED=1 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny
R=/tmp/res
cd /tmp/work
say() { echo "[queue $(date +%T)] $*"; }
grid() {  # grid LABEL ENV... : deepseek_v2-bf16's quick grid, control + layerwise, results in $R/LABEL
  local label=$1; shift
  say "$label: start"
  env "$@" SGLANG_SM120_GPU_QUICK=1 SGLANG_SM120_GPU_MAX_TOKENS=700000 SGLANG_SM120_RESULTS_DIR=$R/$label \
    python3 -m pytest -m gpu -q -p no:cacheprovider --basetemp /tmp/sm120-$label \
    test/gpu/test_layerwise_correctness.py -k "deepseek_v2-bf16 and not every_size" > $R/$label.log 2>&1
  say "$label: rc $? $(grep -E 'passed|failed' $R/$label.log | tail -n 1)"
}
mkdir -p $R /tmp/sm120-tiny
python3 -m sglang.sm120.tiny --arch deepseek_v2 --quant bf16 --out /tmp/sm120-tiny/deepseek_v2-bf16 > $R/tiny.log 2>&1
python3 - > $R/gemm-load.log 2>&1 <<'PY' &
import time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
t0, n = time.time(), 0
while time.time() - t0 < 240:
    a = (a @ a).clamp_(-1, 1)
    n += 1
torch.cuda.synchronize()
print(f"gemm load: {n} 8192^3 bf16 GEMMs in {time.time() - t0:.0f} s")
PY
for i in 1 2 3; do grid patched-$i & sleep 6; done
for i in 1 2; do grid undone-$i SGLANG_SM120_LAB_VARIANT=no-pinned-plan-wait PYTHONPATH=/tmp/work/lab/variants:/tmp/site & sleep 6; done
wait
echo "queue done"

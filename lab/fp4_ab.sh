#!/usr/bin/env bash
# Two W4A16 kernel libraries timed in one call on one GPU, interleaved (new, old, new), so clock and
# host drift between runs shows as the new-vs-new spread instead of hiding in the comparison.
#   bash lab/fp4_ab.sh OLD_LIB NEW_LIB OUT_DIR [SHAPES]
# OLD_LIB / NEW_LIB: a libsm120_kernels.so or its folder (SGLANG_SM120_KERNEL_LIB). SHAPES: the
# bench's --shapes list (substring match; "" for every shape; default: rows far from the Marlin
# target). Writes OUT_DIR/{new1,old,new2}/fp4-gemm.{json,md} and OUT_DIR/compare.md
# (lab/compare_fp4.py). The split-K sweep table is skipped (--no-tune); the per-row split
# columns stay. OLD_ENV / NEW_ENV: extra VAR=VALUE words for that side's runs, e.g.
# OLD_ENV=SGLANG_SM120_W4A16_WARPS=4 to time an older library with the defaults it shipped with.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { sed -n '2,11p' "$0" >&2; exit 2; }
OLD=$1 NEW=$2 OUT=$3
mkdir -p "$OUT"
SHAPES=${4-"gate_up tp8,qwen3-30b qkv tp8,qwen3-30b qkv tp4,gate_up tp4,kv_b tp4,shared down tp8,glm5 q_b tp1,glm5 o_proj tp1"}
PY="${PYTHON:-python3}"
for run in new1 old new2; do
  case $run in old) lib=$OLD extra=${OLD_ENV:-} ;; *) lib=$NEW extra=${NEW_ENV:-} ;; esac
  echo "[fp4-ab $(date +%T)] $run: $lib ${extra}"
  # shellcheck disable=SC2086  # extra: VAR=VALUE words
  env $extra SGLANG_SM120_KERNEL_LIB="$lib" "$PY" benchmarks/bench_fp4_gemm.py --no-tune --shapes "$SHAPES" \
    --results-dir "$OUT/$run" > "$OUT/$run.log" 2>&1 || { echo "[fp4-ab] $run failed:"; tail -n 20 "$OUT/$run.log"; exit 1; }
done
"$PY" lab/compare_fp4.py --base "$OUT"/old/fp4-gemm.json --new "$OUT"/new1/fp4-gemm.json \
  "$OUT"/new2/fp4-gemm.json > "$OUT/compare.md"
cat "$OUT/compare.md"

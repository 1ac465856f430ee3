#!/usr/bin/env bash
# The GPU measurement queue: the project's GPU benchmarks and long GPU tests one after another,
# meant to run as one background job that outlives the host's 10-minute calls:
#
#   bash deploy/bg.sh start measure -- bash benchmarks/gpu_queue.sh RESULTS [STEP...]
#   bash deploy/bg.sh wait measure 560       # in each following call; then copy RESULTS back
#   python benchmarks/status.py --take RESULTS   # here: the outputs of record -> benchmarks/results/
#
# RESULTS is a scratch folder; benchmarks/records.toml says which of its files are results of
# record. The lab steps (prefill-profile, same-tokens-probe, moe-fp4-sweep)
# are probes: their outputs stay in RESULTS and are never records.
#
# Steps (with none named, the list in STEPS=(...) below, most wanted first; docs/benchmarks.md
# says what each runs and writes; cap in seconds; "name" = run by name only):
#   lean-moe 300        test_lean_moe.py: the lean eager MoE vs upstream's, bitwise, and its host time
#   kernels 600         lab/kernels_check.sh without its benchmark: build csrc, smoke, test_kernels.py
#   fp4 300             bench_fp4_gemm.py
#   moe-fp4 600+900     (name) test_moe_w4a16.py, then bench_moe_fp4.py -> RESULTS/moe-fp4-h200.{json,md}
#   moe-fp4-sweep 900   (name) bench_moe_fp4.py at fixed warps per weight tile -> RESULTS/moe-sweep/ (probe)
#   runner 2000         bench_runner.py, its default configurations, saved after each
#   prefill-profile 600 prefill_profile.py: kernel timeline of breakable vs layerwise prefill (probe)
#   prefill-fa2 1200    bench_runner.py layerwise_fa2_prefill + the qwen3_moe bf16 full grid on
#                       SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=fa2 -> RESULTS/fa2/
#   zero-copy 500       bench_runner.py layerwise_zero_copy
#   moe-profile 300     bench_runner.py --profile-eager-moe (cProfile of the eager MoE steps, bs 64)
#   traps 600           test_layerwise_traps.py -k $TRAPS_K (default: qwen3_moe bf16 and nvfp4)
#   correctness 1500    quick grid, -k $CORRECTNESS_K (default: every mode of the bf16 models)
#   correctness-full 2400 each  the whole grid per model of $CORRECTNESS_FULL_MODELS (default: the
#                       four tiny archs, bf16 and NVFP4) side by side, KV pools capped
#                       (SGLANG_SM120_GPU_MAX_TOKENS; sized on the H200), and
#                       $CORRECTNESS_FULL_ZERO_COPY_MODELS (qwen3_moe-bf16) under zero-copy
#                       -> RESULTS/full-grid/[zero-copy/]
#   correctness-moe-sm120 1800  (name) the NVFP4 models' grid on --moe-runner-backend sm120
#                       ($CORRECTNESS_MOE_MODELS; quick unless CORRECTNESS_MOE_FULL=1) -> RESULTS/moe-sm120/
#   correctness-alone 900 each  $CORRECTNESS_ALONE_K's whole grid alone (deepseek_v2-bf16), then
#                       with SGLANG_SM120_LEAN_MOE=0 -> RESULTS/alone/, RESULTS/alone-upstream-moe/
#   eager-warmup 450    bench_runner.py --diagnose-eager-warmup
#   glm5-launch-line 1500  the seed's launch line on tiny glm_moe_dsa NVFP4 beside upstream's defaults
#   sm120-check 900 each   sglang.sm120 check --quick (again on warm caches if over 3 minutes)
#   fp4-selfcheck 600   test_fp4_selfcheck_gpu.py: the self-check and its fault-injected fallback
#   gpu-suite 2400      every GPU test but the correctness grid, -k $GPU_SUITE_K (beside
#                       correctness-full: GPU_SUITE_K="not launch_line", glm5-launch-line after)
#   plan-check 900      plan_check.py on $PLAN_CHECK_MODELS (three tiny bf16 + Qwen3-30B-A3B shapes)
#   glm5-twin 2400      (name) bench_twin.py, --quick unless TWIN_FULL=1, $TWIN_CONFIGS
#   same-tokens-probe 480  lab/same_tokens_probe.py on $SAME_TOKENS_MODEL, $SAME_TOKENS_VARIANTS (probe)
#   dynamo-free-bits 480   (name) test_dynamo_free_bits_gpu.py + test_padded_rows_bits_gpu.py (probes)
#   same-tokens 1200    test_same_tokens.py (quick unless SAME_TOKENS_FULL=1) -> RESULTS/same-tokens-h200.json
#   serving-parity 1800 (name) bench_serving_parity.py on $SERVING_PARITY_MODELS
# Not in the default list (a serving session of their own):
#   client-ceiling 180  client_ceiling.py (no GPU); serving 1800, soak 1200, serving-diag 1800,
#   serving-soak 2700, serving-tw4 2700: the serving matrix and soak; serving-tw4 (4 tokenizer
#                       workers, 4 clients) writes the serving records (tag h200)
# Needs the fork importable (PYTHONPATH=/tmp/site:python on the H200 host) and the kernel library:
# the installed fork's own, or the tree's once the kernels step built it there (the later steps
# then use that one through SGLANG_SM120_KERNEL_LIB; set it yourself to use another).
# Every step's log is RESULTS/<step>.log; the queue's own lines go to stdout with timestamps.
# QUEUE_CAP_PCT=200 doubles every step's cap (for steps that share the GPU with another queue).
# The host's copy of the tree may carry a stale .git: pass SGLANG_SM120_COMMIT=<sha> so the
# results record the commit that was measured.
set -uo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,/^set -uo/p' "$0" | sed '$d' >&2; exit 2; }
RES=$(mkdir -p "$1" && cd "$1" && pwd); shift
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(correctness-full correctness-alone prefill-fa2 runner zero-copy traps kernels fp4 lean-moe prefill-profile correctness moe-profile eager-warmup)
KNOWN="glm5-twin plan-check serving-parity same-tokens-probe same-tokens dynamo-free-bits glm5-launch-line sm120-check fp4-selfcheck gpu-suite lean-moe kernels fp4 moe-fp4 moe-fp4-sweep correctness-moe-sm120 runner prefill-profile prefill-fa2 zero-copy moe-profile traps correctness correctness-full correctness-alone eager-warmup client-ceiling serving soak serving-diag serving-soak serving-tw4"
for s in "${STEPS[@]}"; do  # all checked before the first one starts
  case " $KNOWN " in *" $s "*) ;; *) echo "gpu_queue.sh: unknown step $s ($KNOWN)"; exit 2 ;; esac
done
# The GPU measured on: benchmarks/status.py --take refuses outputs whose GPU model is not the record's
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$RES/gpu.txt" 2>/dev/null || rm -f "$RES/gpu.txt"
TREE_LIB="$PWD/python/sglang/sm120/kernels/lib"
PY="${PYTHON:-python3}"
FAILED=()
say() { echo "[measure $(date +%T)] $*"; }
step() {  # step NAME CAP CMD...
  local name=$1 cap=$(( $2 * ${QUEUE_CAP_PCT:-100} / 100 )); shift 2  # QUEUE_CAP_PCT: steps sharing the GPU run slower
  say "$name: start (cap $cap s): $*"
  local t0=$SECONDS
  timeout "$cap" "$@" > "$RES/$name.log" 2>&1
  local rc=$?
  say "$name: rc $rc after $((SECONDS - t0)) s (124 = hit the cap); $(grep -E 'passed|failed|wrote' "$RES/$name.log" | tail -n 1)"
  [ $rc -eq 0 ] || FAILED+=("$name")
}
say "GPU: $(head -n 1 "$RES/gpu.txt" 2>/dev/null || echo "unknown (no nvidia-smi)")"
grids_side_by_side() {  # PREFIX FOLDER CAP RUN...: one pytest process of the correctness grid per
  # RUN ("label|-k expression|results folder under RES|VAR=value words or empty"), all at once on the one
  # GPU, each KV pool capped; a failed run leaves RES/FOLDER/<label>.failed
  local prefix=$1 folder=$2 cap=$3 r label k dir extra; shift 3
  mkdir -p "$RES/$folder"
  for r in "$@"; do
    IFS='|' read -r label k dir extra <<< "$r"
    (
      FAILED=()
      [ -z "$extra" ] || export $extra  # VAR=value words, this subshell only
      SGLANG_SM120_GPU_MAX_TOKENS=2200000 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny \
        SGLANG_SM120_RESULTS_DIR="$RES/$dir" step "$prefix-$label" "$cap" "$PY" -m pytest -m gpu -q \
        -p no:cacheprovider --basetemp "/tmp/sm120-$prefix-$label" test/gpu/test_layerwise_correctness.py -k "$k"
      [ ${#FAILED[@]} -eq 0 ] || touch "$RES/$folder/$label.failed"
    ) &
    sleep "${CORRECTNESS_FULL_STAGGER_S:-15}"  # engine start-ups pick free ports by probing
  done
  wait
  for f in "$RES/$folder"/*.failed; do [ -e "$f" ] && FAILED+=("$prefix-$(basename "$f" .failed)"); done
}
for s in "${STEPS[@]}"; do
  case "$s" in
    dynamo-free-bits)
      SGLANG_SM120_RESULTS_DIR="$RES" step dynamo-free-bits 480 "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider \
        test/gpu/test_dynamo_free_bits_gpu.py test/gpu/test_padded_rows_bits_gpu.py ;;
    lean-moe)
      SGLANG_SM120_RESULTS_DIR="$RES" step lean-moe 300 "$PY" -m pytest -m gpu -q -p no:cacheprovider \
        test/gpu/test_lean_moe.py -s ;;
    kernels)  # a new library replaces the one SGLANG_SM120_KERNEL_LIB points at for the later steps
      OUT="$RES/kernels-check" BENCH_CAP=0 step kernels 600 bash lab/kernels_check.sh
      [ ! -e "$TREE_LIB/libsm120_kernels.so" ] || export SGLANG_SM120_KERNEL_LIB="$TREE_LIB" ;;
    fp4) step fp4 300 "$PY" benchmarks/bench_fp4_gemm.py --max-seconds 200 --results-dir "$RES" ;;
    moe-fp4)  # the benchmark runs even when a test fails: its own sanity check gates what it times
      step moe-fp4-test 600 "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider test/gpu/test_moe_w4a16.py
      step moe-fp4 900 "$PY" benchmarks/bench_moe_fp4.py --pdl-off --m-tiles 2,4 --profile 1,64,1024 --results-dir "$RES" ;;
    moe-fp4-sweep)
      step moe-fp4-sweep 900 "$PY" benchmarks/bench_moe_fp4.py --shapes glm5-tp8,glm5-ep8 --reps 9 \
        --k-warps 8/1,4/1,2/1,1/1,8/8,8/4,8/2 --results-dir "$RES/moe-sweep" ;;
    plan-check)
      step plan-check 900 "$PY" benchmarks/plan_check.py --out "$RES/plan-check" ${PLAN_CHECK_MODELS:+--models $PLAN_CHECK_MODELS}
      cp "$RES/plan-check/plan-check.json" "$RES/" 2>/dev/null ;;
    glm5-twin)
      quick=(--quick); [ "${TWIN_FULL:-0}" = 1 ] && quick=()
      step glm5-twin 2400 "$PY" benchmarks/bench_twin.py "${quick[@]}" ${TWIN_CONFIGS:+--configs $TWIN_CONFIGS} \
        --workdir "$RES/twin-work" --out "$RES/glm5-twin-h200.json" ;;
    serving-parity)
      step serving-parity 1800 "$PY" benchmarks/bench_serving_parity.py --results-dir "$RES" \
        --workdir "$RES/parity-work" ${SERVING_PARITY_MODELS:+--models $SERVING_PARITY_MODELS} ;;
    same-tokens-probe)
      step same-tokens-probe 480 "$PY" lab/same_tokens_probe.py --out "$RES/same-tokens-probe" \
        --model "${SAME_TOKENS_MODEL:-glm4_moe-bf16}" ${SAME_TOKENS_VARIANTS:+--variants "$SAME_TOKENS_VARIANTS"} ;;
    same-tokens)
      quick=1; [ "${SAME_TOKENS_FULL:-0}" = 1 ] && quick=0
      SGLANG_SM120_GPU_QUICK=$quick SGLANG_SM120_RESULTS_DIR="$RES" step same-tokens 1200 "$PY" -m pytest -m gpu -q -rA \
        -p no:cacheprovider test/gpu/test_same_tokens.py ${SAME_TOKENS_K:+-k "$SAME_TOKENS_K"} ;;
    runner)
      step runner 2000 "$PY" benchmarks/bench_runner.py --tag h200 --timeout 480 --results-dir "$RES" \
        --workdir "$RES/runner-work"
      tar -czf "$RES/runner-logs.tgz" -C "$RES" runner-work 2>/dev/null ;;
    prefill-profile)
      step prefill-profile 600 "$PY" benchmarks/prefill_profile.py --tag h200 --timeout 280 \
        --results-dir "$RES" --workdir "$RES/prefill-profile-work" ;;
    prefill-fa2)
      step prefill-fa2-bench 500 "$PY" benchmarks/bench_runner.py --tag h200 --configs layerwise_fa2_prefill \
        --timeout 480 --results-dir "$RES" --workdir "$RES/runner-work"
      mkdir -p "$RES/fa2"
      SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=fa2 SGLANG_SM120_RESULTS_DIR="$RES/fa2" \
        step prefill-fa2-correctness 700 "$PY" -m pytest -m gpu -q -p no:cacheprovider \
        test/gpu/test_layerwise_correctness.py -k "qwen3_moe-bf16" ;;
    zero-copy)
      step zero-copy-bench 500 "$PY" benchmarks/bench_runner.py --tag h200 --configs layerwise_zero_copy \
        --timeout 480 --results-dir "$RES" --workdir "$RES/runner-work" ;;
    moe-profile)  # after runner: the Triton MoE kernels are compiled by then
      step moe-profile 300 "$PY" benchmarks/bench_runner.py --profile-eager-moe --timeout 280 \
        --results-dir "$RES" --workdir "$RES/moe-profile-work" ;;
    glm5-launch-line)
      SGLANG_SM120_RESULTS_DIR="$RES" step glm5-launch-line 1500 "$PY" -m pytest -m gpu -q -s -p no:cacheprovider \
        test/gpu/test_glm5_launch_line.py ;;
    sm120-check)
      step sm120-check 900 "$PY" -m sglang.sm120 check --quick --json "$RES/sm120-check-quick.json"
      # a fresh host's first run includes one-time JIT/Triton builds: over the 3-minute target,
      # run it again on the now warm caches (what a user's second run sees)
      if ! "$PY" -c 'import json, sys; sys.exit(not json.load(open(sys.argv[1]))["targets"]["quick_run_seconds"]["met"])' \
          "$RES/sm120-check-quick.json" 2>/dev/null; then
        step sm120-check-warm 900 "$PY" -m sglang.sm120 check --quick --json "$RES/sm120-check-quick-warm.json"
      fi ;;
    gpu-suite)
      SGLANG_SM120_GPU_MAX_TOKENS="${SGLANG_SM120_GPU_MAX_TOKENS:-2200000}" SGLANG_SM120_RESULTS_DIR="$RES/gpu-suite" \
        step gpu-suite 2400 "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider \
        --ignore test/gpu/test_layerwise_correctness.py ${GPU_SUITE_K:+-k "$GPU_SUITE_K"} test/gpu ;;
    fp4-selfcheck)
      step fp4-selfcheck 600 "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider test/gpu/test_fp4_selfcheck_gpu.py ;;
    traps)
      SGLANG_SM120_RESULTS_DIR="$RES" step traps 600 "$PY" -m pytest -m gpu -q -p no:cacheprovider \
        test/gpu/test_layerwise_traps.py -k "${TRAPS_K:-qwen3_moe}" ;;
    correctness)
      SGLANG_SM120_GPU_QUICK=1 SGLANG_SM120_RESULTS_DIR="$RES" step correctness 1500 "$PY" -m pytest -m gpu -q \
        -p no:cacheprovider test/gpu/test_layerwise_correctness.py \
        -k "${CORRECTNESS_K:-bf16}" ;;
    correctness-full)  # one pytest process per model, side by side on the one GPU, each KV pool capped
      mkdir -p "$RES/full-grid" "$RES/full-grid/zero-copy"
      runs=()
      for m in ${CORRECTNESS_FULL_MODELS:-qwen3_moe-bf16 qwen3_moe-nvfp4 deepseek_v2-bf16 deepseek_v2-nvfp4 \
                glm_moe_dsa-bf16 glm_moe_dsa-nvfp4 glm4_moe-bf16 glm4_moe-nvfp4}; do
        runs+=("$m|$m|full-grid|")
      done
      for m in ${CORRECTNESS_FULL_ZERO_COPY_MODELS-qwen3_moe-bf16}; do
        runs+=("$m-zero-copy|$m|full-grid/zero-copy|SGLANG_SM120_LAYERWISE_ZERO_COPY=1")
      done
      grids_side_by_side correctness-full full-grid 2400 "${runs[@]}" ;;
    correctness-moe-sm120)  # issue 42 item 5; the whole grid with CORRECTNESS_MOE_FULL=1
      runs=() grid_env=" SGLANG_SM120_GPU_QUICK=1"; [ "${CORRECTNESS_MOE_FULL:-0}" = 1 ] && grid_env=""
      for m in ${CORRECTNESS_MOE_MODELS:-qwen3_moe-nvfp4 deepseek_v2-nvfp4 glm_moe_dsa-nvfp4 glm4_moe-nvfp4}; do
        runs+=("$m|$m|moe-sm120|SGLANG_SM120_GPU_MOE_BACKEND=sm120$grid_env")
      done
      grids_side_by_side correctness-moe-sm120 moe-sm120 1800 "${runs[@]}" ;;
    correctness-alone)  # one process at a time: is a divergence the GPU's sharing, or the lean MoE?
      mkdir -p "$RES/alone" "$RES/alone-upstream-moe"
      for k in ${CORRECTNESS_ALONE_K:-deepseek_v2-bf16}; do
        SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny SGLANG_SM120_RESULTS_DIR="$RES/alone" \
          step "correctness-alone-$k" 900 "$PY" -m pytest -m gpu -q -p no:cacheprovider \
          --basetemp "/tmp/sm120-alone-$k" test/gpu/test_layerwise_correctness.py -k "$k"
        SGLANG_SM120_LEAN_MOE=0 SGLANG_SM120_TINY_DIR=/tmp/sm120-tiny SGLANG_SM120_RESULTS_DIR="$RES/alone-upstream-moe" \
          step "correctness-alone-$k-upstream-moe" 900 "$PY" -m pytest -m gpu -q -p no:cacheprovider \
          --basetemp "/tmp/sm120-alone-$k-upstream-moe" test/gpu/test_layerwise_correctness.py -k "$k"
      done ;;
    eager-warmup)
      step eager-warmup 450 "$PY" benchmarks/bench_runner.py --diagnose-eager-warmup --timeout 400 \
        --results-dir "$RES" --workdir "$RES/eager-warmup-work"
      ;;
    serving)
      step serving 1800 "$PY" benchmarks/bench_serving_matrix.py --tag h200-tw1 --results-dir "$RES" \
        --workdir "$RES/serving-work" --copy-to "$RES/serving-copy" ;;
    client-ceiling)
      step client-ceiling 180 "$PY" benchmarks/client_ceiling.py --out "$RES/client-ceiling.json" ;;
    serving-diag)
      step serving-diag 1800 "$PY" benchmarks/bench_serving_matrix.py --tag h200-diag --configs layerwise \
        --concurrency 1024 --client-procs 4 --then-soak 10 --results-dir "$RES" \
        --workdir "$RES/serving-work" --copy-to "$RES/serving-copy" ;;
    serving-soak)
      step serving-soak 2700 "$PY" benchmarks/bench_serving_matrix.py --tag h200-tw1 --then-soak 10 \
        --results-dir "$RES" --workdir "$RES/serving-work" --copy-to "$RES/serving-copy" ;;
    serving-tw4)
      step serving-tw4 2700 "$PY" benchmarks/bench_serving_matrix.py --tag h200 --then-soak 10 \
        --client-procs 4 --server-args "--tokenizer-worker-num 4" --results-dir "$RES" \
        --workdir "$RES/serving-work" --copy-to "$RES/serving-copy" ;;
    soak)
      step soak 1200 "$PY" benchmarks/soak.py --tag h200-alone --minutes 10 --results-dir "$RES" \
        --copy-to "$RES/soak-copy" ;;
  esac
done
say "done; failed steps: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]

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
# Steps (with none named, the list in STEPS=(...) below, most wanted first; each has its own cap in seconds):
#   lean-moe     test_lean_moe.py: the lean eager MoE vs upstream's on real Triton kernels, bit for
#                bit, and its host time per layer (decode and prefill rows)                      300
#   kernels      lab/kernels_check.sh without its quick benchmark: build csrc here, the
#                smoke test (compute-sanitizer on failure), test_kernels.py -> RESULTS/kernels-check/ 600
#   fp4          benchmarks/bench_fp4_gemm.py (ours plain/PDL vs bf16 vs Marlin, split sweep)   300
#   moe-fp4      (by name only) test_moe_w4a16.py (the grouped NVFP4 W4A16 MoE against moe_reference on the three MoE
#                shape sets, tokens 1-1024), then benchmarks/bench_moe_fp4.py (ours vs upstream's Marlin
#                NVFP4 MoE vs bf16 Triton fused MoE, tokens 1-1024; ours without PDL and at M tiles 2
#                and 4 beside it, and each backend's kernels at 1/64/1024 tokens) -> RESULTS/moe-fp4-h200.{json,md}
#                (logs RESULTS/moe-fp4-test.log, RESULTS/moe-fp4.log)                       600 + 900
#   moe-fp4-sweep (by name only) bench_moe_fp4.py on the GLM-5 sets with ours also at fixed warps per
#                weight tile (8/1 4/1 2/1 1/1 and the down side at 8, 4, 2): is the plan's choice the best
#                one? -> RESULTS/moe-sweep/ (a probe, not a record)                            900
#   runner       benchmarks/bench_runner.py, its five default configurations, saved after each  2000
#   prefill-profile benchmarks/prefill_profile.py: GPU kernel timeline of upstream breakable vs
#                layerwise prefill at 1024 / 4096 tokens (busy / idle, by kernel group)          600
#   prefill-fa2  layerwise prefill with its captured attention on upstream's FA2 plan (what SM120
#                runs; the default, auto, takes FA3 on SM90): bench_runner.py's
#                layerwise_fa2_prefill (merged into the runner step's file) and the qwen3_moe bf16
#                correctness full grid under SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=fa2
#                -> RESULTS/fa2/                                                                  1200
#   zero-copy    bench_runner.py's layerwise_zero_copy (lean MoE steps read the segments' tensors in
#                place, SGLANG_SM120_LAYERWISE_ZERO_COPY=1; its correctness: correctness-full)     500
#   moe-profile  bench_runner.py --profile-eager-moe: cProfile of the eager MoE steps (bs 64)     300
#   traps        test_layerwise_traps.py, -k $TRAPS_K (default: qwen3_moe, bf16 and nvfp4)      600
#   correctness  quick grid of test_layerwise_correctness.py, -k $CORRECTNESS_K (default: every
#                mode of the bf16 models, the ones the lean eager MoE (the default)
#                changes; a layerwise mode needs its `full` control in the same process)      1500
#   correctness-full  the issue's whole grid (bs {1,3,17,64,300,1024} x lengths {7,128,2000}, no
#                SGLANG_SM120_GPU_QUICK), every mode with the control, for each of
#                $CORRECTNESS_FULL_MODELS (default: the four tiny archs, bf16 and NVFP4) in its own pytest process,
#                all at once on the one GPU (KV pools capped by SGLANG_SM120_GPU_MAX_TOKENS; sized on
#                the H200's 141 GB, not tried on an 80 GB H100: name fewer models there), and
#                $CORRECTNESS_FULL_ZERO_COPY_MODELS (default qwen3_moe-bf16; set it empty for none) beside them under
#                SGLANG_SM120_LAYERWISE_ZERO_COPY=1 -> RESULTS/full-grid/[zero-copy/]     2400 each
#   correctness-moe-sm120  issue 42 item 5: the grid of $CORRECTNESS_MOE_MODELS (default: the four
#                NVFP4 tiny models) with every engine's experts on the fork's grouped kernel
#                (SGLANG_SM120_GPU_MOE_BACKEND=sm120), side by side as correctness-full; the quick
#                grid unless CORRECTNESS_MOE_FULL=1 -> RESULTS/moe-sm120/                           1800
#   correctness-alone  the whole grid of $CORRECTNESS_ALONE_K (default deepseek_v2-bf16) with
#                nothing else on the GPU (is a divergence timing-dependent?), then again with
#                upstream's MoE path (SGLANG_SM120_LEAN_MOE=0)
#                -> RESULTS/alone/, RESULTS/alone-upstream-moe/                                   900 each
#   eager-warmup bench_runner.py --diagnose-eager-warmup: where upstream's graphs-disabled
#                warmup spends its time on a tiny MoE (stacks every 15 s)                        450
#   glm5-launch-line  test_glm5_launch_line.py: the seed's launch line on tiny glm_moe_dsa NVFP4
#                (batches 1/64/999, traps logging with stacks) beside upstream's defaults        1500
#   sm120-check  python -m sglang.sm120 check --quick -> RESULTS/sm120-check-quick.{json,md}; over its
#                3-minute target, once more on the warm caches -> RESULTS/sm120-check-quick-warm.*  900 each
#   fp4-selfcheck  test_fp4_selfcheck_gpu.py: the sm120 backend's self-check and its fallback
#                with a fault injected                                                           600
#   gpu-suite    every GPU test but the layerwise correctness grid (the correctness-full step runs
#                it, side by side, as its own processes), -k $GPU_SUITE_K if set; the KV pools are
#                capped (SGLANG_SM120_GPU_MAX_TOKENS) so it can share the GPU with that step, but
#                the launch line's literal --mem-fraction-static 0.7 cannot: beside the grid, pass
#                GPU_SUITE_K="not launch_line" and run the glm5-launch-line step after it      2400
#   plan-check   benchmarks/plan_check.py: `sglang.sm120 plan --gpu auto` against what a server
#                with the same flags logs (sizes exact, graph memory within 25%), per model in
#                $PLAN_CHECK_MODELS (default: three tiny bf16 models and the Qwen3-30B-A3B shapes)
#                -> RESULTS/plan-check.json                                                        900
#   glm5-twin    (by name only) issue 41: benchmarks/bench_twin.py, the GLM-5 rank twin held to a
#                96 GB card, --quick (256-token contexts, one process per configuration) unless
#                TWIN_FULL=1; configurations $TWIN_CONFIGS (default: the bench's own list; issue 42's
#                pair: "layerwise_moe_sm120 layerwise_moe_marlin") -> RESULTS/glm5-twin-h200.{json,md}
#                (each process loads ~55 GB of dummy weights: minutes each)                       2400
#   same-tokens-probe  lab/same_tokens_probe.py on $SAME_TOKENS_MODEL (default glm4_moe-bf16): one
#                server per variant side by side, which source changes layerwise's greedy tokens
#                against graphs disabled -> RESULTS/same-tokens-probe/ (a probe)                    480
#   dynamo-free-bits  (by name only) test_dynamo_free_bits_gpu.py: moe_sum_reduce's and the sigmoid
#                router's Dynamo-free forms against torch.compile's on the GPU, bitwise; for a mismatch,
#                which candidate (summation order, division) gives the compiled bits; and whether a
#                bf16 linear layer's real rows keep their bits at a padded batch (test_padded_rows_bits_gpu.py)
#                -> RESULTS/dynamo-free-bits-gpu.json, padded-rows-bits-gpu.json (probes)           480
#   same-tokens  test_same_tokens.py (quick subset unless SAME_TOKENS_FULL=1): layerwise tokens
#                identical to graphs disabled, repeatability, a cold-JIT start under strict traps
#                (the cold pair JIT-compiles every module it needs: FlashInfer's prebuilt ones hidden)
#                -> RESULTS/same-tokens-h200.json (the record)                                     1200
#   serving-parity  (by name only) issue 43 item 7: benchmarks/bench_serving_parity.py, an upstream and a
#                layerwise server side by side per model in $SERVING_PARITY_MODELS (default: three tiny
#                bf16 models and the Qwen3-30B-A3B-shape NVFP4 model), concurrency 64 and 256 (inside
#                the full-graph ceiling), 5 rounds each in alternating order
#                -> RESULTS/serving-parity.{json,md}                                         1800
# Not in the default list (a serving session of their own, ~25 min, issue 6):
#   client-ceiling  benchmarks/client_ceiling.py: the bench_serving client alone against a synthetic
#                1024-stream decode loop (no GPU): is the client or the server the serving limit  180
#   serving      bench_serving_matrix.py, the three configurations on the NVFP4 Qwen3-30B-shaped
#                checkpoint (built on the host first, ~1 min)                                   1800
#   soak         soak.py, 10 minutes at concurrency 1024 with 2% malformed requests              1200
#   serving-diag the layerwise server alone at concurrency 1024 with 4 clients (is one client the limit?
#                compare with the cell's scheduler decode rate), then the soak on that server   1800
#   serving-soak both on fewer server starts: bench_serving_matrix.py --then-soak 10 soaks the
#                layerwise server after its cells (and a configuration whose flags resolve to
#                another's ServerArgs reports that server's cells instead of starting it again)  2700
#   serving-tw4  serving-soak with the streaming path widened the same way for every server:
#                4 tokenizer workers (upstream's --tokenizer-worker-num) and 4 bench_serving
#                clients, so the GPU side rather than one Python process sets the c1024 figure  2700
#                -> RESULTS/serving-h200.{json,md} and soak-h200.json, the serving records (serving
#                and serving-soak write tag h200-tw1, the soak step h200-alone)
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

#!/usr/bin/env bash
# W4A16 kernel libraries timed against each other, one process per run, runs in the order given,
# each run `lab/fp4_lab.py kernel-ab` (CUDA-graph replays over rotating weight copies, plain
# and PDL) on the same shapes; then per row the mean of each library's runs and their ratio to the
# first library, and the geomean of the ratios.
#   RUNS="base new new.2 base.2" bash lab/lib_ab.sh
# A run NAME[.N] uses .gpu/NAME/libsm120_kernels.so (.N repeats a library: ABBA orders cancel drift
# between processes). Env: SH (the --shapes list), MS (default 1,4,8,16), KERNELS (default auto: the
# plan's kernel; e.g. split), OUT (default lab/scratch/lib-ab, git-ignored). Use it for a change whose effect is
# smaller than the drift between processes (a fill size, a pipeline depth).
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/python
export OUT=${OUT:-$PWD/lab/scratch/lib-ab} KERNELS=${KERNELS:-auto}
mkdir -p "$OUT"
: "${RUNS:?set RUNS, e.g. RUNS=\"base new new.2 base.2\"}"
export RUNS
SH=${SH:-"glm5 q_b tp1,glm5 shared gate_up tp4,glm5 shared gate_up tp8,glm5 q_b tp4,qwen3-30b qkv tp1,qwen3-30b o_proj tp1,glm5 shared gate_up tp1,glm5 kv_b tp1"}
for run in $RUNS; do
  lib=${run%.*}
  SGLANG_SM120_KERNEL_LIB=$PWD/.gpu/$lib/libsm120_kernels.so timeout 200 python3 lab/fp4_lab.py kernel-ab \
    --out "$OUT/ab-$run.jsonl" --kernels "$KERNELS" --ms "${MS:-1,4,8,16}" --shapes "$SH" > "$OUT/ab-$run.txt" 2>&1 \
    || { echo "[lib_ab] run $run failed:"; tail -n 5 "$OUT/ab-$run.txt"; exit 1; }
done
python3 - <<'PY'
import collections, json, math, os
out, runs, kn = os.environ["OUT"], os.environ["RUNS"].split(), os.environ["KERNELS"].split(",")[0]
data = collections.defaultdict(dict)
for run in runs:
    for line in open(f"{out}/ab-{run}.jsonl"):
        r = json.loads(line)
        data[(r["shape"], r["M"])].setdefault(run.split(".")[0], []).append((r[kn + "_us"], r[kn + "_pdl_us"]))
libs = list(dict.fromkeys(r.split(".")[0] for r in runs))
base, geo = libs[0], collections.defaultdict(list)
mean = lambda v, i: sum(x[i] for x in v) / len(v)
for (shape, m), v in data.items():
    b = (mean(v[base], 0), mean(v[base], 1))
    line = f"{shape:26s} M={m:3d} {base} {b[0]:6.2f}/{b[1]:6.2f}"
    for lib in libs[1:]:
        t = (mean(v[lib], 0), mean(v[lib], 1))
        line += f" | {lib} {t[0]:6.2f}/{t[1]:6.2f} ({t[0] / b[0]:.3f}/{t[1] / b[1]:.3f})"
        geo[lib].append((math.log(t[0] / b[0]), math.log(t[1] / b[1])))
    print(line)
for lib, g in geo.items():
    print(f"geomean {lib}/{base}: plain {math.exp(sum(x for x, _ in g) / len(g)):.3f}, "
          f"PDL {math.exp(sum(y for _, y in g) / len(g)):.3f} ({len(g)} rows)")
PY

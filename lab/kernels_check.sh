#!/usr/bin/env bash
# One-call GPU check of the NVFP4 kernels that diagnoses itself (run from anywhere; ~1-6 min):
#
#   bash lab/kernels_check.sh
#
# 1. builds csrc/ for sm_90a,sm_120a (the build refuses SASS with the ptxas 13.0 LDGSTS bug);
# 2. runs lab/kernels_smoke.py (quantize, W4A16 M=1/16, W4A4 emulation M=256, each
#    synchronized and checked); if it fails, re-runs it under compute-sanitizer memcheck (names the
#    faulting kernel and SASS offset) and prints the SASS around every reported offset;
# 3. only if the smoke passes: pytest -m gpu test/gpu/test_kernels.py, then the quick benchmark.
# Logs (at most 8 files) go to $OUT (default lab/scratch/kernels-check, git-ignored); a summary is printed last.
# Time caps (seconds, env): BUILD_CAP 240, SMOKE_CAP 150, SANITIZER_CAP 240, PYTEST_CAP 160,
# BENCH_CAP 130 (the benchmark stops starting shapes after BENCH_BUDGET=80; 0 skips it).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/lab/scratch/kernels-check}"
mkdir -p "$OUT"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export PATH="$CUDA_HOME/bin:$PATH"
# python/ provides sglang.sm120 only where no sglang is installed; an installed fork (e.g.
# /tmp/site, built with SGLANG_SM120_KERNELS=0) wins. Either runs on the library this script
# builds: point the kernel API at it, or the run times a stale one.
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export SGLANG_SM120_KERNEL_LIB="$PWD/python/sglang/sm120/kernels/lib"
PY="${PYTHON:-python3}"
T0=$SECONDS
SUMMARY=()
note() { SUMMARY+=("$*"); echo "[kernels_check $((SECONDS - T0))s] $*"; }
finish() {
  {
    echo "== kernels_check summary ($((SECONDS - T0)) s, logs in $OUT)"
    printf '%s\n' "${SUMMARY[@]}"
  } | tee "$OUT/summary.txt"
  exit "$1"
}

# ---- 1. build
note "build: SGLANG_SM120_ARCHS=sm_90a,sm_120a, nvcc $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?')"
SGLANG_SM120_ARCHS=sm_90a,sm_120a timeout "${BUILD_CAP:-240}" \
  "$PY" -m forkbuild.kernels --out python/sglang/sm120/kernels/lib >"$OUT/build.log" 2>&1
rc=$?
{ echo; echo "### ptxas.log"; cat python/sglang/sm120/kernels/lib/ptxas.log 2>/dev/null; } >>"$OUT/build.log"
if [ $rc -ne 0 ]; then
  note "build: FAILED (rc $rc): $(grep -m1 '^error' "$OUT/build.log" || tail -n 1 "$OUT/build.log")"
  finish 1
fi
note "build: ok; $(grep -m1 'SASS check' "$OUT/build.log" | sed 's/^\[kernels\] //')"

# ---- 2. smoke (each launch synchronized: SGLANG_SM120_KERNEL_SYNC=1 is set by the script)
timeout "${SMOKE_CAP:-150}" "$PY" lab/kernels_smoke.py >"$OUT/smoke.log" 2>&1
rc=$?
while IFS= read -r line; do note "smoke: $line"; done < <(grep -E '^(PASS|FAIL|FAULT|smoke:)' "$OUT/smoke.log")
if [ $rc -ne 0 ]; then
  note "smoke: FAILED (rc $rc; 124 = timed out); re-running under compute-sanitizer memcheck"
  SAN="$(command -v compute-sanitizer || true)"
  for c in "$CUDA_HOME/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    [ -z "$SAN" ] && [ -x "$c" ] && SAN="$c"
  done
  if [ -z "$SAN" ]; then
    note "sanitizer: compute-sanitizer not found (PATH, \$CUDA_HOME/bin, /usr/local/cuda*/bin)"
    finish 1
  fi
  timeout "${SANITIZER_CAP:-240}" "$SAN" --tool memcheck --print-limit 20 --show-backtrace device \
    "$PY" lab/kernels_smoke.py >"$OUT/sanitizer.log" 2>&1
  note "sanitizer: rc $? ($SAN)"
  while IFS= read -r line; do note "sanitizer: $line"; done < <(
    grep -E '========= +(Invalid|Illegal|Misaligned|Out-of-range|Program hit|ERROR SUMMARY|at |Warp|Address)' \
      "$OUT/sanitizer.log" | head -n 16)
  # SASS around every reported offset ("+0x1a30" or "at 0x1a30"), for every sm_90a kernel
  "$PY" - "$OUT/sanitizer.log" python/sglang/sm120/kernels/lib/libsm120_kernels.so >>"$OUT/sanitizer.log" 2>&1 <<'EOF'
import re, subprocess, sys
from forkbuild.kernels import find_cuobjdump
log, lib = open(sys.argv[1], errors="replace").read(), sys.argv[2]
offs = sorted({int(o, 16) for o in re.findall(r"(?:\+0x|at 0x)([0-9a-f]+)", log)} - {0})[:4]
tool = find_cuobjdump()
print(f"\n### SASS around the reported offsets {[hex(o) for o in offs]} (cuobjdump: {tool})")
if offs and tool:
    sass = subprocess.run([tool, "-sass", "-arch", "sm_90a", lib], capture_output=True, text=True).stdout
    for func, body in re.findall(r"Function : (\S+)\n(.*?)(?=\n\s*Function : |\Z)", sass, re.S):
        lines = [ln for ln in body.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", ln)]
        for o in offs:
            idx = [i for i, ln in enumerate(lines) if int(re.match(r"\s+/\*([0-9a-f]+)\*/", ln).group(1), 16) == o]
            for i in idx:
                print(f"--- {func} @ {hex(o)}")
                print("\n".join(l.split(";")[0] + ";" for l in lines[max(0, i - 6): i + 3]))
EOF
  finish 1
fi

# ---- 3. the GPU test suite, then the benchmark
SGLANG_SM120_KERNEL_SYNC=1 timeout "${PYTEST_CAP:-160}" "$PY" -m pytest -q -p no:cacheprovider -m gpu \
  --durations=5 test/gpu/test_kernels.py >"$OUT/pytest.log" 2>&1
rc=$?
note "pytest: rc $rc (124 = timed out): $(grep -E '(passed|failed|error)' "$OUT/pytest.log" | tail -n 1)"
while IFS= read -r line; do note "pytest: $line"; done < <(grep -E '^(FAILED|ERROR) ' "$OUT/pytest.log" | head -n 12)
PYTEST_RC=$rc

if [ "${BENCH_CAP:-130}" = 0 ]; then  # the caller runs the full benchmark itself
  note "bench: skipped (BENCH_CAP=0)"
  finish $PYTEST_RC
fi
env -u OUT timeout "${BENCH_CAP:-130}" "$PY" benchmarks/bench_fp4_gemm.py --quick \
  --max-seconds "${BENCH_BUDGET:-80}" --results-dir "$OUT" >"$OUT/bench.log" 2>&1
rc=$?
note "bench: rc $rc (124 = timed out); $(grep -m1 '^TARGETS' "$OUT/bench.log" || tail -n 1 "$OUT/bench.log")"
while IFS= read -r line; do note "bench: $line"; done < <(sed -n '/^SUMMARY/,/^TARGETS/p' "$OUT/bench.log" | grep -v '^TARGETS' | head -n 24)
[ $PYTEST_RC -eq 0 ] && [ $rc -eq 0 ] && finish 0
finish 1

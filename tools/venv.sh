# Sourced by the two README commands: build the fork wheel and install it into a venv.
# Env: PYTHON (interpreter for the venv, default python3), SGLANG_SM120_CACHE (upstream cache),
# SGLANG_SM120_BASE (upstream release to build on; default: UPSTREAM.toml's default base, which
# installs into .venv; any other base gets its own .venv-<base>, since each base pins its own torch).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export SGLANG_SM120_CACHE="${SGLANG_SM120_CACHE:-$PWD/.cache/sglang-sm120}"
source tools/heartbeat.sh
# Every build variable (the base among them) and SGLANG_SM120_DEPS checked before anything is
# created: a bad value is one `error:` line naming the variable and what it accepts.
"${PYTHON:-python3}" -m forkbuild.settings --also SGLANG_SM120_DEPS || exit 2
DEFAULT_BASE=$("${PYTHON:-python3}" -c 'import tomllib; print(tomllib.load(open("UPSTREAM.toml", "rb"))["upstream"]["default"])')
export SGLANG_SM120_BASE="${SGLANG_SM120_BASE:-$DEFAULT_BASE}"
if [ "$SGLANG_SM120_BASE" = "$DEFAULT_BASE" ]; then VENV=.venv; else VENV=".venv-$SGLANG_SM120_BASE"; fi
echo "[setup] base sglang $SGLANG_SM120_BASE -> $VENV"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
[ -d "$CUDA_HOME/bin" ] && export PATH="$CUDA_HOME/bin:$PATH"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV"
fi
VPY="$PWD/$VENV/bin/python"
# pip unpacks GBs of wheels into TMPDIR; keep that on the checkout's disk (CI's /tmp may be small).
mkdir -p .cache/tmp
vpip() { TMPDIR="$PWD/.cache/tmp" "$VPY" -m pip "$@"; }
# cuobjdump (+ the nvdisasm it runs) lets the kernel build check its own SASS (forkbuild/kernels.py);
# the toolkit here lacks both.
# It goes on PATH because pip's isolated build environment does not see .venv's packages.
if command -v nvcc >/dev/null; then
  vpip install -q nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
  CUOBJDUMP=$("$VPY" -c 'import glob, sysconfig; print(next(iter(glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/*/bin/cuobjdump")), ""))')
  [ -n "$CUOBJDUMP" ] && export PATH="$(dirname "$CUOBJDUMP"):$PATH"
fi
echo "[setup] building the fork wheel (pip wheel . --no-deps)"
DIST="dist/$SGLANG_SM120_BASE"
rm -rf "$DIST"
# pip hides a backend's output unless verbose; keep just the build's own progress lines.
build_wheel() { vpip wheel . --no-deps -w "$DIST" -v > ".cache/pip-wheel-$SGLANG_SM120_BASE.log" 2>&1; }
with_heartbeat 30 - "building the wheel" -- build_wheel || {
  grep -E "^ *(\[sglang-sm120\]|\[kernels\]|error)" ".cache/pip-wheel-$SGLANG_SM120_BASE.log"; tail -20 ".cache/pip-wheel-$SGLANG_SM120_BASE.log"
  echo "[setup] building the wheel failed (full log: .cache/pip-wheel-$SGLANG_SM120_BASE.log)"; exit 1; }
grep -E "^ *(\[sglang-sm120\]|\[kernels\])" ".cache/pip-wheel-$SGLANG_SM120_BASE.log" || true
WHEEL=$(ls "$DIST"/sglang-*.whl)
# SGLANG_SM120_DEPS: full (the wheel and everything it requires: what users get) or cpu-test
# (the same minus GPU kernel packages, for the CPU suite on a GPU-less box: 2 GB less disk;
# tools/cpu_test_requirements.py says which and why). run_tests.sh picks cpu-test without a GPU.
DEPS="${SGLANG_SM120_DEPS:-full}"
FREE_MB=$(df -Pm . | awk 'NR==2 {print $4}')
echo "[setup] installing $WHEEL with its $DEPS dependencies (first run downloads torch: a few minutes; ${FREE_MB} MB free here, a fresh $VENV takes ~10 GB at peak)"
# pip -q is silent for minutes here (torch and friends: GBs): a line every 30 s shows it moving.
case "$DEPS" in
  full) with_heartbeat 30 "$VENV" "installing dependencies" -- vpip install -q "$WHEEL" ;;
  cpu-test)
    "$VPY" -m tools.cpu_test_requirements "$WHEEL" > ".cache/cpu-test-requirements-$SGLANG_SM120_BASE.txt"
    with_heartbeat 30 "$VENV" "installing dependencies" -- \
      vpip install -q -r ".cache/cpu-test-requirements-$SGLANG_SM120_BASE.txt" ;;
esac
vpip install -q --no-deps --force-reinstall "$WHEEL"
export SGLANG_SM120_WHEEL="$PWD/$WHEEL"

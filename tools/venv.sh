# Sourced by the two README commands: build the fork wheel and install it into .venv.
# Env: PYTHON (interpreter for the venv, default python3), SGLANG_SM120_CACHE (upstream cache).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export SGLANG_SM120_CACHE="${SGLANG_SM120_CACHE:-$PWD/.cache/sglang-sm120}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
[ -d "$CUDA_HOME/bin" ] && export PATH="$CUDA_HOME/bin:$PATH"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "${PYTHON:-python3}" -m venv .venv
fi
VPY="$PWD/.venv/bin/python"
# cuobjdump (+ the nvdisasm it runs) lets the kernel build check its own SASS (forkbuild/kernels.py);
# the toolkit here lacks both.
# It goes on PATH because pip's isolated build environment does not see .venv's packages.
if command -v nvcc >/dev/null; then
  "$VPY" -m pip install -q nvidia-cuda-cuobjdump==13.5.37 nvidia-cuda-nvdisasm==13.5.37
  CUOBJDUMP=$("$VPY" -c 'import glob, sysconfig; print(next(iter(glob.glob(sysconfig.get_paths()["purelib"] + "/nvidia/*/bin/cuobjdump")), ""))')
  [ -n "$CUOBJDUMP" ] && export PATH="$(dirname "$CUOBJDUMP"):$PATH"
fi
echo "[setup] building the fork wheel (pip wheel . --no-deps)"
rm -rf dist
mkdir -p .cache
# pip hides a backend's output unless verbose; keep just the build's own progress lines.
"$VPY" -m pip wheel . --no-deps -w dist -v > .cache/pip-wheel.log 2>&1 || {
  grep -E "^ *(\[sglang-sm120\]|\[kernels\]|error)" .cache/pip-wheel.log; tail -20 .cache/pip-wheel.log
  echo "[setup] building the wheel failed (full log: .cache/pip-wheel.log)"; exit 1; }
grep -E "^ *(\[sglang-sm120\]|\[kernels\])" .cache/pip-wheel.log || true
WHEEL=$(ls dist/sglang-*.whl)
echo "[setup] installing $WHEEL and its dependencies (first run downloads torch: a few minutes)"
"$VPY" -m pip install -q "$WHEEL"
"$VPY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
export SGLANG_SM120_WHEEL="$PWD/$WHEEL"

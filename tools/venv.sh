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
echo "[setup] building the fork wheel (pip wheel . --no-deps)"
rm -rf dist
"$VPY" -m pip wheel . --no-deps -w dist
WHEEL=$(ls dist/sglang-*.whl)
echo "[setup] installing $WHEEL and its dependencies (first run downloads torch: a few minutes)"
"$VPY" -m pip install -q "$WHEEL"
"$VPY" -m pip install -q --no-deps --force-reinstall "$WHEEL"
export SGLANG_SM120_WHEEL="$PWD/$WHEEL"

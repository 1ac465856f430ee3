#!/usr/bin/env bash
# The project's test command: for each upstream base, build + install the fork into that base's
# venv (tools/venv.sh), then run the whole suite there. Bases: SGLANG_SM120_TEST_BASES
# ("0.5.16 0.5.23"), else SGLANG_SM120_BASE alone if set, else every base in UPSTREAM.toml.
# GPU tests skip cleanly without a GPU; nvcc tests run where nvcc exists. Extra args go to pytest.
# Without a GPU the suite needs no GPU kernel packages (tools/cpu_test_requirements.py).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SGLANG_SM120_DEPS:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then export SGLANG_SM120_DEPS=full; else export SGLANG_SM120_DEPS=cpu-test; fi
fi
ALL_BASES=$("${PYTHON:-python3}" -c 'import tomllib; print(" ".join(tomllib.load(open("UPSTREAM.toml", "rb"))["base"]))')
BASES="${SGLANG_SM120_TEST_BASES:-${SGLANG_SM120_BASE:-$ALL_BASES}}"
failed=()
for base in $BASES; do
  start=$SECONDS
  echo "[tests] === base sglang $base ==="
  (
    export SGLANG_SM120_BASE="$base"
    source tools/venv.sh
    vpip install -q pytest==9.2.0 matplotlib==3.11.2  # matplotlib: the serving benchmark's --plot-only test
    export SGLANG_SM120_REQUIRE_INSTALLED=1
    "$VPY" -m pytest test "$@"
  )
  rc=$?
  echo "[tests] base $base: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failed+=("$base")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "[tests] FAILED on base(s): ${failed[*]}"
  exit 1
fi
echo "[tests] passed on base(s): $BASES"

#!/usr/bin/env bash
# The project's test command: for each upstream base, build + install the fork into that base's
# venv (tools/venv.sh), then run the suite there. Bases: SGLANG_SM120_TEST_BASES ("0.5.16 0.5.23"),
# else SGLANG_SM120_BASE alone if set, else every base in UPSTREAM.toml.
# The bases' venvs are set up at the same time (mostly downloads and unpacking), then the suites
# run one after the other: the first base runs every test, the others skip the test modules
# marked base_independent (they do not touch upstream sglang; test_base_independent.py checks it).
# GPU tests skip cleanly without a GPU; nvcc tests run where nvcc exists. Extra args go to pytest.
# Without a GPU the suite needs no GPU kernel packages (tools/cpu_test_requirements.py).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SGLANG_SM120_DEPS:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then export SGLANG_SM120_DEPS=full; else export SGLANG_SM120_DEPS=cpu-test; fi
fi
ALL_BASES=$("${PYTHON:-python3}" -c 'import tomllib; print(" ".join(tomllib.load(open("UPSTREAM.toml", "rb"))["base"]))')
BASES="${SGLANG_SM120_TEST_BASES:-${SGLANG_SM120_BASE:-$ALL_BASES}}"
# Each base and every build variable checked before any venv is created (one `error:` line).
"${PYTHON:-python3}" -m forkbuild.settings --also SGLANG_SM120_DEPS $(printf -- '--base %s ' $BASES) || exit 2
mkdir -p .cache
t0=$SECONDS

setup() {  # one base's venv; leaves the test environment in .cache/test-env-<base>.sh
  export SGLANG_SM120_BASE="$1"
  source tools/venv.sh
  vpip install -q pytest==9.2.0 matplotlib==3.11.2  # matplotlib: the serving benchmark's --plot-only test
  printf 'export %s=%q\n' VPY "$VPY" SGLANG_SM120_BASE "$SGLANG_SM120_BASE" SGLANG_SM120_WHEEL "$SGLANG_SM120_WHEEL" \
    SGLANG_SM120_CACHE "$SGLANG_SM120_CACHE" PATH "$PATH" CUDA_HOME "$CUDA_HOME" > ".cache/test-env-$1.sh"
}

# both setups print as they go, each line prefixed with its base
for base in $BASES; do
  rm -f ".cache/test-env-$base.sh" ".cache/setup-$base.rc"
  { ( setup "$base" ); echo $? > ".cache/setup-$base.rc"; } 2>&1 \
    | grep --line-buffered -v "WARNING: Location" | sed -u "s/^/[setup $base] /" &
done
wait
failed=()
for base in $BASES; do
  rc=$(cat ".cache/setup-$base.rc" 2>/dev/null || echo 1)
  if [ "$rc" -ne 0 ]; then echo "[tests] base $base: setup failed (exit $rc)"; failed+=("$base"); fi
done
echo "[tests] setup done after $((SECONDS - t0)) s"

first=1
for base in $BASES; do
  [ -f ".cache/test-env-$base.sh" ] || continue
  start=$SECONDS
  select=()
  [ "$first" -eq 1 ] || select=(-m "not base_independent")
  echo "[tests] === base sglang $base: pytest test ${select[*]} ==="
  (
    source ".cache/test-env-$base.sh"
    export SGLANG_SM120_REQUIRE_INSTALLED=1
    "$VPY" -m pytest test "${select[@]}" "$@"
  )
  rc=$?
  first=0
  echo "[tests] base $base: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failed+=("$base")
done
echo "[tests] total $((SECONDS - t0)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "[tests] FAILED on base(s): ${failed[*]}"
  exit 1
fi
echo "[tests] passed on base(s): $BASES"

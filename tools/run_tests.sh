#!/usr/bin/env bash
# The project's test command: build + install the fork into .venv, then run the whole suite.
# GPU tests skip cleanly without a GPU; nvcc tests run where nvcc exists. Extra args go to pytest.
# Without a GPU the suite needs no GPU kernel packages (tools/cpu_test_requirements.py).
if [ -z "${SGLANG_SM120_DEPS:-}" ]; then
  if nvidia-smi -L >/dev/null 2>&1; then export SGLANG_SM120_DEPS=full; else export SGLANG_SM120_DEPS=cpu-test; fi
fi
source "$(dirname "$0")/venv.sh"
vpip install -q pytest==9.2.0 matplotlib==3.11.2  # matplotlib: the serving benchmark's --plot-only test
export SGLANG_SM120_REQUIRE_INSTALLED=1
exec "$VPY" -m pytest test "$@"

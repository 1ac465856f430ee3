#!/usr/bin/env bash
# The project's test command: build + install the fork into .venv, then run the whole suite.
# GPU tests skip cleanly without a GPU; nvcc tests run where nvcc exists. Extra args go to pytest.
source "$(dirname "$0")/venv.sh"
"$VPY" -m pip install -q pytest==9.2.0 matplotlib==3.11.2  # matplotlib: the serving benchmark's --plot-only test
export SGLANG_SM120_REQUIRE_INSTALLED=1
exec "$VPY" -m pytest test "$@"

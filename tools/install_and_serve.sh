#!/usr/bin/env bash
# The main job: build the fork wheel (SGLANG_SM120_BASE picks the upstream base), install it into
# its venv (tools/venv.sh), and where a CUDA GPU is present serve
# the built-in tiny demo model with the fork's layerwise runner (--enable-piecewise-cuda-graph):
# prints the time to ready and one greedy answer, then keeps serving (--once stops after the answer).
# Without a GPU it prints what was built and how to serve a real model. Extra args go to the demo.
source "$(dirname "$0")/venv.sh"
"$VPY" -m sglang.sm120 info
if "$VPY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  exec "$VPY" -m sglang.sm120.demo "$@"
fi
echo "[serve] no CUDA GPU here: the fork is built and installed in $VENV; on a GPU host this command serves the tiny demo model."
"$VPY" -m sglang.sm120.demo --how-to-serve

#!/usr/bin/env bash
# The main job: build the fork wheel, install it into .venv, and serve the built-in tiny demo
# model where a CUDA GPU is present (otherwise print what was built). Extra args go to the server.
source "$(dirname "$0")/venv.sh"
"$VPY" -m sglang.sm120 info
if "$VPY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  exec "$VPY" -m sglang.sm120.demo "$@"
fi
echo "[serve] no CUDA GPU here: the fork is built and installed in .venv; run this again on a GPU host to serve the tiny demo model"

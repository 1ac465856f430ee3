"""python -m sglang.sm120.demo [--arch ...] [--quant ...] [--port 30000] [--once] [extra server args]

Serve a tiny random-weight MoE model with the fork's layerwise CUDA-graph runner in one command:
build the model into ~/.cache/sglang-sm120/tiny/<arch>-<quant>-<seed> unless it is already there,
start `python -m sglang.launch_server` on it with `--enable-piecewise-cuda-graph`, wait until it
answers, print the time to ready and one greedy answer, then keep serving (or stop, with --once).
Arguments this launcher does not know are passed to the server after its defaults, so they win
(e.g. `--attention-backend flashinfer`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import urllib.error
from typing import List, Optional

from sglang.sm120.launcher import Server, ServerError, request_json

# Triton attention and PyTorch sampling need no FlashInfer JIT, so a fresh host starts without
# nvcc builds; the layerwise runner captures decode and prefill segments for them all the same.
DEMO_SERVER_ARGS: List[str] = [
    "--enable-piecewise-cuda-graph",
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "131072",
    "--watchdog-timeout", "1200",
]

DEMO_PROMPT = "The capital city of France is"
READY_TIMEOUT_S = 900  # first start on a fresh host pays Triton/Marlin compiles and graph capture

REAL_MODEL_HINT = (
    "To serve a real model, e.g. GLM-5-NVFP4 on 8 SM120 GPUs: python -m sglang.launch_server "
    "--model-path <GLM-5-NVFP4 checkpoint> --tp 8 --enable-piecewise-cuda-graph "
    "(README.md, 'Quick start').")


def default_cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sglang-sm120", "tiny")


def parse_args(argv: Optional[List[str]] = None):
    from sglang.sm120.tiny.spec import ARCHS, QUANTS

    ap = argparse.ArgumentParser(
        prog="python -m sglang.sm120.demo",
        description="Build (once) and serve a tiny random-weight MoE model with sglang. "
                    "Unknown arguments go to sglang.launch_server.")
    ap.add_argument("--arch", default="qwen3_moe", choices=ARCHS)
    ap.add_argument("--quant", default="nvfp4", choices=QUANTS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--cache-dir", default=default_cache_root(),
                    help="where tiny models are kept (default %(default)s)")
    ap.add_argument("--dry-run", action="store_true",
                    help="build the model and print the server command instead of running it")
    ap.add_argument("--once", action="store_true",
                    help="stop the server after the first answer (exit 0 when it was right)")
    ap.add_argument("--ready-timeout", type=float, default=READY_TIMEOUT_S,
                    help="seconds to wait for the server to answer (default %(default)s)")
    ap.add_argument("--how-to-serve", action="store_true",
                    help="print how to serve a real model and exit")
    return ap.parse_known_args(argv)


def _cached_model_ok(path: str, spec) -> bool:
    from sglang.sm120.tiny.build import FORMAT_VERSION, REFERENCE_FILE

    try:
        with open(os.path.join(path, REFERENCE_FILE)) as f:
            ref = json.load(f)
    except (OSError, ValueError):
        return False
    return ref.get("format_version") == FORMAT_VERSION and ref.get("spec") == spec.to_dict()


def ensure_model(cache_dir: str, arch: str, quant: str, seed: int) -> str:
    from sglang.sm120.tiny.build import build
    from sglang.sm120.tiny.spec import default_spec

    spec = default_spec(arch, quant, seed)
    path = os.path.join(cache_dir, spec.name)
    if _cached_model_ok(path, spec):
        print(f"[demo] using cached model {path}", file=sys.stderr)
    else:
        build(path, spec, force=True)
    return path


def make_server(model_dir: str, a, extra: List[str]) -> Server:
    """The demo's server: its defaults, then the passed-through flags (later flags win), writing
    to this terminal."""
    return Server(name=f"tiny-{a.arch}-{a.quant}", model_dir=model_dir, log_path=None,
                  args=DEMO_SERVER_ARGS + list(extra), port=a.port, host=a.host)


def _has_cuda_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def greedy_answer(url: str, prompt: str = DEMO_PROMPT, max_new_tokens: int = 16) -> str:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    return request_json(url + "/generate", body, timeout=300)["text"]


def serve(srv: Server, once: bool, ready_timeout: float) -> int:
    srv.start()
    try:
        try:
            ready_s = srv.wait_ready(ready_timeout)
            print(f"[demo] ready in {ready_s:.1f} s at {srv.url}", file=sys.stderr, flush=True)
            text = greedy_answer(srv.url)
        except (ServerError, urllib.error.URLError, OSError, KeyError, ValueError) as e:
            print(f"[demo] error: {e}", file=sys.stderr)
            return 1
        print(f"[demo] greedy answer to {DEMO_PROMPT!r}: {text!r}", file=sys.stderr)
        print(f"[demo] {REAL_MODEL_HINT}", file=sys.stderr, flush=True)
        if once:
            return 0
        print("[demo] serving; Ctrl-C stops the server", file=sys.stderr, flush=True)
        return srv.proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        srv.stop()


def main(argv: Optional[List[str]] = None) -> int:
    a, extra = parse_args(argv)
    if a.how_to_serve:
        print(REAL_MODEL_HINT)
        return 0
    if a.port <= 0 or a.port > 65535:
        print(f"error: --port must be in 1..65535, got {a.port}", file=sys.stderr)
        return 2
    if not a.dry_run and not _has_cuda_gpu():
        print("sglang.sm120.demo: no CUDA GPU visible (torch.cuda.is_available() is False); "
              "sglang needs one to serve. Use --dry-run to only build the model.", file=sys.stderr)
        return 1
    try:
        model_dir = ensure_model(a.cache_dir, a.arch, a.quant, a.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    srv = make_server(model_dir, a, extra)
    print(f"[demo] {shlex.join(srv.command())}", file=sys.stderr, flush=True)
    if a.dry_run:
        return 0
    return serve(srv, a.once, a.ready_timeout)


if __name__ == "__main__":
    sys.exit(main())

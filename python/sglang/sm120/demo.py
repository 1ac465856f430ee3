"""python -m sglang.sm120.demo [--arch ...] [--quant ...] [--port 30000] [extra server args]

Serve a tiny random-weight MoE model with sglang in one command: builds the model into
~/.cache/sglang-sm120/tiny/<arch>-<quant>-<seed> unless it is already there, then replaces this
process with `python -m sglang.launch_server` using flags that start fast on a fresh host.
Arguments this launcher does not know are passed to the server after its defaults, so they win
(e.g. `--attention-backend flashinfer`).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import List, Optional

# Fast start on a fresh host: no FlashInfer JIT for attention or sampling, no CUDA graph
# capture, a small KV pool; the first request still pays one-time kernel compiles.
DEMO_SERVER_ARGS: List[str] = [
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    "--mem-fraction-static", "0.3",
    "--max-total-tokens", "131072",
    "--watchdog-timeout", "1200",
]


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


def server_command(model_dir: str, a, extra: List[str]) -> List[str]:
    return ([sys.executable, "-m", "sglang.launch_server", "--model-path", model_dir,
             "--host", a.host, "--port", str(a.port),
             "--served-model-name", f"tiny-{a.arch}-{a.quant}"]
            + DEMO_SERVER_ARGS + list(extra))


def _has_cuda_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def main(argv: Optional[List[str]] = None) -> int:
    a, extra = parse_args(argv)
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
    cmd = server_command(model_dir, a, extra)
    url = f"http://{a.host}:{a.port}"
    print(f"[demo] {shlex.join(cmd)}", file=sys.stderr)
    print(f"[demo] when ready: curl {url}/generate -H 'Content-Type: application/json' "
          f"-d '{{\"text\": \"The capital city of France is\", "
          f"\"sampling_params\": {{\"max_new_tokens\": 16, \"temperature\": 0}}}}'",
          file=sys.stderr, flush=True)
    if a.dry_run:
        return 0
    os.execv(sys.executable, cmd)
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

"""The served model and the servers of the serving benchmark and the soak.

Model: a random-weight ModelOpt NVFP4 checkpoint with Qwen3-30B-A3B's shapes, made on the GPU by
`python -m sglang.sm120.tiny.fullsize` (about 17.5 GB; reused when the directory already holds it).
Servers: `python -m sglang.launch_server` through sglang.sm120.launcher (own process group,
/health wait, SIGTERM then kill of the group).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from _results import REPO

from sglang.sm120 import launcher

DEFAULT_MODEL_DIR = "/tmp/sglang-sm120-fullsize/qwen3-30b-a3b-nvfp4"
# Server flags per configuration, on top of common_flags().
CONFIGS: Dict[str, List[str]] = {
    "upstream_default": [],
    # the decode-graph ceiling upstream ships for 96 GB SM120 cards (PR 29580)
    "upstream_bs256": ["--cuda-graph-max-bs", "256"],
    # the fork's runner in both phases (--enable-piecewise-cuda-graph selects the same)
    "layerwise": ["--cuda-graph-backend-decode", "layerwise", "--cuda-graph-backend-prefill", "layerwise"],
}
# ServerArgs fields that only feed the resolved cuda_graph_config: nothing under sglang/srt reads
# them once server_args.py has folded them in (a CPU test checks that on the installed upstream).
# Two configurations that differ only there launch the same server.
INPUT_ONLY_FIELDS = ("cuda_graph_max_bs_decode",)
# Run in a child process with the server's environment, so the GPU (memory, compute capability)
# decides the defaults exactly as it does for launch_server.
_RESOLVE = """
import dataclasses, json, sys
from sglang.srt.server_args import prepare_server_args
args = prepare_server_args(sys.argv[1:])
print("RESOLVED " + json.dumps(dataclasses.asdict(args), default=repr, sort_keys=True))
"""
# /server_info keys worth keeping with each result (resolved graph config, pool size, limits).
SERVER_FACTS = ("version", "cuda_graph_config", "cuda_graph_max_bs_decode", "max_running_requests",
                "chunked_prefill_size", "mem_fraction_static", "max_total_num_tokens",
                "max_req_input_len", "context_length", "attention_backend", "disable_radix_cache")


def common_flags(mem_fraction: float, max_running: int = 1024) -> List[str]:
    return ["--attention-backend", "flashinfer", "--max-running-requests", str(max_running),
            "--mem-fraction-static", str(mem_fraction), "--watchdog-timeout", "1200",
            "--random-seed", "0"]


def kv_bytes_per_token(model_dir: str) -> int:
    """bf16 K and V of every layer (what the pool stores per token)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    return 2 * 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"]


def offline_env() -> None:
    """Nothing outside the host is reachable; the Marlin JIT cache travels as .jitcache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    jit = REPO / ".jitcache"
    if jit.is_dir():
        os.environ.setdefault("TVM_FFI_CACHE_DIR", str(jit))


def prepare_model(model_dir: str, layers: Optional[int], log=print) -> dict:
    """Build the full-size NVFP4 checkpoint on the GPU unless model_dir already holds it."""
    cmd = [sys.executable, "-m", "sglang.sm120.tiny.fullsize", "--preset", "qwen3-30b-a3b",
           "--device", "cuda", "--out", model_dir, "--reuse"]
    if layers:
        cmd += ["--layers", str(layers)]
    log(f"[model] {' '.join(cmd)}")
    t0 = time.time()
    rc = subprocess.run(cmd).returncode
    if rc != 0:
        raise SystemExit(f"[model] building the checkpoint failed (exit {rc}): {' '.join(cmd)}")
    info = json.loads((Path(model_dir) / "fullsize_model.json").read_text())
    return {"dir": model_dir, "prepare_s": round(time.time() - t0, 1), "bytes": info["bytes"],
            "spec": info["spec"], "tokenizer_vocab": info["tokenizer_vocab"], "built_on": info["device"]}


def start_server(name: str, model_dir: str, flags: List[str], log_dir: Path,
                 startup_timeout: float, log=print) -> launcher.Server:
    log_dir.mkdir(parents=True, exist_ok=True)
    srv = launcher.Server(name=name, model_dir=model_dir, log_path=str(log_dir / f"{name}.server.log"),
                          args=list(flags))
    log(f"[server] {name}: {' '.join(srv.command())}")
    srv.start()
    try:
        secs = srv.wait_ready(startup_timeout, progress=log)
    except launcher.ServerError:
        srv.stop()
        raise
    log(f"[server] {name}: ready in {secs:.0f}s at {srv.url}")
    return srv


def resolve_server_args(model_dir: str, flags: List[str], timeout: float = 300) -> dict:
    """ServerArgs as launch_server would resolve them (defaults filled in for this GPU), minus
    INPUT_ONLY_FIELDS. Raises RuntimeError when they cannot be resolved."""
    cmd = [sys.executable, "-c", _RESOLVE, "--model-path", model_dir, *flags]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"resolving server args took over {timeout:.0f}s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESOLVED ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"resolving server args failed (exit {proc.returncode}): {proc.stderr[-400:]}")
    resolved = json.loads(lines[-1][len("RESOLVED "):])
    return {k: v for k, v in resolved.items() if k not in INPUT_ONLY_FIELDS}


def fingerprint(resolved: dict) -> str:
    return hashlib.sha256(json.dumps(resolved, sort_keys=True).encode()).hexdigest()


def server_facts(url: str) -> dict:
    try:
        info = launcher.request_json(url + "/server_info", timeout=30)
    except Exception as e:  # noqa: BLE001 -- facts are optional decoration
        return {"error": f"/server_info: {e}"}
    return {k: info[k] for k in SERVER_FACTS if k in info}

"""Harness: run `python -m sglang.launch_server` as a subprocess for the GPU serving tests.

Each server gets a free port, its own process group (so teardown can stop every process it
spawned; it stays in the test run's session and gets SIGTERM if the test process dies) and a
log file. `wait_ready` polls /health and fails with the log tail; `stop` sends
SIGTERM to the server's main process, kills the whole group after a timeout, and reports whether
the shutdown was clean (every process exited on that SIGTERM alone and the port is free again).
"""
from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, List, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tinymodels  # noqa: E402 (the DSA model's flags, shared with the engine tests)

# Server flags for the tests, chosen to start fast on a fresh H200 host (sglang 0.5.16 names).
# Replace the whole list with SGLANG_SM120_TEST_SERVER_ARGS="..." (shell syntax).
DEFAULT_SERVER_ARGS: List[str] = [
    # Triton attention: FlashInfer attention JIT-compiles with nvcc at first use (minutes) and the
    # host's sgl_kernel has no FA3. Triton's MLA kernels special-case the MLA head sizes used here.
    "--attention-backend", "triton",
    # PyTorch sampling: no FlashInfer sampling JIT.
    "--sampling-backend", "pytorch",
    # No CUDA graphs: upstream's capture of MoE models takes minutes, longer than this test server should wait.
    "--cuda-graph-backend-decode", "disabled",
    "--cuda-graph-backend-prefill", "disabled",
    # Every request computed from scratch: repeated greedy requests and teacher-forced logprobs
    # are exactly comparable (a radix-cache hit would change the prefill shapes).
    "--disable-radix-cache",
    # A batched /generate reaches the scheduler as one message, so a repeated batch is prefilled
    # and decoded in the same batch shapes (sent request by request, two identical batches of
    # three prompts were prefilled as 1+2, then as 2+1): the repeat test then compares like with
    # like on stacks that are not batch-invariant.
    "--enable-tokenizer-batch-encode",
    # Small static memory and KV pool: several servers share one GPU during the session.
    "--mem-fraction-static", "0.15",
    "--max-total-tokens", "65536",
    "--max-running-requests", "32",
    # The first forward may wait minutes on JIT compiles (Marlin, Triton, FlashInfer routing);
    # the default watchdog (300 s) would kill the server.
    "--watchdog-timeout", "1200",
    "--grammar-backend", "none",
    "--random-seed", "0",
]

ENV_SERVER_ARGS = "SGLANG_SM120_TEST_SERVER_ARGS"

# The served tiny models, "<arch>-<quant>" (built with seed 0 by the session).
TINY_MODELS = ["qwen3_moe-bf16", "qwen3_moe-nvfp4", "deepseek_v2-bf16", "deepseek_v2-nvfp4",
               "glm_moe_dsa-bf16", "glm_moe_dsa-nvfp4", "glm4_moe-bf16", "glm4_moe-nvfp4"]

# Extra flags by model suffix. NVFP4 runs through Marlin on SM80-SM90, whose MoE reduces with
# atomic adds: identical greedy requests diverged on the H200 (first run) until deterministic
# inference turned that off (patch 0302).
# The DSA model's flags (tinymodels.dsa_flags) come last, so its attention backend wins over the
# default triton.
EXTRA_SERVER_ARGS = {"-nvfp4": ["--enable-deterministic-inference"]}


# Beside other GPU jobs (tinymodels.MAX_TOKENS set): sglang sizes the KV pool from the memory
# still free minus (1 - fraction) x the GPU's total, so 0.15 would need 85% of the GPU free; a
# high fraction with the pool capped at the same 65536 tokens starts while others hold memory.
SHARED_GPU_MEM_FRACTION = "0.7"


def server_args(model: str = "") -> List[str]:
    raw = os.environ.get(ENV_SERVER_ARGS)
    base = shlex.split(raw) if raw is not None else list(DEFAULT_SERVER_ARGS)
    if raw is None and tinymodels.MAX_TOKENS:
        base[base.index("--mem-fraction-static") + 1] = SHARED_GPU_MEM_FRACTION
    extra = [a for suffix, more in EXTRA_SERVER_ARGS.items() if model.endswith(suffix) for a in more]
    if model.startswith(tinymodels.DSA_ARCH + "-"):
        # sglang refuses --enable-deterministic-inference for DeepSeek-family models unless the
        # attention backend is fa3 or triton; server_env asks patch 0302 for the ordered reduce
        extra = [a for a in extra if a != DETERMINISTIC_FLAG] + tinymodels.dsa_flags()
    return base + extra


DETERMINISTIC_FLAG = "--enable-deterministic-inference"


def server_env(model: str = "") -> dict:
    """Environment additions of a model's server: for the DSA model the prefill threshold and,
    in place of the refused flag, the fork's Marlin MoE ordered reduce (patch 0302; sglang resets
    SGLANG_ENABLE_DETERMINISTIC_INFERENCE to 0 whenever the flag is off, so that variable is no
    substitute)."""
    if not model.startswith(tinymodels.DSA_ARCH + "-"):
        return {}
    env = tinymodels.dsa_env()
    if any(DETERMINISTIC_FLAG in extra and model.endswith(suffix)
           for suffix, extra in EXTRA_SERVER_ARGS.items()):
        env["SGLANG_SM120_MARLIN_MOE_ORDERED_REDUCE"] = "1"
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def log_tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(text.splitlines()[-lines:])


class ServerError(RuntimeError):
    pass


class HTTPStatusError(RuntimeError):
    def __init__(self, url: str, status: int, body: str):
        super().__init__(f"{url} -> HTTP {status}: {body[:2000]}")
        self.status = status
        self.body = body


def request_json(url: str, payload: Optional[dict] = None, timeout: float = 120.0):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if payload is None else "POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except urllib.error.HTTPError as e:
        raise HTTPStatusError(url, e.code, e.read().decode("utf-8", "replace")) from None


def _http_status(url: str, timeout: float = 5.0) -> Optional[int]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (urllib.error.URLError, OSError):
        return None


@dataclass
class ShutdownReport:
    clean: bool            # SIGTERM to the main process ended the whole group within the timeout
    returncode: Optional[int]
    seconds: float
    killed: bool           # SIGKILL was needed
    port_free: bool
    note: str = ""


@dataclass
class Server:
    name: str
    model_dir: str
    log_path: str
    args: List[str] = field(default_factory=server_args)
    env: dict = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: Optional[subprocess.Popen] = None
    started_at: float = 0.0
    ready_seconds: Optional[float] = None
    shutdown: Optional[ShutdownReport] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> List[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_dir,
                "--host", "127.0.0.1", "--port", str(self.port),
                "--served-model-name", self.name] + list(self.args)

    def start(self) -> None:
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        # Nothing outside the host is reachable: never try the Hub.
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(("$ " + shlex.join(self.command()) + "\n").encode())
        log.flush()
        self.started_at = time.time()
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=env,
                                     preexec_fn=_own_group_die_with_parent)
        log.close()  # the child holds its own descriptor

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _fail(self, what: str) -> ServerError:
        return ServerError(f"{self.name}: {what}; command: {shlex.join(self.command())}\n"
                           f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}")

    def wait_ready(self, timeout: float, progress: Callable[[str], None] = lambda m: None,
                   every: float = 20.0) -> float:
        """Block until GET /health answers 200 (sglang answers 503 until its warmup request
        has generated). Returns seconds since start."""
        if self.proc is None:
            raise ServerError(f"{self.name}: wait_ready before start")
        deadline = self.started_at + timeout
        next_note = time.time() + every
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise self._fail(f"server exited with code {rc} during startup "
                                 f"after {time.time() - self.started_at:.0f}s")
            if _http_status(self.url + "/health", timeout=10.0) == 200:
                self.ready_seconds = time.time() - self.started_at
                return self.ready_seconds
            now = time.time()
            if now > deadline:
                raise self._fail(f"/health not ready after {timeout:.0f}s (raise "
                                 f"SGLANG_SM120_TEST_STARTUP_TIMEOUT if the host is just slow)")
            if now >= next_note:
                last = log_tail(self.log_path, 1).strip()[-160:]
                progress(f"{self.name}: starting, {now - self.started_at:.0f}s; log: {last}")
                next_note = now + every
            time.sleep(1.0)

    def stop(self, timeout: float = 60.0) -> ShutdownReport:
        """SIGTERM the server's main process (sglang drains requests, then ends its children),
        wait for the whole process group to exit, SIGKILL whatever is left. Idempotent."""
        if self.shutdown is not None:
            return self.shutdown
        if self.proc is None:
            self.shutdown = ShutdownReport(True, None, 0.0, False, True, "never started")
            return self.shutdown
        t0 = time.time()
        pgid = self.proc.pid  # setpgid(0, 0) in the child: the group id is the leader's pid
        already_dead = self.proc.poll() is not None
        if not already_dead:
            self.proc.send_signal(signal.SIGTERM)
        deadline = t0 + timeout
        while time.time() < deadline and (self.proc.poll() is None or _group_alive(pgid)):
            time.sleep(0.2)
        killed = False
        if self.proc.poll() is None or _group_alive(pgid):
            killed = True
            _signal_group(pgid, signal.SIGKILL)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            end = time.time() + 30
            while _group_alive(pgid) and time.time() < end:
                time.sleep(0.2)
        rc = self.proc.poll()
        port_free = False
        end = time.time() + 15  # the listening socket closes with the process; allow TIME_WAIT
        while time.time() < end:
            if port_is_free(self.port):
                port_free = True
                break
            time.sleep(0.5)
        note = "process had already exited before stop" if already_dead else ""
        self.shutdown = ShutdownReport(
            clean=not killed and not already_dead and port_free and not _group_alive(pgid),
            returncode=rc, seconds=time.time() - t0, killed=killed, port_free=port_free, note=note)
        return self.shutdown


def _own_group_die_with_parent() -> None:
    """In the child before exec: a process group of its own (so stop() can signal everything
    the server spawns) but the same session as the test run (so whatever runs the tests can
    still clean up after a hard kill), and SIGTERM when the test process dies."""
    os.setpgid(0, 0)
    try:
        import ctypes
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _signal_group(pgid: int, sig) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def group_members(pgid: int) -> List[int]:
    """Live (non-zombie) processes in the process group. Zombies are ignored: in a container
    whose PID 1 does not reap orphans they linger without holding any resource."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry))
    return pids


def _group_alive(pgid: int) -> bool:
    return bool(group_members(pgid))

"""Run `python -m sglang.launch_server` as a child process: start, wait until ready, stop, log.

One launcher for the demo, the GPU tests, the benchmarks and the lab probes. Each server gets a
free port, a process group of its own (so `stop` reaches every process it spawned; it stays in
the caller's session and gets SIGTERM when the caller dies) and a log file (or the caller's
terminal). `wait_ready` polls a readiness URL and fails with the log tail; `stop` sends SIGTERM
to the server's main process, kills the whole group after a timeout, and reports whether the
shutdown was clean (every process exited on that SIGTERM alone and the port is free again).
The flags a server gets are the caller's: this module adds only host, port, model and name.
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

# Addresses a server listens on that a client cannot connect to as such.
_WILDCARD_HOSTS = ("0.0.0.0", "::", "")


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


def log_tail(path: Optional[str], lines: int = 40) -> str:
    if path is None:
        return "(no log file: the server wrote to the terminal)"
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


def _send(req: urllib.request.Request, timeout: float) -> bytes:
    """The answer's body; HTTPStatusError on an HTTP error status, with the body."""
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read()
    except urllib.error.HTTPError as e:
        raise HTTPStatusError(req.full_url, e.code, e.read().decode("utf-8", "replace")) from None


def request_json(url: str, payload: Optional[dict] = None, timeout: float = 120.0):
    """GET (no payload) or POST `payload` as JSON; the decoded answer."""
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method="GET" if payload is None else "POST",
                                 headers={"Content-Type": "application/json"})
    return json.loads(_send(req, timeout).decode())


def flush_cache(url: str, timeout: float = 120.0) -> None:
    """Empty the server's radix cache (POST /flush_cache, which answers in plain text)."""
    _send(urllib.request.Request(url + "/flush_cache", method="POST"), timeout)


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
    name: str                  # --served-model-name
    model_dir: str             # a local checkpoint: the Hugging Face Hub is never asked
    log_path: Optional[str]    # the server's stdout and stderr; None: the caller's terminal
    args: List[str] = field(default_factory=list)
    env: dict = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    host: str = "127.0.0.1"
    # sglang answers /health with 503 until its warmup request has generated; /health_generate
    # runs a generation of its own on every poll
    ready_path: str = "/health"
    proc: Optional[subprocess.Popen] = None
    started_at: float = 0.0
    ready_seconds: Optional[float] = None
    shutdown: Optional[ShutdownReport] = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in _WILDCARD_HOSTS else self.host
        return f"http://{host}:{self.port}"

    def command(self) -> List[str]:
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model_dir,
                "--host", self.host, "--port", str(self.port),
                "--served-model-name", self.name] + list(self.args)

    def start(self) -> None:
        env = dict(os.environ)
        env.update(self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TRANSFORMERS_OFFLINE", "1")
        log = None
        if self.log_path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(self.log_path)), exist_ok=True)
            log = open(self.log_path, "ab")
            log.write(("$ " + shlex.join(self.command()) + "\n").encode())
            log.flush()
        self.started_at = time.time()
        try:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT if log else None,
                                         stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=_own_group_die_with_parent)
        finally:
            if log is not None:
                log.close()  # the child holds its own descriptor

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _fail(self, what: str) -> ServerError:
        return ServerError(f"{self.name}: {what}; command: {shlex.join(self.command())}\n"
                           f"log {self.log_path}, last lines:\n{log_tail(self.log_path)}")

    def wait_ready(self, timeout: float, progress: Callable[[str], None] = lambda m: None,
                   every: float = 20.0) -> float:
        """Block until GET `ready_path` answers 200. Returns seconds since start; ServerError when
        the server exits first or `timeout` seconds pass."""
        if self.proc is None:
            raise ServerError(f"{self.name}: wait_ready before start")
        deadline = self.started_at + timeout
        next_note = time.time() + every
        while True:
            rc = self.proc.poll()
            if rc is not None:
                raise self._fail(f"server exited with code {rc} during startup "
                                 f"after {time.time() - self.started_at:.0f}s")
            if _http_status(self.url + self.ready_path, timeout=30.0) == 200:
                self.ready_seconds = time.time() - self.started_at
                return self.ready_seconds
            now = time.time()
            if now > deadline:
                raise self._fail(f"{self.ready_path} not ready after {timeout:.0f}s")
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
    the server spawns) but the same session as the caller (so whatever runs the caller can
    still clean up after a hard kill), and SIGTERM when the calling process dies."""
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

"""Traps that turn Dynamo and subprocess use after CUDA-graph capture began into loud errors.

The layerwise runner promises that everything which JIT-compiles, autotunes, probes versions or
spawns processes runs before capture, and that nothing on the serving path enters Dynamo. The
traps make that checkable: once armed (by the runner right before its first graph capture, when
SGLANG_SM120_TRAPS is set), any of these raises `TrapViolation` (mode "raise") or is only
recorded (mode "log"):

- Dynamo: installing an eval-frame callback (what every call of a torch.compile'd function or
  module does, cached or not), and creating a new torch.compile wrapper;
- processes: subprocess.Popen (run / call / check_output / getoutput / os.popen all go through
  it), os.system, os.fork / forkpty, os.posix_spawn(p), os.exec*, and _posixsubprocess.fork_exec
  (multiprocessing's spawn path).

Every hit is also appended as one JSON line to SGLANG_SM120_TRAP_LOG when that is set, so a test
can read what tripped even if some caller swallowed the exception.

Environment: SGLANG_SM120_TRAPS = off (default) | raise | log; SGLANG_SM120_TRAP_LOG = file path.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import threading
import time
import traceback
from typing import Callable, List, Optional

from . import settings

ENV_MODE = "SGLANG_SM120_TRAPS"
ENV_LOG = "SGLANG_SM120_TRAP_LOG"
MODES = ("raise", "log")

_lock = threading.Lock()
_mode: Optional[str] = None
_reason = ""
_log_path: Optional[str] = None
_violations: List[dict] = []
_installed = False
_dynamo_trap_error: Optional[str] = None
_reporting = threading.local()


class TrapViolation(RuntimeError):
    """Dynamo or a subprocess was used after the traps were armed."""


def armed() -> bool:
    return _mode is not None


def violations() -> List[dict]:
    return list(_violations)


def clear_violations() -> None:
    _violations.clear()


def dynamo_trap_error() -> Optional[str]:
    """Why the Dynamo traps could not be installed (None when they are in place)."""
    return _dynamo_trap_error


def arm(reason: str, mode: str = "raise", log_path: Optional[str] = None) -> None:
    """Arm the traps (idempotent; a later call updates reason/mode/log)."""
    global _mode, _reason, _log_path
    if mode not in MODES:
        raise ValueError(f"{ENV_MODE}: mode must be one of {MODES}, got {mode!r}")
    install()
    with _lock:
        _mode, _reason, _log_path = mode, reason, log_path


def disarm() -> None:
    global _mode
    _mode = None


def arm_from_env(reason: str) -> bool:
    """Arm per SGLANG_SM120_TRAPS / SGLANG_SM120_TRAP_LOG; returns whether traps are armed."""
    mode = settings.choice(ENV_MODE)
    if mode == "off":
        return False
    arm(reason, mode=mode, log_path=settings.path(ENV_LOG))
    return True


@contextlib.contextmanager
def trapped(reason: str, mode: str = "raise", log_path: Optional[str] = None):
    """Arm for the duration of a block (tests); restores the previous state after."""
    prev = (_mode, _reason, _log_path)
    arm(reason, mode, log_path)
    try:
        yield
    finally:
        _restore(*prev)


def _restore(mode, reason, log_path) -> None:
    global _mode, _reason, _log_path
    _mode, _reason, _log_path = mode, reason, log_path


def _hit(kind: str, what: str) -> None:
    if _mode is None or getattr(_reporting, "active", False):
        return
    _reporting.active = True  # writing the report must not trip the traps itself
    try:
        record = {
            "kind": kind,
            "what": what,
            "armed_by": _reason,
            "pid": os.getpid(),
            "time": time.time(),
            "stack": "".join(traceback.format_stack(limit=16)[:-2]),
        }
        _violations.append(record)
        if _log_path:
            with contextlib.suppress(OSError):
                with open(_log_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
        mode = _mode
    finally:
        _reporting.active = False
    if mode == "raise":
        raise TrapViolation(f"{kind} used after {_reason!r}: {what}")


def _guard(kind: str, describe: Callable[..., str], fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _mode is not None:
            _hit(kind, describe(*args, **kwargs))
        return fn(*args, **kwargs)

    wrapper.__sm120_trap__ = fn
    return wrapper


def _patch(owner, name: str, kind: str, describe: Callable[..., str]) -> None:
    fn = getattr(owner, name, None)
    if fn is None or getattr(fn, "__sm120_trap__", None) is not None:
        return
    setattr(owner, name, _guard(kind, describe, fn))


def _install_process_traps() -> None:
    def popen_desc(self, args=None, *a, **k):
        return f"subprocess.Popen({args!r})"

    original_init = subprocess.Popen.__init__
    if getattr(original_init, "__sm120_trap__", None) is None:
        subprocess.Popen.__init__ = _guard("subprocess", popen_desc, original_init)
    for name in ("system",):
        _patch(os, name, "subprocess", lambda *a, _n=name, **k: f"os.{_n}{a!r}")
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execve"):
        _patch(os, name, "subprocess", lambda *a, _n=name, **k: f"os.{_n}{a[:2]!r}")
    try:
        import _posixsubprocess

        _patch(_posixsubprocess, "fork_exec", "subprocess", lambda *a, **k: "_posixsubprocess.fork_exec")
    except ImportError:  # not POSIX
        pass


def _install_dynamo_traps() -> None:
    global _dynamo_trap_error
    try:
        import torch
        import torch._dynamo.eval_frame as eval_frame
    except Exception as e:  # noqa: BLE001 - torch absent or broken: nothing to trap
        _dynamo_trap_error = f"{type(e).__name__}: {e}"
        return

    def frame_desc(callback, *a, **k):
        return f"Dynamo eval-frame callback installed ({type(callback).__name__})"

    for name in ("set_eval_frame", "_maybe_set_eval_frame"):
        fn = getattr(eval_frame, name, None)
        if fn is None or getattr(fn, "__sm120_trap__", None) is not None:
            continue

        def make(orig):
            @functools.wraps(orig)
            def wrapper(callback, *a, **k):
                if _mode is not None and callback not in (None, False):
                    _hit("dynamo", frame_desc(callback))
                return orig(callback, *a, **k)

            wrapper.__sm120_trap__ = orig
            return wrapper

        setattr(eval_frame, name, make(fn))
    _patch(torch, "compile", "dynamo", lambda *a, **k: f"torch.compile({a[0] if a else ''!r})")
    _dynamo_trap_error = None


def install() -> None:
    """Put the wrappers in place (they do nothing until armed). Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return
        _install_process_traps()
        _install_dynamo_traps()
        _installed = True

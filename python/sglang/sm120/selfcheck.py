"""What the sm120 backends' load-time self-checks share (fp4_selfcheck: the NVFP4 GEMM;
fp4_moe_selfcheck: the grouped NVFP4 MoE): the fault-injection switch, the once-per-process
decision with its one log line and its fallback, and how an exception reads in an outcome.

A check's outcome is any object with `ok`, a settable `fallback`, `passed()` (what the INFO line
says after "passed on this GPU: ") and `failure()` (shape, case, path and error, for the ERROR
line and the fallback's reason).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from sglang.sm120 import settings

logger = logging.getLogger(__name__)

FAULT_INJECT_ENV = "SGLANG_SM120_FAULT_INJECT"
FAULT_SITES = ("gemm", "moe")


def fault_site() -> str:
    """The fault SGLANG_SM120_FAULT_INJECT asks for ('' when unset); ValueError on an unknown one."""
    raw = (settings.text(FAULT_INJECT_ENV) or "").strip().lower()
    if raw and raw not in FAULT_SITES:
        raise ValueError(f"{FAULT_INJECT_ENV} must be one of {', '.join(FAULT_SITES)} (or unset), got {raw!r}")
    return raw


def corrupt_one(y):
    """y with its first element moved far outside any tolerance (a copy; y is left alone)."""
    y = y.clone()
    flat = y.view(-1)
    flat[0] = flat[0] + 1.0 + flat[0].abs()
    return y


def error_line(exc: BaseException) -> str:
    """`Type: first line` of an exception (a launch error, a missing kernel image, ...)."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {first}"


class OnceCheck:
    """One backend's self-check decision for the process: the first `ensure` runs the check,
    logs one line and, on failure, falls back; every later call returns that first outcome."""

    def __init__(self, what: str, upstream_what: str, log: logging.Logger) -> None:
        self.what = what                    # "NVFP4" -> "sm120 NVFP4 self-check passed ..."
        self.upstream_what = upstream_what  # "FP4 GEMM" -> "upstream's <name> FP4 GEMM backend"
        self.log = log
        self._lock = threading.Lock()
        self.outcome: Optional[Any] = None

    def ensure(self, verify: Callable[[], Any], fall_back: Callable[[str], str]) -> Any:
        with self._lock:
            if self.outcome is not None:
                return self.outcome
            res = verify()
            if res.ok:
                self.log.info("sm120 %s self-check passed on this GPU: %s", self.what, res.passed())
            else:
                what = res.failure()
                try:
                    res.fallback = fall_back(what)
                except Exception as exc:  # never serve the unverified kernels: stop with both reasons
                    raise RuntimeError(f"sm120 {self.what} self-check FAILED ({what}) and switching to "
                                       f"upstream's backend failed: {type(exc).__name__}: {exc}") from exc
                self.log.error("sm120 %s self-check FAILED: %s -- this process uses upstream's %s %s "
                               "backend instead", self.what, what, res.fallback, self.upstream_what)
            self.outcome = res
            return res

    def reset(self) -> None:
        with self._lock:
            self.outcome = None

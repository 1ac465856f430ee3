"""Bookkeeping shared by the benchmark scripts: the commit measured, target records, results files.

A results file is one JSON document per tag (benchmarks/records.toml names the ones of record); scripts that run in pieces
(one GPU-host command each) merge every piece into it, so the file always holds everything
measured so far, with a top-level "targets" object ({name: {value, target, met}}).
"""
from __future__ import annotations

import datetime as dt
import gzip
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


def commit() -> str:
    """The commit measured: SGLANG_SM120_COMMIT (the GPU host's copy has no .git), else git."""
    if os.environ.get("SGLANG_SM120_COMMIT"):
        return os.environ["SGLANG_SM120_COMMIT"]
    try:
        return subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def target(value, threshold: str, ok: Callable[[float], bool]) -> dict:
    """One entry of a results file's "targets": a missing measurement is never met."""
    return {"value": value, "target": threshold, "met": bool(value is not None and ok(value))}


def ratio(a: Optional[float], b: Optional[float], digits: int = 4) -> Optional[float]:
    return round(a / b, digits) if a is not None and b not in (None, 0) else None


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def load(path: Path, empty: dict) -> dict:
    """The document at path (plain, or gzip-compressed as records over 16 KiB are kept), or
    `empty` when there is none yet."""
    if not path.exists():
        return dict(empty)
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def save(path: Path, doc: dict) -> None:
    """Write atomically: a command killed at the host's time limit leaves the last good file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


class Log:
    """A benchmark's progress lines: printed as they come (time-stamped) and kept for its log file."""

    def __init__(self):
        self.lines = []

    def __call__(self, msg):
        line = f"[{time.strftime('%H:%M:%S')}] {msg}"
        print(line, flush=True)
        self.lines.append(line)

"""GPU power draw and memory use from `nvidia-smi`, sampled in a background thread.

`nvidia-smi --query-gpu=power.draw,memory.used --format=csv,noheader,nounits` once a second while a
measurement runs. Where nvidia-smi is missing, fails, or prints "[N/A]"/"[Not Supported]" (some
virtualised GPUs), the summary says "not readable" and why; a benchmark never fails on it.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import threading
import time
from typing import List, Optional, Tuple

QUERY = ["nvidia-smi", "--query-gpu=power.draw,memory.used", "--format=csv,noheader,nounits"]
Sample = Tuple[Optional[float], Optional[float]]  # (watts, MiB)


def _number(field: str) -> Optional[float]:
    try:
        return float(field.strip().split()[0])
    except (ValueError, IndexError):
        return None  # "[N/A]", "[Not Supported]", empty


def parse_csv(text: str, gpu: int = 0) -> Sample:
    """(power W, memory MiB) of line `gpu` of nvidia-smi's noheader/nounits CSV. Units and a
    header line (plain --format=csv) are tolerated."""
    rows = [ln for ln in text.splitlines() if ln.strip() and not ln.lower().startswith("power.draw")]
    if gpu >= len(rows):
        raise ValueError(f"nvidia-smi listed {len(rows)} GPU(s); wanted index {gpu}")
    fields = rows[gpu].split(",")
    if len(fields) < 2:
        raise ValueError(f"unexpected nvidia-smi line: {rows[gpu]!r}")
    return _number(fields[0]), _number(fields[1])


def visible_gpu_index() -> int:
    """nvidia-smi numbers physical GPUs; the server runs on the first visible one."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


def query(gpu: Optional[int] = None, timeout: float = 10.0) -> Tuple[Optional[Sample], Optional[str]]:
    """One reading, or (None, why not)."""
    gpu = visible_gpu_index() if gpu is None else gpu
    try:
        out = subprocess.run(QUERY, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"nvidia-smi: {e}"
    if out.returncode != 0:
        return None, f"nvidia-smi exit {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}"
    try:
        return parse_csv(out.stdout, gpu), None
    except ValueError as e:
        return None, str(e)


def device_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i",
                              str(visible_gpu_index())], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown device"
    name = out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""
    return name or "unknown device"


def summarize(samples: List[Sample], error: Optional[str]) -> dict:
    watts = [w for w, _ in samples if w is not None]
    mib = [m for _, m in samples if m is not None]
    out = {"samples": len(samples)}
    if watts:
        out["power_w"] = {"median": round(statistics.median(watts), 1), "max": round(max(watts), 1),
                          "mean": round(statistics.fmean(watts), 1)}
    else:
        out["power_w"] = "not readable" + (f" ({error})" if error else " (nvidia-smi reported no value)")
    if mib:
        out["memory_used_mib"] = {"max": max(mib), "last": mib[-1]}
    else:
        out["memory_used_mib"] = "not readable" + (f" ({error})" if error else "")
    return out


class GpuSampler:
    """with GpuSampler() as s: ...  then s.summary (see summarize)."""

    def __init__(self, interval_s: float = 1.0, gpu: Optional[int] = None):
        self.interval_s, self.gpu = interval_s, gpu
        self.samples: List[Sample] = []
        self.times: List[float] = []  # monotonic seconds of each sample
        self.error: Optional[str] = None
        self.summary: Optional[dict] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpu-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sample, err = query(self.gpu)
            if sample is None:
                self.error = err
                return  # not readable now means not readable for this run; stop asking
            self.samples.append(sample)
            self.times.append(time.monotonic())
            self._stop.wait(self.interval_s)

    def memory_series(self, since: float) -> List[List[float]]:
        """[[seconds since `since` (monotonic), MiB], ...] of the readings taken so far."""
        return [[round(t - since, 1), m] for t, (_, m) in zip(list(self.times), list(self.samples)) if m is not None]

    def __enter__(self) -> "GpuSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.summary = summarize(self.samples, self.error)

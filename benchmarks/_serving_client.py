"""Upstream's serving client (`python -m sglang.benchmark.serving`), as one or several processes.

One client process parses every streamed chunk in Python, and sglang's native `/generate` stream
sends the whole text so far plus `meta_info` in every chunk. On the H200 (2026-12-01, concurrency
1024) the server produced ~20k tokens/s while the client received ~8.7k/s and its requests
finished ~10 s after the server's last decode step of a wave (docs/serving-bench.md, "Client
limits"). Two ways to tell the client's limit from the server's:

- `procs` > 1: that many clients side by side, each with 1/procs of the concurrency and prompts
  and its own seed (distinct prompts, so no radix-cache hits between them). Their per-request
  details (`--output-details`) are merged into one record with upstream's keys: throughputs
  over the longest client's duration, percentiles over all requests (upstream's formulas).
- `stream=False`: upstream's `--disable-stream`; one response per request. Throughput only:
  TTFT and ITL have no meaning there and are reported as null.
"""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np

# record keys recomputed when merging several clients; others are dropped (no per-request source)
MERGED_KEYS = ("completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
               "input_throughput", "output_throughput", "total_throughput", "mean_ttft_ms", "median_ttft_ms",
               "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "max_concurrency")
LATENCY_KEYS = ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                "median_tpot_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms")


def command(port: int, model_dir: str, served: str, conc: int, prompts: int, out_file: Path,
            input_len: int, output_len: int, seed: int, stream: bool = True, details: bool = False) -> List[str]:
    """random-ids + --tokenize-prompt: random token ids sent as input_ids, so prompt lengths are
    exact and nothing is downloaded (the `random` dataset samples ShareGPT text from the Hub)."""
    cmd = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang",
           "--host", "127.0.0.1", "--port", str(port), "--model", model_dir,
           "--served-model-name", served, "--tokenizer", model_dir,
           "--dataset-name", "random-ids", "--tokenize-prompt",
           "--random-input-len", str(input_len), "--random-output-len", str(output_len),
           "--random-range-ratio", "1.0", "--num-prompts", str(prompts),
           "--max-concurrency", str(conc), "--request-rate", "inf", "--seed", str(seed),
           "--output-file", str(out_file), "--disable-tqdm"]
    if not stream:
        cmd.append("--disable-stream")
    if details:
        cmd.append("--output-details")
    return cmd


def split(conc: int, prompts: int, procs: int) -> List[Tuple[int, int]]:
    """(concurrency, prompts) per client: as even as integers allow, every client at least 1 of each."""
    procs = max(1, min(procs, conc, prompts))
    return [(conc // procs + (i < conc % procs), prompts // procs + (i < prompts % procs)) for i in range(procs)]


def run_all(cmds: List[List[str]], timeout: float) -> Tuple[object, str]:
    """Start every client at once; (0 or the first failure, their output concatenated)."""
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    deadline = time.time() + timeout
    outs, rc = [], 0
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            rc = rc or f"timeout after {timeout:.0f}s"
        outs.append(out or "")
        rc = rc or p.returncode
    sep = "\n----- next client -----\n"
    return rc, sep.join(outs)


def _ms(xs: List[float], q: Optional[float]) -> Optional[float]:
    if not xs:
        return None
    return float((np.mean(xs) if q is None else np.percentile(xs, q)) * 1000)


def merge_records(recs: List[dict]) -> dict:
    """One record from several clients' --output-details records (upstream's metric formulas:
    np.mean / np.median / np.percentile over successful requests; ITLs flattened)."""
    if len(recs) == 1:
        return recs[0]
    ok = [(r, i) for r in recs for i, e in enumerate(r["errors"]) if not e]
    ttfts = [r["ttfts"][i] for r, i in ok]
    itls = [x for r, i in ok for x in r["itls"][i]]
    duration = max(r["duration"] for r in recs)
    tin = sum(r["total_input_tokens"] for r in recs)
    tout = sum(r["total_output_tokens"] for r in recs)
    return {
        "completed": sum(r["completed"] for r in recs), "duration": duration,
        "total_input_tokens": tin, "total_output_tokens": tout,
        "request_throughput": sum(r["completed"] for r in recs) / duration,
        "input_throughput": tin / duration, "output_throughput": tout / duration,
        "total_throughput": (tin + tout) / duration,
        "mean_ttft_ms": _ms(ttfts, None), "median_ttft_ms": _ms(ttfts, 50), "p99_ttft_ms": _ms(ttfts, 99),
        "mean_itl_ms": _ms(itls, None), "median_itl_ms": _ms(itls, 50), "p99_itl_ms": _ms(itls, 99),
        "max_concurrency": sum(r.get("max_concurrency") or 0 for r in recs),
        "clients": [{k: r.get(k) for k in ("completed", "duration", "output_throughput", "max_concurrency")}
                    for r in recs],
    }

"""Layerwise stage: one tiny model served with the layerwise CUDA-graph runner (decode at every
batch size and prefill captured) against the same model with graphs disabled, greedy.

Each engine runs in its own process (layerwise_worker) under a time limit. Prompts are compared
one by one: `identical` tokens; a `flip` where the first differing token is a near tie (the
logprob gap between the two candidates is <= NEAR_TIE_EPS under both runs: the tiny models'
logits are near ties by construction, and captured attention plans other kernels than eager, so
flips happen between correct runs, docs/runner.md); anything else is a `mismatch`. The stage
passes when mismatches are at most MAX_MISMATCH_FRACTION of the prompts and the chosen tokens'
logprobs agree within MAX_ABS_DELTA on every agreeing prefix; a broken capture or replay
(stale buffers, a wrong segment) changes most prompts and moves logprobs by whole nats.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

NEAR_TIE_EPS = 0.25        # nats: two bf16 steps of the tiny models' logits (test_layerwise_correctness)
MAX_ABS_DELTA = 1.0        # nats, chosen-token logprob on agreeing prefixes (bf16)
MAX_MISMATCH_FRACTION = 0.05
HEARTBEAT_S = 30.0         # a progress line while an engine runs
ARCH, QUANT = "qwen3_moe", "bf16"
FULL_GRID = {"batch_sizes": (1, 3, 16, 32), "prompt_lens": (7, 128, 300), "new_tokens": 12,
             "max_running": 32, "chunk": 1024}
QUICK_GRID = {"batch_sizes": (1, 5, 16), "prompt_lens": (7, 100), "new_tokens": 8, "max_running": 16,
              "chunk": 256}


def default_model_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "sglang-sm120" / "tiny"


def ensure_tiny_model(root: Path, log: Callable[[str], None], timeout: float) -> Path:
    """The tiny model under root (built by the factory on first use; deterministic from its seed)."""
    out = root / f"{ARCH}-{QUANT}"
    if (out / "config.json").is_file():
        return out
    log(f"  building tiny model {ARCH}/{QUANT} in {out}")
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "sglang.sm120.tiny", "--arch", ARCH, "--quant", QUANT, "--out", str(out),
                    "--force"], check=True, timeout=timeout, capture_output=True, text=True)
    return out


def prompt_batches(grid: dict, vocab: int, seed: int = 1234) -> List[List[List[int]]]:
    rng = random.Random(seed)
    return [[[rng.randrange(3, vocab) for _ in range(plen)] for _ in range(bs)]
            for bs in grid["batch_sizes"] for plen in grid["prompt_lens"]]


def _gap(top: Dict[str, float], chosen: int, other: int) -> float:
    mine = top.get(str(chosen))
    if mine is None:
        return float("inf")
    theirs = top.get(str(other), min(top.values()) if top else float("-inf"))
    return mine - theirs


def classify(ref: Dict, got: Dict, eps: float = NEAR_TIE_EPS) -> Dict:
    """{kind: identical|flip|mismatch, position, max_abs_delta} of one prompt."""
    delta = 0.0
    for t, (a, b) in enumerate(zip(ref["tokens"], got["tokens"])):
        if a == b:
            delta = max(delta, abs(ref["logprobs"][t] - got["logprobs"][t]))
            continue
        gap = max(_gap(ref["top"][t], a, b), _gap(got["top"][t], b, a))
        return {"kind": "flip" if gap <= eps else "mismatch", "position": t, "max_abs_delta": delta}
    if len(ref["tokens"]) != len(got["tokens"]):
        return {"kind": "mismatch", "position": min(len(ref["tokens"]), len(got["tokens"])), "max_abs_delta": delta}
    return {"kind": "identical", "position": None, "max_abs_delta": delta}


def judge(ref: List[Dict], got: List[Dict]) -> Dict:
    if len(ref) != len(got):
        return {"ok": False, "detail": f"{len(got)} outputs, expected {len(ref)}"}
    verdicts = [classify(a, b) for a, b in zip(ref, got)]
    counts = {k: sum(v["kind"] == k for v in verdicts) for k in ("identical", "flip", "mismatch")}
    delta = max((v["max_abs_delta"] for v in verdicts), default=0.0)
    allowed = int(MAX_MISMATCH_FRACTION * len(ref))
    ok = counts["mismatch"] <= allowed and delta <= MAX_ABS_DELTA
    detail = (f"{counts['identical']} identical, {counts['flip']} near-tie flips, {counts['mismatch']} mismatches "
              f"(allowed {allowed}) of {len(ref)} prompts; max |delta logprob| {delta:.3f} (allowed {MAX_ABS_DELTA})")
    return {"ok": ok, "detail": detail, "counts": counts, "max_abs_delta": round(delta, 4), "prompts": len(ref)}


def _run_worker(model: Path, mode: str, prompts: Path, out: Path, grid: dict, timeout: float,
                log: Callable[[str], None]) -> Dict:
    cmd = [sys.executable, "-m", "sglang.sm120.check.layerwise_worker", "--model", str(model), "--mode", mode,
           "--prompts", str(prompts), "--out", str(out), "--new-tokens", str(grid["new_tokens"]),
           "--max-running", str(grid["max_running"]), "--chunk", str(grid["chunk"])]
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as output:
        proc = subprocess.Popen(cmd, stdout=output, stderr=subprocess.STDOUT, text=True)
        while True:
            waited = time.time() - t0
            try:
                proc.wait(timeout=max(0.1, min(HEARTBEAT_S, timeout - waited)))
                break
            except subprocess.TimeoutExpired:
                waited = time.time() - t0
                if waited >= timeout:
                    proc.kill()
                    proc.wait()
                    return {"error": f"{mode} engine did not finish in {timeout:.0f} s"}
                log(f"  {mode} engine: running for {waited:.0f} s (a first run on a machine also compiles JIT kernels)")
        output.seek(0)
        text = output.read()
    if proc.returncode != 0 or not out.is_file():
        tail = text.strip().splitlines()[-3:]
        return {"error": f"{mode} engine exited {proc.returncode}: " + " | ".join(tail)}
    doc = json.loads(out.read_text())
    doc["wall_s"] = round(time.time() - t0, 1)
    return doc


def run(work: Path, model_root: Optional[Path], quick: bool, timeout: float, log: Callable[[str], None]) -> Dict:
    """The stage's result: {ok, detail, ...}; `ok` False also when an engine fails or times out."""
    grid = QUICK_GRID if quick else FULL_GRID
    t0 = time.time()
    try:
        model = ensure_tiny_model(model_root or default_model_root(), log, timeout)
    except (subprocess.SubprocessError, OSError) as exc:
        return {"ok": False, "detail": f"tiny model build failed: {exc}"}
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    work.mkdir(parents=True, exist_ok=True)
    prompts = work / "layerwise-prompts.json"
    prompts.write_text(json.dumps(prompt_batches(grid, vocab)))
    runs = {}
    for mode in ("disabled", "layerwise"):
        left = timeout - (time.time() - t0)
        if left <= 10:
            return {"ok": False, "detail": f"time limit of {timeout:.0f} s spent before the {mode} engine"}
        log(f"  {mode} engine on {model.name}: {sum(map(len, prompt_batches(grid, vocab)))} prompts, {grid['new_tokens']} new tokens each")
        runs[mode] = _run_worker(model, mode, prompts, work / f"layerwise-{mode}.json", grid, left, log)
        if "error" in runs[mode]:
            return {"ok": False, "detail": runs[mode]["error"], "model": f"{ARCH}/{QUANT}"}
        log(f"  {mode}: engine up in {runs[mode]['startup_s']} s, done in {runs[mode]['wall_s']} s")
    res = judge(runs["disabled"]["outputs"], runs["layerwise"]["outputs"])
    res.update({"model": f"{ARCH}/{QUANT}", "grid": {k: list(v) if isinstance(v, tuple) else v for k, v in grid.items()},
                "engine_s": {m: runs[m]["wall_s"] for m in runs}, "seconds": round(time.time() - t0, 1)})
    log(f"  layerwise vs graphs disabled: {res['detail']}")
    return res

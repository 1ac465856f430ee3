#!/usr/bin/env python3
"""Soak: minutes of concurrency-1024 traffic with random lengths and malformed requests, one server.

    python benchmarks/soak.py --tag h200 --minutes 10          # the issue's soak
    python benchmarks/soak.py --tag h200-short --minutes 4     # fits one 10-minute host command

The server (default: the fork's layerwise runner, same flags as the serving benchmark) serves the
full-size NVFP4 model of bench_serving_matrix.py. CONCURRENCY client loops send back to back for
--minutes; 2% of the requests are malformed (benchmarks/_soak_cases.py: bad JSON, negative
max_tokens, unknown model, prompt over the context length, wrong types), the rest are well-formed
with prompts of 1 token to near the context limit and 1-512 output tokens. After the deadline no new
request starts and the ones in flight must finish within --drain-timeout.

Checked (results: benchmarks/results/soak-TAG.json, with "targets"): the server never crashes
(alive, /health 200 and one more request served afterwards); every malformed request got a 4xx
with a message; every well-formed request completed (200, finish reason, token counts); GPU memory
(nvidia-smi) after the soak equals memory before within 1%. "Before" is read after a warm-up burst
(one longest prompt plus CONCURRENCY short requests at once): PyTorch's caching allocator grows
to the largest batch the first time it runs, which is not a leak; the reading right after startup
is reported too.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Dict, List, Optional

import _results
import _serving_setup as setup
from _gpu_sampler import GpuSampler, device_name, query as gpu_query
from _soak_cases import MALFORMED, Request, RequestPlan, judge_malformed, judge_wellformed

from sglang.sm120 import launcher

EXAMPLES = 3  # failure descriptions kept per request kind


class Tally:
    """Outcomes per request kind, plus the lengths sent and the latencies of well-formed requests."""

    def __init__(self):
        self.sent: Dict[str, int] = defaultdict(int)
        self.ok: Dict[str, int] = defaultdict(int)
        self.examples: Dict[str, List[str]] = defaultdict(list)
        self.inflight: Dict[int, Request] = {}
        self.latency_s: List[float] = []
        self.prompt_lens: List[int] = []
        self.output_lens: List[int] = []
        self.completion_tokens = 0
        self.connection_errors = 0

    def record(self, req: Request, ok: bool, why: str, latency: float, tokens: int) -> None:
        self.sent[req.kind] += 1
        if ok:
            self.ok[req.kind] += 1
        elif len(self.examples[req.kind]) < EXAMPLES:
            self.examples[req.kind].append(why)
        if not req.malformed:
            self.prompt_lens.append(req.prompt_len)
            self.output_lens.append(req.max_tokens)
            if ok:
                self.latency_s.append(latency)
                self.completion_tokens += tokens

    def unfinished(self, malformed: bool) -> int:
        return sum(1 for r in self.inflight.values() if r.malformed == malformed)

    def summary(self, malformed: bool) -> dict:
        kinds = [k for k in self.sent if (k in MALFORMED) == malformed]
        sent = sum(self.sent[k] for k in kinds) + self.unfinished(malformed)
        ok = sum(self.ok[k] for k in kinds)
        by = {k: {"sent": self.sent[k], "ok": self.ok[k], "failures": self.examples.get(k, [])} for k in sorted(kinds)}
        out = {"sent": sent, "ok": ok, "unfinished_at_drain_timeout": self.unfinished(malformed), "by_kind": by}
        if malformed:
            out["cases_never_sent"] = sorted(set(MALFORMED) - set(kinds))
        return out


def _dist(xs: List[float], digits: int = 3) -> Optional[dict]:
    if not xs:
        return None
    s = sorted(xs)
    return {"min": round(s[0], digits), "median": round(statistics.median(s), digits),
            "p99": round(s[min(len(s) - 1, int(0.99 * len(s)))], digits), "max": round(s[-1], digits)}


async def _send(session, url: str, req: Request, tally: Tally) -> None:
    import aiohttp

    key = id(req)
    tally.inflight[key] = req
    t0 = time.monotonic()
    try:
        async with session.post(url + req.path, data=req.body, headers=req.headers) as r:
            status, body = r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        tally.connection_errors += 1
        status, body = 0, f"connection error: {e!r}"
    tally.inflight.pop(key, None)  # not on cancellation: a request cut off at the drain timeout stays unfinished
    v = judge_malformed(status, body) if req.malformed else judge_wellformed(req, status, body)
    tally.record(req, v.ok, v.why, time.monotonic() - t0, v.completion_tokens)


async def _progress(tally: Tally, every: float, t0: float, on_tick=None) -> None:
    while True:
        await asyncio.sleep(every)
        done, ok = sum(tally.sent.values()), sum(tally.ok.values())
        print(f"[soak] {time.monotonic() - t0:.0f}s: {done} answered ({done - ok} failed), "
              f"{len(tally.inflight)} in flight", flush=True)
        if on_tick:
            on_tick()


async def run_load(url: str, plan_next, concurrency: int, seconds: float, drain_timeout: float,
                   tally: Tally, fixed: Optional[List[Request]] = None, progress_s: float = 0,
                   on_tick=None, warmup_s: float = 0, warm_tally: Optional[Tally] = None,
                   on_warm_end=None) -> float:
    """CONCURRENCY loops sending plan_next() back to back until `seconds` have passed (or, with
    `fixed`, each sending its share of those requests once). Returns the drain time. With
    warmup_s, the same load runs that long first without a pause: requests sent then are
    recorded in warm_tally, and on_warm_end() runs once when it is over."""
    import aiohttp

    loop = asyncio.get_running_loop()
    warm_end = loop.time() + warmup_s
    deadline = warm_end + seconds
    ticker = asyncio.create_task(_progress(tally, progress_s, time.monotonic(), on_tick)) if progress_s else None
    timeout = aiohttp.ClientTimeout(total=seconds + drain_timeout + 60)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=concurrency + 8)) as session:
        async def loop_send(i: int):
            if fixed is not None:
                for req in fixed[i::concurrency]:
                    await _send(session, url, req, tally)
                return
            while loop.time() < deadline:
                await _send(session, url, plan_next(), warm_tally if loop.time() < warm_end else tally)

        async def warm_over():
            await asyncio.sleep(warmup_s)
            on_warm_end()

        tasks = [asyncio.create_task(loop_send(i)) for i in range(concurrency)]
        marker = asyncio.create_task(warm_over()) if warmup_s and on_warm_end else None
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - loop.time()) + drain_timeout)
        drain = loop.time() - deadline
        for t in pending:
            t.cancel()  # whatever is still in flight stays in tally.inflight: unfinished
        await asyncio.gather(*pending, return_exceptions=True)
        if marker and not marker.done():
            marker.cancel()
    if ticker:
        ticker.cancel()
    return drain


def _memory_mib() -> Optional[float]:
    sample, _ = gpu_query()
    return sample[1] if sample else None


def _health(url: str) -> bool:
    try:
        import urllib.request

        with urllib.request.urlopen(url + "/health", timeout=30) as r:
            return r.status == 200
    except Exception:  # noqa: BLE001
        return False


def _judged(doc: dict, kind: str) -> Dict[str, int]:
    """ok / sent of the soak plus its warm-up: the warm-up is not timed, but its answers count."""
    parts = [doc[kind], (doc.get("warmup") or {}).get(kind) or {}]
    return {"ok": sum(p.get("ok", 0) for p in parts), "sent": sum(p.get("sent", 0) for p in parts)}


def compute_targets(doc: dict) -> dict:
    wf, mf, mem = _judged(doc, "wellformed"), _judged(doc, "malformed"), doc["memory_mib"]
    crashed = not (doc["server_alive_after"] and doc["health_after"] and doc["request_after_ok"])
    return {
        "server_crashes": _results.target(int(crashed), "== 0", lambda v: v == 0),
        "malformed_answered_4xx_with_message": _results.target(
            _results.ratio(mf["ok"], mf["sent"]), "== 1.0 (all 4xx with a message)", lambda v: v == 1.0),
        "wellformed_completed": _results.target(
            _results.ratio(wf["ok"], wf["sent"], 6), "== 1.0 (all completed)", lambda v: v == 1.0),
        "gpu_memory_drift_pct": _results.target(mem.get("drift_pct"), "<= 1.0", lambda v: v <= 1.0),
    }


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="h200", help="results go to RESULTS_DIR/soak-TAG.json")
    ap.add_argument("--config", default="layerwise", choices=list(setup.CONFIGS))
    ap.add_argument("--minutes", type=float, default=10.0, help="length of the load phase (default 10)")
    ap.add_argument("--warmup-minutes", type=float, default=2.0,
                    help="the same traffic first, not timed (its answers are judged), until GPU memory is read "
                         "as 'before' (default 2)")
    ap.add_argument("--concurrency", type=int, default=1024)
    ap.add_argument("--malformed-share", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context-length", type=int, default=None,
                    help="server --context-length (default: the model's, 40960)")
    ap.add_argument("--drain-timeout", type=float, default=300.0,
                    help="seconds the requests in flight at the deadline get to finish")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--layers", type=int, default=None, help="fewer decoder layers (smoke runs only)")
    ap.add_argument("--mem-fraction-static", type=float, default=0.80)
    ap.add_argument("--server-args", default="", help="extra launch_server flags for every server (shell syntax)")
    ap.add_argument("--startup-timeout", type=float, default=600)
    ap.add_argument("--results-dir", default=str(_results.RESULTS))
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--copy-to", default=None, help="also copy the results and the server log tail here")
    a = ap.parse_args(argv)
    if a.minutes <= 0:
        ap.error(f"--minutes: must be > 0, got {a.minutes}")
    if a.warmup_minutes < 0:
        ap.error(f"--warmup-minutes: must be >= 0, got {a.warmup_minutes}")
    if a.concurrency < 1:
        ap.error(f"--concurrency: must be >= 1, got {a.concurrency}")
    if not 0 <= a.malformed_share < 1:
        ap.error(f"--malformed-share: must be in [0, 1), got {a.malformed_share}")
    if a.model_dir is None:
        a.model_dir = setup.DEFAULT_MODEL_DIR + (f"-{a.layers}l" if a.layers else "")
    return a


TARGET_NAMES = ("server_crashes", "malformed_answered_4xx_with_message", "wellformed_completed",
                "gpu_memory_drift_pct")


def _unmet(why: str) -> dict:
    return {k: _results.target(None, why, bool) for k in TARGET_NAMES}


def soak_flags(a) -> List[str]:
    # --reject-unknown-model (patch 0401): the soak's unknown-model cases must get a 404, which
    # upstream never sends (it serves any `model`).
    flags = (setup.common_flags(a.mem_fraction_static, a.concurrency) + setup.CONFIGS[a.config]
             + ["--reject-unknown-model"] + shlex.split(a.server_args))
    if a.context_length:
        flags += ["--context-length", str(a.context_length)]
    return flags


def new_doc(a, model: dict, config: str, flags: List[str]) -> dict:
    return {"tag": a.tag, "commit": _results.commit(), "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "model": model, "server": {"config": config, "flags": flags}}


def _out(a) -> Path:
    return Path(a.results_dir) / f"soak-{a.tag}.json"


def _save(a, doc: dict) -> None:
    _results.save(_out(a), doc)
    if a.copy_to:
        os.makedirs(a.copy_to, exist_ok=True)
        shutil.copy(_out(a), a.copy_to)


def _save_progress(a, doc: dict, tally: Tally, t0: float, memory_series=None) -> None:
    """Every progress tick: what the soak has seen so far, so a run cut off (host time limit,
    device budget) still returns its figures. Targets stay unmet until the soak has finished."""
    doc["partial"] = {"elapsed_s": round(time.time() - t0, 1), "of_s": (a.minutes + a.warmup_minutes) * 60,
                      "wellformed": tally.summary(False), "malformed": tally.summary(True),
                      "connection_errors": tally.connection_errors, "memory_series_mib": memory_series}
    doc["targets"] = _unmet("soak not finished")
    _save(a, doc)


def run_soak(a, srv, model: dict, doc: dict) -> None:
    """Warm-up burst, memory reading, the load, drain, memory again, the post-soak checks; into doc."""
    facts = setup.server_facts(srv.url)
    doc["server"]["facts"] = facts
    ctx = a.context_length or facts.get("context_length") or model["spec"]["max_position"]
    plan = RequestPlan(a.seed, ctx, model["tokenizer_vocab"], a.config, a.malformed_share,
                       max_input_len=facts.get("max_req_input_len"))
    mem_ready = _memory_mib()
    burst_tally, warm = Tally(), Tally()
    burst = [plan.wellformed("generate", plan.limit - 64, 8)] + \
            [plan.wellformed("generate", 16, 8) for _ in range(a.concurrency)]
    print(f"[soak] warm-up: 1 x {plan.limit - 64} + {a.concurrency} x 16 tokens, then {a.warmup_minutes} min "
          f"of the soak's own traffic", flush=True)
    asyncio.run(run_load(srv.url, None, a.concurrency, 0, a.drain_timeout, burst_tally, fixed=burst))
    mem = {}
    tally = Tally()
    t0 = time.time()
    m0 = time.monotonic()

    def warm_end():
        # The caching allocator keeps what the largest shapes of this traffic needed; "before"
        # is read once it has met them, under load (reserved memory does not shrink when idle).
        mem["before"] = _memory_mib()
        mem["before_at_s"] = round(time.monotonic() - m0, 1)
        print(f"[soak] warm-up over: GPU memory {mem['before']} MiB; {a.minutes} min at concurrency "
              f"{a.concurrency}, context {ctx}, {a.malformed_share:.0%} malformed", flush=True)

    if a.warmup_minutes <= 0:
        warm_end()
    with GpuSampler(interval_s=5.0) as gpu:
        drain = asyncio.run(run_load(
            srv.url, plan.next, a.concurrency, a.minutes * 60, a.drain_timeout, tally, progress_s=30,
            on_tick=lambda: _save_progress(a, doc, tally, t0, gpu.memory_series(m0)),
            warmup_s=a.warmup_minutes * 60, warm_tally=warm,
            on_warm_end=warm_end))
    mem_before = mem["before"]
    elapsed = time.time() - t0 - a.warmup_minutes * 60
    time.sleep(5)
    mem_after = _memory_mib()
    after = Tally()
    asyncio.run(run_load(srv.url, None, 1, 0, 120, after, fixed=[plan.wellformed("generate", 32, 8)]))
    drift = _results.ratio(abs(mem_after - mem_before) * 100, mem_before, 3) if mem_before and mem_after else None
    doc.pop("partial", None)
    doc.update({
        "soak": {"minutes": a.minutes, "elapsed_s": round(elapsed, 1), "drain_s": round(drain, 1),
                 "concurrency": a.concurrency, "malformed_share": a.malformed_share, "seed": a.seed,
                 "context_len": ctx, "max_prompt_len": plan.limit,
                 "prompt_len": _dist(tally.prompt_lens, 0), "max_tokens": _dist(tally.output_lens, 0),
                 "completion_tokens": tally.completion_tokens, "connection_errors": tally.connection_errors},
        "warmup": {"burst": {"sent": sum(burst_tally.sent.values()), "ok": sum(burst_tally.ok.values()),
                             "failures": dict(burst_tally.examples)},
                   "minutes": a.warmup_minutes, "wellformed": warm.summary(False), "malformed": warm.summary(True)},
        "wellformed": {**tally.summary(False), "latency_s": _dist(tally.latency_s)},
        "malformed": tally.summary(True),
        "memory_mib": {"ready": mem_ready, "before": mem_before, "before_at_s": mem["before_at_s"],
                       "after": mem_after, "drift_pct": drift,
                       "drift_vs_ready_pct": _results.ratio(abs(mem_after - mem_ready) * 100, mem_ready, 3)
                       if mem_ready and mem_after else None,
                       "series": gpu.memory_series(m0)},
        "gpu": gpu.summary,
        "server_alive_after": srv.alive(), "health_after": _health(srv.url),
        "request_after_ok": sum(after.ok.values()) == 1,
    })


def finish(a, doc: dict) -> None:
    """Targets, save, print. A soak that did not finish keeps its partial figures and unmet targets."""
    doc["device"] = device_name()
    doc["generated"] = _results.utc_now()
    if "soak" in doc:
        doc["targets"] = compute_targets(doc)
    else:
        doc["targets"] = _unmet("soak did not finish")
    _save(a, doc)
    print(f"[soak] wrote {_out(a)}")
    for k, v in doc["targets"].items():
        print(f"  {k}: {v['value']} (target {v['target']}) {'met' if v['met'] else 'NOT met'}")
    if "malformed" in doc:
        print(json.dumps({"malformed": doc["malformed"]["by_kind"]}, indent=1)[:3000])


def main(argv=None) -> int:
    a = parse_args(argv)
    setup.offline_env()
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="soak_"))
    model = setup.prepare_model(a.model_dir, a.layers)
    flags = soak_flags(a)
    doc = new_doc(a, model, a.config, flags)
    try:
        srv = setup.start_server(a.config, a.model_dir, flags, workdir, a.startup_timeout)
    except launcher.ServerError as e:
        doc["server"]["error"] = str(e)[-3000:]
        doc["targets"] = _unmet("server must start")
        _save(a, doc)
        raise SystemExit(f"[soak] the server did not start; wrote {_out(a)}\n{e}")
    doc["server"]["ready_s"] = round(srv.ready_seconds, 1)
    try:
        run_soak(a, srv, model, doc)
    finally:
        shut = srv.stop()
        doc["server"]["shutdown"] = {"clean": shut.clean, "seconds": round(shut.seconds, 1), "killed": shut.killed}
        if a.copy_to:
            os.makedirs(a.copy_to, exist_ok=True)
            Path(a.copy_to, f"soak-{a.tag}.server.log").write_text(launcher.log_tail(srv.log_path, 400))
        finish(a, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

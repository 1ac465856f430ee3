#!/usr/bin/env python3
"""How many streamed tokens per second upstream's bench_serving client can take in on this machine.

A synthetic server stands in for sglang: a decode loop that every --step-ms sends each running
stream its next chunk, shaped like sglang 0.5.16's native /generate stream (the whole text so
far, output_ids and meta_info in every chunk). The real client (`python -m
sglang.benchmark.serving`, the command bench_serving_matrix.py runs) reads it at --concurrency.
If the client keeps up, its output tok/s equals the offered rate (concurrency / step) and its
TPOT equals the step; where it falls behind, that is the client's ceiling on this CPU. No GPU.

    python benchmarks/client_ceiling.py                      # 1024 streams, 50 ms steps (the H200 run)
    python benchmarks/client_ceiling.py --concurrency 256 --step-ms 20

The H200 serving run of 2026-12-01 measured ~8.7-8.9k tok/s at its client against 19.8k tok/s at
the scheduler (docs/serving-bench.md, "Client limits"); this tells whether the client or the
server's HTTP side set that figure. The server's own step rate is printed too: on a small machine
the synthetic server competes with the client for the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import _results
import _serving_client as client
from _serving_report import FAST_VS_BS256, last_record, value

from sglang.sm120 import launcher

KEEPS_UP = 0.95  # client tok/s / offered tok/s
# What the client must carry for the 1.15x serving target at concurrency 1024 to be measurable:
# 1.15 x upstream's output tok/s there in this H200 run.
SERVING_RUN = _results.RESULTS / "serving-h200.json.gz"  # the serving result of record

SERVER = textwrap.dedent(r'''
    import asyncio, json, sys
    from aiohttp import web
    port, step = int(sys.argv[1]), float(sys.argv[2]) / 1000
    state = {"tick": None, "steps": 0}

    def chunk(prompt_len, n, k):
        meta = {"id": "0" * 32, "finish_reason": {"type": "length", "length": n} if k == n else None,
                "prompt_tokens": prompt_len, "weight_version": "default", "total_retractions": 0,
                "completion_tokens": k, "cached_tokens": 0, "e2e_latency": 1.25}
        return b"data: " + json.dumps({"text": "word " * k, "output_ids": list(range(k)), "meta_info": meta}).encode() + b"\n\n"

    async def decode_loop():
        while True:
            await asyncio.sleep(step)
            done, state["tick"] = state["tick"], asyncio.Event()
            state["steps"] += 1
            done.set()

    async def generate(request):
        body = await request.json()
        n, prompt_len = body["sampling_params"]["max_new_tokens"], len(body.get("input_ids") or [])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for k in range(1, n + 1):
            await state["tick"].wait()
            await resp.write(chunk(prompt_len, n, k))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def ok(request):
        return web.json_response({"data": [{"id": "synthetic"}], "internal_states": []})

    async def main():
        state["tick"] = asyncio.Event()
        asyncio.create_task(decode_loop())
        app = web.Application()
        app.router.add_post("/generate", generate)
        for path in ("/v1/models", "/server_info", "/get_server_info", "/health"):
            app.router.add_get(path, ok)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        print("READY", flush=True)
        t0, s0 = asyncio.get_running_loop().time(), 0
        while True:
            await asyncio.sleep(2)
            now = asyncio.get_running_loop().time()
            print(f"STEPS {(state['steps'] - s0) / (now - t0):.2f}", flush=True)
            t0, s0 = now, state["steps"]

    asyncio.run(main())
''')


def measure(concurrency: int, step_ms: float, output_len: int, waves: int, workdir: Path, timeout: float) -> dict:
    from sglang.sm120.tiny import tokenizer as tok_mod

    model = workdir / "tokenizer"
    model.mkdir(parents=True, exist_ok=True)
    tok_mod.save_tokenizer_files(tok_mod.build_tokenizer(512), str(model), 4096)
    port = launcher.free_port()
    log = open(workdir / "server.log", "w+")
    srv = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(step_ms)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 30
        while "READY" not in Path(log.name).read_text():
            if srv.poll() is not None or time.time() > deadline:
                raise SystemExit(f"synthetic server did not start:\n{Path(log.name).read_text()[-2000:]}")
            time.sleep(0.2)
        out = workdir / "client.jsonl"
        cmd = client.command(port, str(model), "synthetic", concurrency, waves * concurrency, out,
                             input_len=16, output_len=output_len, seed=1)
        t0 = time.time()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise SystemExit(f"bench_serving failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-2000:]}")
        rec = last_record(out)
    finally:
        srv.terminate()
        srv.wait(timeout=10)
    steps = [float(ln.split()[1]) for ln in Path(log.name).read_text().splitlines() if ln.startswith("STEPS ")]
    offered = concurrency * 1000.0 / step_ms
    return {"concurrency": concurrency, "step_ms": step_ms, "output_len": output_len, "prompts": waves * concurrency,
            "offered_tok_s": round(offered, 1), "client_output_tok_s": round(rec["output_throughput"], 1),
            "client_vs_offered": round(rec["output_throughput"] / offered, 3),
            "client_mean_tpot_ms": round(rec["mean_tpot_ms"], 2),
            "server_steps_per_s_median": sorted(steps)[len(steps) // 2] if steps else None,
            "wall_s": round(time.time() - t0, 1), "cpus": os.cpu_count(), "command": " ".join(cmd)}


def needed_tok_s(serving_json: Path):
    """1.15 x upstream_bs256's output tok/s at concurrency 1024 in serving_json, or None."""
    if not serving_json.exists():
        return None
    upstream = value(_results.load(serving_json, {}), "upstream_bs256", 1024)
    return round(FAST_VS_BS256 * upstream, 1) if upstream else None


def targets(r: dict, needed) -> dict:
    return {
        "client_keeps_up_with_offered": _results.target(r["client_vs_offered"], f">= {KEEPS_UP}",
                                                        lambda v: v >= KEEPS_UP),
        "client_carries_the_c1024_serving_target": _results.target(
            r["client_output_tok_s"] if needed else None,
            f">= {needed} tok/s (1.15 x upstream at concurrency 1024, {SERVING_RUN.name})" if needed
            else f"1.15 x upstream at concurrency 1024 (no figure in {SERVING_RUN.name})",
            lambda v: v >= needed),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=1024)
    ap.add_argument("--step-ms", type=float, default=50.0, help="the synthetic decode step (50 ms: the H200's at 1023 requests)")
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", default=None, help="also write the result as JSON here")
    a = ap.parse_args(argv)
    if a.concurrency < 1 or a.step_ms <= 0 or a.output_len < 2 or a.waves < 1:
        ap.error("--concurrency >= 1, --step-ms > 0, --output-len >= 2 and --waves >= 1 are required")
    with tempfile.TemporaryDirectory(prefix="client_ceiling_") as d:
        r = measure(a.concurrency, a.step_ms, a.output_len, a.waves, Path(d), a.timeout)
    r["targets"] = targets(r, needed_tok_s(SERVING_RUN))
    print(json.dumps(r, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

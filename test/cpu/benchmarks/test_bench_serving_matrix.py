"""The serving benchmark and the soak without a GPU (sections below); servers are local or sglang's real app."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import sys
from argparse import Namespace

import pytest

import _gpu_sampler
import _serving_report as report
import _soak_cases as cases
import bench_serving_matrix as matrix
import soak


def upstream_record(completed=512, output_tps=9000.0, **over) -> dict:
    """A JSONL line as sglang 0.5.16's benchmark/serving.py writes it (its `result` dict)."""
    rec = dict(
        tag=None, backend="sglang", dataset_name="random-ids", request_rate=float("inf"), max_concurrency=256,
        sharegpt_output_len=None, random_input_len=256, random_output_len=256, random_range_ratio=1.0,
        server_info={"max_total_num_tokens": 1050000, "cuda_graph_config": {"decode": {"max_bs": 256}}},
        duration=14.6, completed=completed, total_input_tokens=131072, total_input_text_tokens=131072,
        total_input_vision_tokens=0, total_output_tokens=131072, total_output_tokens_retokenized=129000,
        request_throughput=35.1, input_throughput=8977.5, output_throughput=output_tps,
        total_throughput=output_tps * 2, concurrency=250.1, accept_length=None, max_output_tokens_per_s=10500.0,
        max_concurrent_requests=256)
    for metric, values in (("e2e_latency", (7100, 7050, 90, 7200, 7250, 7300)),
                           ("ttft", (900, 850, 300, 1300, 1400, 1500)), ("tpot", (24, 24.1, 1, 25, 25.5, 26)),
                           ("itl", (24, 23.8, 3, 26, 28, 41))):
        stats = ("mean", "median", "std", "p90", "p95", "p99")
        rec.update({f"{stat}_{metric}_ms": float(v) for stat, v in zip(stats, values)})
    rec.update(over)
    return rec


def _cell(output_tps, conc, completed=None):
    n = matrix.num_prompts(conc)
    c = report.parse_record(upstream_record(completed if completed is not None else n, output_tps), n)
    c["gpu"] = {"samples": 10, "power_w": {"median": 410.0, "max": 520.0, "mean": 400.0}}
    return c


def _doc(cells: dict) -> dict:
    """cells: {config: {concurrency: output tok/s or a ready cell}}"""
    runs = {name: {"server": {"flags": ["--x"], "ready_s": 100.0, "facts": {}},
                   "cells": {str(c): (v if isinstance(v, dict) else _cell(v, c)) for c, v in by_conc.items()}}
            for name, by_conc in cells.items()}
    return {"tag": "t", "runs": runs, "commit": "abc123", "device": "NVIDIA H200",
            "model": {"description": "Qwen3-30B-A3B shapes"}, "workload": {"description": "256+256"}}


def _save_tokenizer(folder):
    from sglang.sm120.tiny import tokenizer as tok_mod

    folder.mkdir(exist_ok=True)
    tok_mod.save_tokenizer_files(tok_mod.build_tokenizer(512), str(folder), 4096)


@pytest.fixture
def no_nvidia_smi(monkeypatch):
    monkeypatch.setattr(_gpu_sampler, "QUERY", ["/nonexistent/nvidia-smi"])


def _fake_setup(monkeypatch, setup, model, facts, port, ready_s, log_path, **stop):
    """The launcher faked: a prepared model, a live server at `port` and its facts."""
    srv = Namespace(port=port, url=f"http://127.0.0.1:{port}", ready_seconds=ready_s, log_path=log_path,
                    alive=lambda: True, stop=lambda: Namespace(clean=True, **stop))
    monkeypatch.setattr(setup, "prepare_model", lambda d, layers: {**model, "dir": d})
    monkeypatch.setattr(setup, "start_server", lambda *a, **k: srv)
    monkeypatch.setattr(setup, "server_facts", lambda url: facts)


# ---- bench_serving output

def test_last_record_and_parse_keep_upstream_fields(tmp_path):
    f = tmp_path / "run.jsonl"
    f.write_text(json.dumps(upstream_record(output_tps=1.0)) + "\n" + json.dumps(upstream_record()) + "\n\n")
    cell = report.parse_record(report.last_record(f), 512)
    assert cell["output_throughput"] == 9000.0 and cell["total_throughput"] == 18000.0
    assert (cell["median_ttft_ms"], cell["p99_ttft_ms"], cell["median_itl_ms"], cell["p99_itl_ms"]) == (850.0, 1500.0, 23.8, 41.0)
    assert cell["complete"] is True and cell["num_prompts"] == 512
    assert "server_info" not in cell  # the server's whole argument dump is not copied per cell


def test_parse_record_refuses_a_record_without_the_reported_metrics():
    rec = upstream_record()
    del rec["p99_itl_ms"]
    with pytest.raises(ValueError, match="p99_itl_ms"):
        report.parse_record(rec, 512)


def test_incomplete_or_failed_cells_are_not_measurements():
    doc = _doc({"layerwise": {256: _cell(9000.0, 256, completed=500)}, "upstream_default": {256: {"error": "boom"}}})
    assert report.value(doc, "layerwise", 256) is None
    assert report.value(doc, "upstream_default", 256) is None


def test_bench_command_needs_no_download_and_gives_exact_lengths(tmp_path, monkeypatch):
    """Through upstream's own parser and loader, offline: token-id prompts of exactly --random-input-len,
    no ShareGPT file (the `random` mode would download one)."""
    import sglang.benchmark.serving as serving
    from sglang.benchmark.datasets import DATASET_MAPPING
    from transformers import AutoTokenizer

    cmd = matrix.bench_command(30000, "/m", "layerwise", 10, 20, tmp_path / "o.jsonl")
    assert cmd[1:3] == ["-m", "sglang.benchmark.serving"]
    parsed = {}
    monkeypatch.setattr(serving, "run_benchmark", lambda args: parsed.update(vars(args)))
    monkeypatch.setattr(sys, "argv", ["serving"] + cmd[3:])
    serving.cli_main()
    ns = Namespace(**parsed)
    assert (ns.backend, ns.dataset_name, ns.tokenize_prompt, ns.dataset_path) == ("sglang", "random-ids", True, "")
    assert (ns.random_range_ratio, ns.max_concurrency, ns.num_prompts, ns.seed) == (1.0, 10, 20, matrix.SEED)
    assert (ns.temperature, ns.disable_ignore_eos, ns.tokenizer) == (0.0, False, "/m")
    _save_tokenizer(tmp_path)
    ns.tokenizer = str(tmp_path)
    rows = DATASET_MAPPING[ns.dataset_name].from_args(ns).load(AutoTokenizer.from_pretrained(ns.tokenizer))
    assert len(rows) == 20
    assert all(isinstance(r.prompt, list) and len(r.prompt) == matrix.INPUT_LEN == r.prompt_len for r in rows)
    assert all(r.output_len == matrix.OUTPUT_LEN for r in rows)


class _LocalSglang:
    """sglang 0.5.16's answers on the routes the benchmark and the soak use, from a thread of its own.
    Like upstream, it serves an unknown `model` anyway."""

    def __init__(self, context_len: int = 4096, hang_len: int = -1):
        import threading

        self.port, self.requests, self.ctx, self.hang_len = None, [], context_len, hang_len
        self._ready, self.release = threading.Event(), threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()
        assert self._ready.wait(20)

    def _serve(self):
        from aiohttp import web

        def error(msg):
            return web.json_response({"object": "error", "message": msg, "code": 400}, status=400)

        async def body_of(request):
            try:
                return await request.json()
            except ValueError:
                return None

        async def generate(request):
            body = await body_of(request)
            if body is None or not isinstance(body.get("text", ""), str):
                return error("1 validation error: JSON decode error / Input should be a valid string")
            self.requests.append(body)
            ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
            while len(ids) == self.hang_len and not self.release.is_set():  # a prompt left unanswered
                await asyncio.sleep(0.05)
            if n < 0:
                return error(f"max_new_tokens must be at least 0, got {n}.")
            if len(ids) >= self.ctx:
                return error(f"The input ({len(ids)} tokens) is longer than the model's context length")
            events = [_meta(len(ids), k, "length" if k == n else None, "w" * k) for k in range(1, n + 1)]
            if not body.get("stream", True):
                return web.json_response(events[-1])
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for event in events:
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                await asyncio.sleep(0.001)
            await resp.write(b"data: [DONE]\n\n")
            return resp

        async def completions(request):
            body = await body_of(request)
            if body is None or not isinstance(body.get("max_tokens", 16), int):
                return error("1 validation error: JSON decode error / Input should be a valid integer")
            n, prompt = body.get("max_tokens", 16), body.get("prompt") or body.get("messages")
            if n < 0:
                return error(f"max_new_tokens must be at least 0, got {n}.")
            if len(prompt) >= self.ctx:
                return error("The input is longer than the model's context length")
            return web.json_response({"choices": [{"text": "w", "finish_reason": "length"}],
                                      "usage": {"prompt_tokens": len(prompt), "completion_tokens": n}})

        async def ok(request):
            return web.json_response({"data": [{"id": "layerwise"}], "internal_states": []})

        async def main():
            app = web.Application()
            app.add_routes([web.post("/generate", generate), web.post("/v1/completions", completions),
                            web.post("/v1/chat/completions", completions),
                            *(web.get(path, ok) for path in ("/v1/models", "/server_info", "/health"))])
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]
            self._ready.set()
            await asyncio.Event().wait()

        asyncio.run(main())


@pytest.mark.parametrize("procs, stream", [(1, True), (2, True), (1, False)])
def test_a_cell_runs_upstreams_client_and_parses_what_it_writes(tmp_path, no_nvidia_smi, procs, stream):
    """upstream's real client against a local server (once, two clients merged, or unstreamed), its JSONL
    parsed into a cell, the server log's decode lines into server_decode."""
    _save_tokenizer(model := tmp_path / "model")
    local = _LocalSglang()
    now = dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    log = tmp_path / "server.log"
    log.write_text("".join(f"[{now}] Decode batch, #running-req: {r}, #token: 9, token usage: 0.00, cuda graph: True, "
                           f"gen throughput (token/s): {g}, #queue-req: 0\n" for r, g in ((4, 10.0), (4, 300.0), (4, 500.0), (1, 9e9))))
    srv = Namespace(port=local.port, alive=lambda: True, log_path=str(log))
    a = Namespace(waves=2, input_len=32, output_len=8, seed=1, cell_timeout=240, client_procs=procs, stream=stream)
    cell = matrix.run_cell(srv, str(model), "layerwise", 4, a, tmp_path)
    assert "error" not in cell, cell.get("error")
    assert cell["completed"] == cell["num_prompts"] == 8 and cell["complete"]
    assert cell["output_throughput"] > 0 and cell["total_throughput"] > cell["output_throughput"]
    assert (cell["client_procs"], cell["streamed"]) == (procs, stream)
    if stream:
        assert cell["median_itl_ms"] > 0 and cell["p99_ttft_ms"] >= cell["median_ttft_ms"] > 0
    else:
        assert cell["median_itl_ms"] is None and cell["median_ttft_ms"] is None
    # the first line after a pause is dropped; the line with 1 request is under 0.9 x 4 running
    assert cell["server_decode"] == {"median_tok_s": 400.0, "max_tok_s": 500.0, "lines": 2, "min_running": 3}
    assert cell["gpu"]["power_w"].startswith("not readable")
    measured = [r for r in local.requests if r["sampling_params"]["max_new_tokens"] == 8]
    assert len(measured) >= 8 and all(len(r["input_ids"]) == 32 for r in measured)
    if procs > 1:  # each client its own seed: distinct prompts (each client also sends its first once as a test)
        assert len(cell["clients"]) == 2 and sum(c["completed"] for c in cell["clients"]) == 8
        assert len({tuple(r["input_ids"]) for r in measured}) == cell["num_prompts"]
    assert all(r["sampling_params"]["ignore_eos"] and r["sampling_params"]["temperature"] == 0 for r in measured)


def test_prompt_counts_are_bounded_per_concurrency():
    assert [matrix.num_prompts(c) for c in report.CONCURRENCY] == [8, 20, 512, 2048]


def test_time_budget_shortens_the_cell_timeout_and_orders_the_key_cells_first():
    a = matrix.parse_args(["--time-budget", "420", "--cell-timeout", "300"])
    assert a.concurrency == [1024, 256, 10, 1]
    assert [matrix.cell_timeout(a, elapsed) for elapsed in (0, 400, 560)] == [300, 170, 60]
    assert matrix.cell_timeout(matrix.parse_args([]), 10_000) == 300
    with pytest.raises(SystemExit):
        matrix.parse_args(["--concurrency", "0"])


# ---- targets

UPSTREAM_DEFAULT = {1: 100.0, 10: 900.0, 256: 8000.0, 1024: 9000.0}


def test_targets_met():
    doc = _doc({"upstream_default": UPSTREAM_DEFAULT,
                "upstream_bs256": {1024: 9100.0},
                "layerwise": {1: 99.0, 10: 880.0, 256: 8100.0, 1024: 12000.0}})
    t = report.compute_targets(doc)
    assert t["output_tps_c1024_layerwise_vs_upstream_bs256"] == {"value": 1.3187, "target": ">= 1.15", "met": True}
    assert t["output_tps_c10_layerwise_vs_upstream_default"] == {"value": 0.9778, "target": ">= 0.97", "met": True}
    assert all(v["met"] for v in t.values())
    doc["targets"] = t
    assert report.missed(doc) == []


def test_targets_missed_say_why():
    doc = _doc({"upstream_default": {1: 100.0, 10: 900.0, 1024: 9000.0},
                "upstream_bs256": {1024: 9000.0},
                "layerwise": {1: 90.0, 10: {"error": "bench_serving exit 1"}, 256: 8000.0, 1024: 10000.0}})
    doc["targets"] = t = report.compute_targets(doc)
    assert t["output_tps_c1024_layerwise_vs_upstream_bs256"] == {"value": 1.1111, "target": ">= 1.15", "met": False}
    assert t["output_tps_c1_layerwise_vs_upstream_default"] == {"value": 0.9, "target": ">= 0.97", "met": False}
    assert t["output_tps_c10_layerwise_vs_upstream_default"]["value"] is None
    why = "\n".join(report.missed(doc))
    assert "measured 1.1111" in why and "measured 0.9 " in why
    assert "layerwise at concurrency 10 failed: bench_serving exit 1" in why
    assert "upstream_default at concurrency 256 not measured" in why
    assert "output_tps_c1024_layerwise_vs_upstream_default" not in why  # 10000/9000 is met


# ---- merging and reports

def test_merge_of_two_partial_files(tmp_path):
    for name, cells in (("a", {"upstream_default": {1: 100.0, 1024: 9000.0}, "upstream_bs256": {1024: 9000.0}}),
                        ("b", {"layerwise": {1: 100.0, 1024: 11000.0}}), ("c", {"layerwise": {1: 1.0}})):
        (tmp_path / f"serving-{name}.json").write_text(json.dumps(_doc(cells)))
    assert matrix.main(["--tag", "m", "--merge", "a", "b", "--results-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "serving-m.json").read_text())
    assert set(doc["runs"]) == {"upstream_default", "upstream_bs256", "layerwise"}
    t = doc["targets"]
    assert t["output_tps_c1024_layerwise_vs_upstream_bs256"] == {"value": 1.2222, "target": ">= 1.15", "met": True}
    assert t["output_tps_c256_layerwise_vs_upstream_default"]["met"] is False  # not measured
    assert t["output_tps_c1_layerwise_vs_upstream_default"]["met"] is True
    assert (tmp_path / "serving-m.md").exists() and (tmp_path / "serving-m.png").exists()
    with pytest.raises(SystemExit, match="already present"):
        matrix.main(["--tag", "m", "--merge", "c", "--results-dir", str(tmp_path)])


def test_invocations_with_config_subsets_accumulate_in_one_file(tmp_path, monkeypatch):
    """Two GPU-host commands: the second adds to the first's file."""
    _fake_setup(monkeypatch, matrix.setup, {"spec": {"layers": 48}, "bytes": 1}, {"max_total_num_tokens": 10**6},
                1, 42.0, "/dev/null", seconds=1.0)
    monkeypatch.setattr(matrix.setup, "kv_bytes_per_token", lambda d: 98304)
    speed = {"upstream_default": 9000.0, "layerwise": 12000.0}
    calls = []

    def fake_cell(srv, model_dir, name, conc, a, workdir, warmup=False, timeout=None):
        calls.append((name, conc, warmup))
        return {"wall_s": 1.0} if warmup else _cell(speed[name], conc)

    monkeypatch.setattr(matrix, "run_cell", fake_cell)
    common = ["--tag", "p", "--results-dir", str(tmp_path), "--workdir", str(tmp_path / "w"), "--concurrency", "1", "1024"]
    matrix.main(common + ["--configs", "upstream_default"])
    matrix.main(common + ["--configs", "layerwise", "--copy-to", str(tmp_path / "out")])
    doc = json.loads((tmp_path / "serving-p.json").read_text())
    assert set(doc["runs"]) == {"upstream_default", "layerwise"} and len(doc["invocations"]) == 2
    assert set(doc["runs"]["layerwise"]["cells"]) == {"1", "1024"}
    assert doc["targets"]["output_tps_c1024_layerwise_vs_upstream_default"]["value"] == 1.3333
    assert ("layerwise", 1024, True) in calls  # warm-up at the highest concurrency first
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "serving-p-layerwise.server.log", "serving-p.json", "serving-p.md", "serving-p.png"]
    with pytest.raises(SystemExit, match="--input-len"):
        matrix.main(common + ["--configs", "layerwise", "--input-len", "512"])
    with pytest.raises(SystemExit, match="--server-args"):  # a wider streaming path is another experiment
        matrix.main(common + ["--configs", "layerwise", "--server-args", "--tokenizer-worker-num 4"])


def test_plot_only_redraws_png_and_md(tmp_path):
    doc = _doc({"upstream_default": UPSTREAM_DEFAULT,
                "upstream_bs256": {1: 101.0, 10: 905.0, 256: 8050.0, 1024: 9050.0},
                "layerwise": {1: 98.0, 10: 880.0, 256: 8100.0, 1024: 9500.0}})
    doc["runs"]["upstream_bs256"]["server"]["facts"] = {
        "max_total_num_tokens": 1050000,
        "cuda_graph_config": {"decode": {"backend": "full", "max_bs": 256, "bs": list(range(1, 37))},
                              "prefill": {"backend": "breakable", "max_bs": 8192, "bs": list(range(58))}}}
    path = tmp_path / "serving-x.json"
    path.write_text(json.dumps(doc))
    assert matrix.main(["--plot-only", str(path)]) == 0
    png = (tmp_path / "serving-x.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    md = (tmp_path / "serving-x.md").read_text()
    assert "| layerwise | 1024 | 2048/2048 | 9,500.0 | 19,000.0 | 850.0 / 1,500.0 | 23.80 / 41.00 | 410 / 520 |" in md
    assert "| output_tps_c1024_layerwise_vs_upstream_bs256 | 1.0497 | >= 1.15 | NO |" in md
    assert "measured 1.0497" in md
    assert "; 1 bench_serving client per cell, streamed." in md
    assert "decode full max_bs 256 (36 sizes); prefill breakable max_bs 8192 (58 sizes); KV pool 1,050,000 tokens" in md
    assert json.loads(path.read_text())["targets"]["output_tps_c1024_layerwise_vs_upstream_bs256"]["met"] is False
    with pytest.raises(SystemExit, match="does not exist"):
        matrix.main(["--plot-only", str(tmp_path / "nope.json")])
    doc["workload"].update(client_procs=4, server_args="--tokenizer-worker-num 4")
    path.write_text(json.dumps(doc))
    matrix.main(["--plot-only", str(path)])
    assert ("4 bench_serving clients per cell, streamed, every server also given --tokenizer-worker-num 4."
            in (tmp_path / "serving-x.md").read_text())


# ---- GPU sampler

@pytest.mark.parametrize("text, want", [
    ("312.45, 40123\n", (312.45, 40123.0)),
    ("[N/A], 1024\n", (None, 1024.0)),
    ("power.draw [W], memory.used [MiB]\n95.30 W, 81559 MiB\n", (95.3, 81559.0)),
])
def test_nvidia_smi_csv(text, want):
    assert _gpu_sampler.parse_csv(text) == want


def test_power_not_readable_is_reported_not_raised(no_nvidia_smi):
    with _gpu_sampler.GpuSampler(interval_s=0.01) as s:
        pass
    assert s.summary["power_w"].startswith("not readable (nvidia-smi:")
    assert _gpu_sampler.summarize([(None, 100.0), (None, 120.0)], None)["power_w"].startswith("not readable")
    assert _gpu_sampler.summarize([(300.0, 1.0), (500.0, 2.0)], None)["power_w"] == {"median": 400.0, "max": 500.0, "mean": 400.0}


# ---- malformed catalogue

CTX = 4096


def _plan(share=0.02, seed=0):
    return cases.RequestPlan(seed, CTX, 512, "layerwise", share)


@pytest.mark.parametrize("name", list(cases.MALFORMED))
def test_each_malformed_case_carries_its_defect(name):
    req = _plan().malformed(name)
    assert req.malformed and req.path in ("/generate", "/v1/completions", "/v1/chat/completions")
    if name.startswith("bad_json"):
        with pytest.raises(ValueError):
            json.loads(req.body)
        return
    body = json.loads(req.body)
    if name.startswith("negative"):
        assert min(body.get("max_tokens", 0), body.get("sampling_params", {}).get("max_new_tokens", 0)) < 0
    elif name.startswith("unknown_model"):
        assert body["model"] != "layerwise" and body["model"]
    elif name.startswith("prompt_over_context"):
        assert len(body.get("input_ids") or body["prompt"]) > CTX
    elif name.startswith("wrong_types"):
        assert isinstance(body.get("max_tokens", 0), str) or not isinstance(body.get("text", ""), (str, list))
    else:
        pytest.fail(f"no check for {name}")


@pytest.fixture(scope="module")
def sglang_app():
    """sglang's real FastAPI app (no model behind it): enough for what it rejects before a handler runs."""
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server

    return TestClient(http_server.app, raise_server_exceptions=False)


@pytest.mark.parametrize("name", cases.VALIDATION_LAYER)
def test_validation_layer_cases_get_400_with_a_message_from_sglang(sglang_app, name):
    req = _plan().malformed(name)
    r = sglang_app.post(req.path, content=req.body, headers=req.headers)
    verdict = cases.judge_malformed(r.status_code, r.text)
    assert verdict.ok, verdict.why
    assert r.status_code == 400 and cases.error_message(r.text)


@pytest.mark.parametrize("status, body, ok", [
    (400, json.dumps({"object": "error", "message": "max_new_tokens must be at least 0", "code": 400}), True),
    (400, json.dumps({"error": {"message": "The input (4112 tokens) is longer than the model's context length"}}), True),
    (404, json.dumps({"detail": "The model `x` does not exist."}), True),
    (200, json.dumps({"choices": [{"text": "x", "finish_reason": "length"}]}), False),   # unknown model served anyway
    (500, json.dumps({"message": "Internal server error"}), False),
    (400, "", False),
    (400, json.dumps({"error": {"message": ""}}), False),
    (0, "connection error: ServerDisconnectedError()", False),
])
def test_malformed_verdicts(status, body, ok):
    assert cases.judge_malformed(status, body).ok is ok


# ---- well-formed verdicts

def _gen_req(prompt=10, max_tokens=5, kind="generate"):
    return cases.Request(kind, "/generate", b"{}", kind == "generate_stream", prompt, max_tokens)


def _meta(pt, ct, fr="length", text="x"):
    fr = {"type": "length", "length": ct} if fr == "length" else fr
    return {"text": text, "meta_info": {"prompt_tokens": pt, "completion_tokens": ct, "finish_reason": fr}}


@pytest.mark.parametrize("doc, ok", [
    (_meta(10, 5), True),
    (_meta(10, 2, {"type": "stop", "matched": 2}), True),
    (_meta(10, 4), False),  # length stop before the limit
    (_meta(9, 5), False),  # prompt tokens differ from what was sent
    (_meta(10, 5, {"type": "abort", "message": "x"}), False),
    (_meta(10, 5, None), False),
])
def test_generate_verdicts(doc, ok):
    assert cases.judge_wellformed(_gen_req(), 200, json.dumps(doc)).ok is ok


def test_stream_and_completions_verdicts():
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in [_meta(10, 1, None), _meta(10, 5)])
    req = _gen_req(kind="generate_stream")
    assert cases.judge_wellformed(req, 200, stream + "data: [DONE]\n\n").ok
    assert not cases.judge_wellformed(req, 200, stream).ok  # cut off before [DONE]
    err = 'data: {"error": {"message": "boom", "code": 400}}\n\ndata: [DONE]\n\n'
    assert "error event" in cases.judge_wellformed(req, 200, err).why
    comp = cases.Request("completions", "/v1/completions", b"{}", False, 10, 5)
    good = {"choices": [{"finish_reason": "length"}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    assert cases.judge_wellformed(comp, 200, json.dumps(good)).ok
    assert not cases.judge_wellformed(comp, 503, "overloaded").ok


# ---- the request mix

def test_plan_is_deterministic_covers_every_case_and_stays_inside_the_context():
    seq_a, seq_b = ([p.next() for _ in range(3000)] for p in (_plan(seed=3), _plan(seed=3)))
    assert [(r.kind, r.body) for r in seq_a] == [(r.kind, r.body) for r in seq_b]
    c = _plan(seed=4)
    assert [r.body for r in seq_a[:50]] != [c.next().body for _ in range(50)]
    bad = [r for r in seq_a if r.malformed]
    assert 0.01 < len(bad) / len(seq_a) < 0.03
    assert {r.kind for r in bad} == set(cases.MALFORMED)
    good = [r for r in seq_a if not r.malformed]
    assert {r.kind for r in good} == {"generate", "generate_stream", "completions"}
    assert all(1 <= r.prompt_len and r.prompt_len + r.max_tokens <= CTX - cases.CONTEXT_MARGIN for r in good)
    assert min(r.prompt_len for r in good) <= 2 and max(r.prompt_len for r in good) > 0.8 * CTX
    for r in good[:50]:
        body = json.loads(r.body)
        assert len(body.get("input_ids") or body["prompt"]) == r.prompt_len


def test_plan_honours_a_lower_scheduler_input_cap():
    p = cases.RequestPlan(0, 40960, 512, "m", 0.0, max_input_len=2000)
    assert all(r.prompt_len + r.max_tokens <= 2000 - cases.CONTEXT_MARGIN for r in (p.next() for _ in range(500)))


# ---- the soak loop

def test_load_loop_judges_answers_and_counts_requests_cut_off_at_the_drain_timeout(capsys):
    """The local server leaves a 13-token prompt unanswered until the load loop has given up on it."""
    local = _LocalSglang(hang_len=13)
    plan = _plan(share=0.0)
    # 3 loops take every 3rd request: loop 1 sends the malformed one, then the one that hangs
    reqs = [plan.wellformed("generate", 5, 3), plan.malformed("bad_json_openai"),
            plan.wellformed("generate", 7, 3), plan.wellformed("generate", 9, 3),
            plan.wellformed("generate", 13, 3)]
    tally = soak.Tally()
    drain = asyncio.run(soak.run_load(f"http://127.0.0.1:{local.port}", None, 3, 0, 1.5, tally, fixed=reqs,
                                      progress_s=0.5))
    local.release.set()
    wf, mf = tally.summary(False), tally.summary(True)
    assert (wf["sent"], wf["ok"], wf["unfinished_at_drain_timeout"]) == (4, 3, 1)
    assert (mf["sent"], mf["ok"]) == (1, 1) and "bad_json" in mf["cases_never_sent"]
    assert 1.4 < drain < 5
    assert "answered (0 failed), 1 in flight" in capsys.readouterr().out


def _soak_doc(**over):
    doc = {"wellformed": {"sent": 1000, "ok": 1000}, "malformed": {"sent": 20, "ok": 20},
           "memory_mib": {"drift_pct": 0.2}, "server_alive_after": True, "health_after": True,
           "request_after_ok": True}
    doc.update(over)
    return doc


def test_soak_targets_met_and_missed():
    t = soak.compute_targets(_soak_doc())
    assert all(v["met"] for v in t.values()) and t["server_crashes"]["value"] == 0
    t = soak.compute_targets(_soak_doc(malformed={"sent": 20, "ok": 18}, memory_mib={"drift_pct": 1.7},
                                       health_after=False, wellformed={"sent": 1000, "ok": 999}))
    assert not any(v["met"] for v in t.values())
    assert t["malformed_answered_4xx_with_message"]["value"] == 0.9
    assert t["wellformed_completed"]["value"] == 0.999 and t["server_crashes"]["value"] == 1
    t = soak.compute_targets(_soak_doc(malformed={"sent": 0, "ok": 0}, memory_mib={"drift_pct": None}))
    assert t["malformed_answered_4xx_with_message"] == {"value": None, "target": "== 1.0 (all 4xx with a message)", "met": False}
    assert not t["gpu_memory_drift_pct"]["met"]


def test_log_uniform_reaches_both_ends():
    rng = random.Random(0)
    xs = [cases.log_uniform(rng, 1, 40000) for _ in range(20000)]
    assert min(xs) == 1 and max(xs) > 30000 and sorted(xs)[len(xs) // 2] < 1000


def test_soak_end_to_end_against_a_local_server(tmp_path, monkeypatch, no_nvidia_smi):
    """soak.main against the local server; it serves unknown model names (as upstream 0.5.16 does),
    so that target is reported missed with the cases named."""
    local = _LocalSglang(context_len=2048)
    _fake_setup(monkeypatch, soak.setup, {"spec": {"max_position": 2048}, "tokenizer_vocab": 512},
                {"max_req_input_len": 2047}, local.port, 1.0, str(tmp_path / "log"), seconds=0.1, killed=False)
    (tmp_path / "log").write_text("server log line\n")
    monkeypatch.setattr(soak.time, "sleep", lambda s: None)
    args = "--tag t --minutes 0.05 --warmup-minutes 0.02 --concurrency 8 --malformed-share 0.3".split()
    assert soak.main(args + ["--results-dir", str(tmp_path), "--copy-to", str(tmp_path / "out")]) == 0
    doc = json.loads((tmp_path / "soak-t.json").read_text())
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["soak-t.json", "soak-t.server.log"]
    wf, mf, t = doc["wellformed"], doc["malformed"], doc["targets"]
    assert wf["sent"] > 20 and wf["ok"] == wf["sent"] and t["wellformed_completed"]["met"]
    assert set(wf["by_kind"]) == {"generate", "generate_stream", "completions"}
    assert doc["warmup"]["burst"]["ok"] == doc["warmup"]["burst"]["sent"] == 9 and doc["soak"]["max_prompt_len"] == 2047
    warm = doc["warmup"]["wellformed"]
    assert warm["sent"] > 0 and warm["ok"] == warm["sent"]  # the traffic warm-up ran, and its answers count
    mem = doc["memory_mib"]
    assert mem["before_at_s"] is not None and mem["before_at_s"] >= 0.9 and mem["series"] == []  # no nvidia-smi
    assert doc["soak"]["prompt_len"]["max"] <= 2047 - 8
    bad = {k: v for k, v in mf["by_kind"].items() if v["ok"] < v["sent"]}
    assert set(bad) <= {"unknown_model", "unknown_model_chat"} and bad
    assert all(f.startswith("HTTP 200 (want 4xx)") for v in bad.values() for f in v["failures"])
    assert not t["malformed_answered_4xx_with_message"]["met"]
    assert t["server_crashes"] == {"value": 0, "target": "== 0", "met": True}
    assert mem["drift_pct"] is None and not t["gpu_memory_drift_pct"]["met"]  # no nvidia-smi here

"""The seed's launch line on tiny GLM-5 (glm_moe_dsa) NVFP4: ready, greedy batches answered, no
Dynamo (GPU).

The server is started with GLM-5-NVFP4's recipe flags (`--enable-piecewise-cuda-graph
--piecewise-cuda-graph-compiler eager` plus the usual ones, LAUNCH_LINE) and the DSA flags of the
host (sglang.sm120.tiny.serving.dsa_flags), with SGLANG_SM120_TRAPS=log and a trap log: greedy /generate
batches of 1, 64 and 999 requests must all be answered with the requested token count, the server
must stay healthy and the trap log must stay empty. The traps only record (log), so one run names
every Dynamo entry and every subprocess after capture, split by kind in the results file, instead
of stopping at the first. Then the same model starts under upstream's
defaults (no graph flags) to record its time to ready beside ours.

Results: SGLANG_SM120_RESULTS_DIR/glm5-launch-line[-tpN].json with `targets` (and the two server
logs). SGLANG_SM120_TEST_LAUNCH_LINE replaces LAUNCH_LINE (shell syntax).
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import shlex
import time
import urllib.request
from pathlib import Path

import pytest
from tinymodels import TP, tiny_root  # noqa: F401 (fixture)

from sglang.sm120.launcher import Server, ServerError, request_json
from sglang.sm120.tiny.serving import DSA_ARCH, dsa_env, dsa_flags, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# GLM-5-NVFP4's published launch recipe, less what only the full model needs (tp 8, its path).
LAUNCH_LINE = [
    "--enable-piecewise-cuda-graph", "--piecewise-cuda-graph-compiler", "eager",
    "--quantization", "modelopt_fp4", "--trust-remote-code",
    "--mem-fraction-static", "0.7", "--max-running-requests", "1024",
]
BATCHES = (1, 64, 999)
NEW_TOKENS = 8
READY_TIMEOUT_S = 1500


def launch_line():
    raw = os.environ.get("SGLANG_SM120_TEST_LAUNCH_LINE")
    return shlex.split(raw) if raw is not None else list(LAUNCH_LINE)


def start(name: str, model_dir: Path, flags, env: dict, log_path: Path) -> Server:
    log_path.unlink(missing_ok=True)  # the log is read afterwards: no lines of an earlier run
    srv = Server(name=name, model_dir=str(model_dir), log_path=str(log_path),
                 args=["--tp-size", str(TP), "--skip-tokenizer-init"] + list(flags), env=env,
                 ready_path="/health_generate")
    srv.start()
    return srv


def greedy_batch(base: str, n: int, vocab: int) -> int:
    """n concurrent greedy requests of distinct prompts; returns how many came back complete."""
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    prompts = [[3 + (i * 7 + j * 13) % (vocab - 3) for j in range(16 + i % 48)] for i in range(n)]
    with cf.ThreadPoolExecutor(max_workers=min(n, 128)) as pool:
        outs = list(pool.map(lambda ids: request_json(base + "/generate", {"input_ids": ids, "sampling_params": params}, 600),
                             prompts))
    return sum(len(o["output_ids"]) == NEW_TOKENS for o in outs)


def test_seed_launch_line_serves_glm5_nvfp4_without_dynamo(tiny_root, tmp_path):
    model_dir = tiny_model(tiny_root, DSA_ARCH, "nvfp4")
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    out_dir = Path(os.environ.get("SGLANG_SM120_RESULTS_DIR") or tmp_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    tp = f"-tp{TP}" if TP > 1 else ""
    trap_log = tmp_path / "traps.jsonl"
    result = {"model": f"{DSA_ARCH}-nvfp4", "tp_size": TP, "launch_line": launch_line(),
              "dsa_flags": dsa_flags(), "dsa_env": dsa_env(), "batches": {}, "targets": {}}

    # ours: the launch line, traps recording
    env = dict(dsa_env(), SGLANG_SM120_TRAPS="log", SGLANG_SM120_TRAP_LOG=str(trap_log))
    ours_log = out_dir / f"glm5-launch-line-server{tp}.log"
    srv = start("glm5-launch-line", model_dir, launch_line() + dsa_flags(), env, ours_log)
    try:
        result["ready_s"] = round(srv.wait_ready(READY_TIMEOUT_S), 1)
        for n in BATCHES:
            t = time.time()
            result["batches"][n] = {"answered": greedy_batch(srv.url, n, vocab), "seconds": round(time.time() - t, 1)}
        with urllib.request.urlopen(srv.url + "/health_generate", timeout=60) as r:
            result["healthy_after"] = r.status == 200
    finally:
        srv.stop()
    server_log = ours_log.read_text() if ours_log.exists() else ""
    hits = [json.loads(ln) for ln in trap_log.read_text().splitlines()] if trap_log.exists() else []
    result["trap_hits"] = [{"kind": h["kind"], "what": h["what"][:300], "stack": h["stack"]}
                           for h in hits[:12]]
    result["trap_hits_by_kind"] = {k: sum(h["kind"] == k for h in hits) for k in sorted({h["kind"] for h in hits})}
    result["traps_armed"] = "traps armed" in server_log

    # upstream's defaults on the same model, for the time to ready
    up_log = out_dir / f"glm5-launch-line-upstream-defaults{tp}.log"
    up_flags = [f for f in launch_line() if f not in ("--enable-piecewise-cuda-graph",)]
    if "--piecewise-cuda-graph-compiler" in up_flags:  # alias of a tc_piecewise option: leave it out
        i = up_flags.index("--piecewise-cuda-graph-compiler")
        del up_flags[i:i + 2]
    srv = start("glm5-upstream-defaults", model_dir, up_flags + dsa_flags(), dsa_env(), up_log)
    try:
        result["upstream_defaults_ready_s"] = round(srv.wait_ready(READY_TIMEOUT_S), 1)
        result["upstream_defaults_batch1_answered"] = greedy_batch(srv.url, 1, vocab)
    except ServerError as e:
        result["upstream_defaults_error"] = str(e)
    finally:
        srv.stop()

    t = result["targets"]
    for n in BATCHES:
        got = result["batches"].get(n, {}).get("answered", 0)
        t[f"batch_{n}_answered"] = {"value": got, "target": n, "met": got == n}
    t["trap_hits"] = {"value": len(hits), "target": 0, "met": not hits}
    t["traps_armed"] = {"value": result["traps_armed"], "target": True, "met": result["traps_armed"]}
    t["ready_s"] = {"value": result.get("ready_s"), "target": "ready", "met": "ready_s" in result,
                    "upstream_defaults_ready_s": result.get("upstream_defaults_ready_s")}
    (out_dir / f"glm5-launch-line{tp}.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    assert all(v["met"] for v in t.values()), {k: v for k, v in t.items() if not v["met"]}
    assert "SM120_LAYERWISE_CAPTURE" in server_log

"""No Dynamo and no subprocess once capture begins: server start, capture and a mixed load run
under the traps in raise mode (tiny qwen3_moe and glm_moe_dsa (GLM-5, DSA indexer), bf16 and
NVFP4, GPU). glm_moe_dsa serves with the host's DSA flags (sglang.sm120.tiny.serving.dsa_flags), the others with
FlashInfer attention.

The server is started the way old launch scripts do it (`--enable-piecewise-cuda-graph`), with
SGLANG_SM120_TRAPS=raise and a trap log. A mixed load follows: concurrent requests of prompt
lengths 7..3000 (so some prefills exceed a bucket or the request slots and run eagerly), batch
sizes up to 400, greedy and sampled (top-k/top-p/min-p) decoding. The server must stay healthy,
every request must complete, and the trap log must stay empty.
SGLANG_SM120_GPU_MAX_TOKENS=N caps the server's KV pool at N tokens (as in
test_layerwise_correctness), so the test can run beside other engines on one GPU.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import random
import urllib.request
from pathlib import Path

import pytest
from tinymodels import EP, MAX_TOKENS, PARALLEL_SUFFIX, TP, tiny_root  # noqa: F401 (fixture)

from sglang.sm120.launcher import Server, request_json
from sglang.sm120.tiny.serving import DSA_ARCH, dsa_env, dsa_flags, tiny_model

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

MODELS = [("qwen3_moe", "bf16"), ("qwen3_moe", "nvfp4"), (DSA_ARCH, "bf16"), (DSA_ARCH, "nvfp4")]


def attention_flags(arch: str):
    return dsa_flags() if arch == DSA_ARCH else ["--attention-backend", "flashinfer"]


def mixed_load(base: str, vocab: int) -> int:
    rng = random.Random(7)
    jobs = []
    for wave, (concurrency, lens) in enumerate(
        [(1, [7]), (17, [7, 128]), (64, [128, 2000]), (400, [7, 33, 300]), (8, [3000]), (128, [2000])]
    ):
        for i in range(concurrency):
            plen = rng.choice(lens)
            sampled = (i + wave) % 3 == 0
            params = {"max_new_tokens": rng.choice([4, 16, 40]), "ignore_eos": True}
            params.update(
                {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "min_p": 0.02 * (i % 2)}
                if sampled
                else {"temperature": 0}
            )
            jobs.append((wave, [rng.randrange(3, vocab) for _ in range(plen)], params))
    done = 0
    for wave in sorted({w for w, _, _ in jobs}):
        batch = [(ids, p) for w, ids, p in jobs if w == wave]
        with cf.ThreadPoolExecutor(max_workers=min(len(batch), 128)) as pool:
            futs = [pool.submit(request_json, base + "/generate", {"input_ids": ids, "sampling_params": p}, 600) for ids, p in batch]
            for f, (_, p) in zip(futs, batch):
                out = f.result()
                assert len(out["output_ids"]) == p["max_new_tokens"], out.get("meta_info")
                done += 1
    return done


@pytest.mark.parametrize("arch,quant", MODELS, ids=[f"{a}-{q}" for a, q in MODELS])
def test_server_capture_and_mixed_load_under_traps(arch, quant, tiny_root, tmp_path):
    model_dir = tiny_model(tiny_root, arch, quant)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    trap_log = tmp_path / "traps.jsonl"
    # The server log goes where the caller collects results (a run stopped at a device-call limit
    # lost it in pytest's tmp dir once).
    out_dir = Path(os.environ.get("SGLANG_SM120_RESULTS_DIR") or tmp_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / f"traps-server-{arch}-{quant}{PARALLEL_SUFFIX}.log"
    log_path.unlink(missing_ok=True)  # the log is read below: no lines of an earlier run
    env = {"SGLANG_SM120_TRAPS": "raise", "SGLANG_SM120_TRAP_LOG": str(trap_log)}
    if arch == DSA_ARCH:
        env.update(dsa_env())
    flags = ["--enable-piecewise-cuda-graph", *attention_flags(arch),
             "--max-running-requests", "512", "--mem-fraction-static", "0.7", "--skip-tokenizer-init",
             "--tp-size", str(TP), "--ep-size", str(EP)]
    if MAX_TOKENS:  # a capped KV pool lets this server share the GPU with the correctness grid's engines
        flags += ["--max-total-tokens", str(MAX_TOKENS)]
    srv = Server(name=f"{arch}-{quant}", model_dir=str(model_dir), log_path=str(log_path), args=flags,
                 env=env, ready_path="/health_generate")
    srv.start()
    try:
        srv.wait_ready(900)
        done = mixed_load(srv.url, vocab)
        assert done > 600
        with urllib.request.urlopen(srv.url + "/health_generate", timeout=60) as r:
            assert r.status == 200
        assert srv.alive(), "server died under load"
    finally:
        srv.stop()
        server_log = log_path.read_text() if log_path.exists() else ""
        print(server_log[-6000:])
    hits = [json.loads(line) for line in trap_log.read_text().splitlines()] if trap_log.exists() else []
    assert not hits, "\n\n".join(f"{h['kind']}: {h['what']}\n{h['stack']}" for h in hits[:3])
    assert "SM120_LAYERWISE_CAPTURE" in server_log and "traps armed" in server_log

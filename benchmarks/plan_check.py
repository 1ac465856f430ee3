#!/usr/bin/env python3
"""Does `python -m sglang.sm120 plan --gpu auto` say what a server then does on this GPU?

For each model, with the same flags: the plan as JSON, then a real server (layerwise runner,
`--enable-piecewise-cuda-graph`) started until ready and stopped; `sglang.sm120.plan.compare`
holds the plan against the server's log: decode and prefill sizes exactly, each phase's graph
memory within 25% of the plan's estimate. Models: the tiny ones (python -m sglang.sm120.tiny) and
the Qwen3-30B-A3B-shape model with dummy weights (bench_runner's config). Servers run one at a time
(each alone on the GPU, as a plan assumes).

    python benchmarks/plan_check.py --out RESULTS [--models qwen3_moe-bf16 glm4_moe-bf16 qwen3-30b-a3b]

Writes RESULTS/plan-check.json (targets: sizes agree, memory within 25%, per model; each model's
layers and hidden size, for refitting the estimate) and each model's plan, server log and verdict
beside it.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _results import commit, save, target, utc_now
from bench_runner import QWEN3_30B_A3B, write_model_dir

DEFAULT_MODELS = ["qwen3_moe-bf16", "glm4_moe-bf16", "deepseek_v2-bf16", "qwen3-30b-a3b"]
# a user's flags for one GPU, as the quick start has them (attention: FlashInfer, the wheelhouse
# has no FA3 library)
COMMON = ["--enable-piecewise-cuda-graph", "--attention-backend", "flashinfer"]
PER_MODEL = {"qwen3-30b-a3b": ["--load-format", "dummy", "--mem-fraction-static", "0.6",
                               "--max-running-requests", "1024"]}
TINY = ["--mem-fraction-static", "0.3", "--max-running-requests", "1024"]


def model_path(name: str, models_dir: Path, work: Path) -> Path:
    if name == "qwen3-30b-a3b":
        return write_model_dir(work / "qwen3-30b-a3b-shapes", QWEN3_30B_A3B)
    from sglang.sm120.tiny import serving

    return serving.tiny_model(models_dir, *name.rsplit("-", 1))


def model_dims(path: Path) -> dict:
    """What the graph-memory fit scales by (sglang.sm120.plan.graph_memory): layers and width."""
    cfg = json.loads((Path(path) / "config.json").read_text())
    return {k: cfg[k] for k in ("num_hidden_layers", "hidden_size")}


def check_one(name: str, models_dir: Path, out: Path, timeout: float) -> dict:
    from sglang.sm120.launcher import Server
    from sglang.sm120.plan import compare

    flags = COMMON + PER_MODEL.get(name, TINY)
    path = model_path(name, models_dir, out / "models")
    plan_json = out / f"plan-{name}.json"
    plan = subprocess.run([sys.executable, "-m", "sglang.sm120", "plan", "--gpu", "auto", "--json",
                           "--model-path", str(path), *flags], capture_output=True, text=True, timeout=300)
    if plan.returncode != 0:
        return {"model": name, "error": f"plan exited {plan.returncode}: {plan.stderr[-2000:]}"}
    plan_json.write_text(plan.stdout)
    log = out / f"server-{name}.log"
    srv = Server(name=name, model_dir=str(path), log_path=str(log), args=flags,
                 env={"SGLANG_SM120_LAYERWISE_TIMING": "1"})
    row = {"model": name, "flags": flags, "model_dims": model_dims(path)}
    try:
        srv.start()
        row["ready_s"] = round(srv.wait_ready(timeout, progress=lambda m: print(m, flush=True)), 1)
    except Exception as e:  # noqa: BLE001 - recorded, the next model still runs
        row["error"] = str(e)[-2000:]
    finally:
        row["shutdown_clean"] = srv.stop().clean
    if "error" not in row:
        row["verdict"] = compare.compare(json.loads(plan.stdout), log.read_text(errors="replace"))
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--models-dir", type=Path,
                    default=Path(os.environ.get("SGLANG_SM120_TINY_DIR", "/tmp/sm120-tiny")))
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds to ready, per server")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "plan-check", "commit": commit(), "date": utc_now(), "gpu": _gpu_name(),
           "command": " ".join([sys.executable] + sys.argv), "models": [], "targets": {}}
    for name in args.models:
        t0 = time.time()
        row = check_one(name, args.models_dir, args.out, args.timeout)
        row["seconds"] = round(time.time() - t0, 1)
        doc["models"].append(row)
        verdict = row.get("verdict") or {}
        sizes_ok = bool(verdict) and all(c["ok"] for c in verdict["sizes"])
        doc["targets"][f"{name}_sizes_agree"] = target(1.0 if sizes_ok else 0.0, "plan == server log", bool)
        for m in verdict.get("graph_memory", []):
            doc["targets"][f"{name}_{m['phase']}_graph_memory_ratio"] = target(
                m["ratio"], "estimate / measured within 0.75..1.25",
                lambda r: abs(r - 1) <= 0.25)
        print(f"[plan-check] {name}: {json.dumps(verdict or row.get('error'))[:600]}", flush=True)
        save(args.out / "plan-check.json", doc)
    return 0 if all(t["met"] for t in doc["targets"].values()) else 1


def _gpu_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())

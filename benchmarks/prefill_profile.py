#!/usr/bin/env python3
"""Where a prefill's GPU time goes: upstream `breakable` vs `layerwise`, kernel by kernel.

    python benchmarks/prefill_profile.py --tag h200 [--configs upstream layerwise layerwise_fa2_prefill] [--tokens 1024 4096]

Why: where layerwise prefill takes longer than `breakable`, host time alone does not say why
(docs/runner.md 5.6). Each configuration runs
upstream's one-batch benchmark on the Qwen3-30B-shaped dummy model (bench_runner's setup) with
its torch profiler on the prefill of each batch (GPU activity only, so the host is not slowed);
the last trace per token count (the second pass: compiles paid) is read here. Per trace: the
span from the first kernel's start to the last one's end, the time some kernel ran (busy), the
rest (idle: the GPU waited for the host or a graph launch), and GPU time by kernel group and the
largest kernels. Writes lab/scratch/prefill-profile-TAG.{json,md} (or under --results-dir); a
diagnostic, not a result of record: its `targets` object is empty.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

import bench_runner as br
from _results import commit, save, utc_now

# substring of a kernel name (lower case) -> group; first match wins
GROUPS: Tuple[Tuple[str, str], ...] = (
    ("fused_moe", "moe"), ("moe_align", "moe"), ("moe_sum", "moe"), ("silu_and_mul", "moe"),
    ("act_and_mul", "moe"), ("topk", "router"), ("softmax", "router"),
    ("flashinfer", "attention"), ("prefill", "attention"), ("fmha", "attention"), ("attention", "attention"),
    ("rope", "rope"), ("rotary", "rope"), ("rmsnorm", "norm"), ("layernorm", "norm"),
    ("gemm", "gemm"), ("nvjet", "gemm"), ("cutlass", "gemm"), ("xmma", "gemm"), ("cublas", "gemm"),
    ("copy", "copy"), ("memcpy", "copy"), ("memset", "copy"), ("fill", "copy"),
)
TRACE_RE = re.compile(r"batch(\d+)_input(\d+)_output\d+.*prefill")


def group_of(name: str) -> str:
    low = name.lower()
    for key, group in GROUPS:
        if key in low:
            return group
    return "other"


def union_length(intervals: Iterable[Tuple[float, float]]) -> float:
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def summarize_trace(events: List[dict], top: int = 12) -> Dict:
    """GPU kernels, copies and sets of one chrome trace -> span, busy, idle (us), by group, top."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"kernels": 0}
    start = min(e["ts"] for e in gpu)
    end = max(e["ts"] + e["dur"] for e in gpu)
    busy = union_length((e["ts"], e["ts"] + e["dur"]) for e in gpu)
    by_group: Dict[str, float] = {}
    by_name: Dict[str, List[float]] = {}
    for e in gpu:
        name = e.get("name", "?")
        by_group[group_of(name)] = by_group.get(group_of(name), 0.0) + e["dur"]
        by_name.setdefault(name, []).append(e["dur"])
    biggest = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "kernels": len(gpu), "span_us": round(end - start, 1), "busy_us": round(busy, 1),
        "idle_us": round(end - start - busy, 1),
        "by_group_us": {g: round(v, 1) for g, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
        "top": [{"name": n[:120], "calls": len(d), "total_us": round(sum(d), 1)} for n, d in biggest],
    }


def read_trace(path: Path) -> List[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f).get("traceEvents", [])


def profile_config(model: Path, name: str, tokens: List[int], workdir: Path, timeout: int) -> Dict:
    prof_dir = workdir / f"profile-{name}"
    prof_dir.mkdir(parents=True, exist_ok=True)
    batches = [br.PREFILL_BS[t] for t in tokens]
    cmd = br.one_batch_cmd(model, name, batches * 2, workdir / f"{name}-profile.jsonl", 1, br.CONFIGS[name]) + [
        "--profile", "--profile-stage", "prefill", "--profile-activities", "GPU",
        "--profile-prefix", name]
    env = dict(os.environ, SGLANG_TORCH_PROFILER_DIR=str(prof_dir), **br.CONFIG_ENV.get(name, {}))
    print(f"[prefill_profile] {name}: {' '.join(cmd)}", flush=True)
    log = workdir / f"{name}-profile.log"
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
    if rc != 0:
        raise SystemExit(f"{name}: one_batch --profile failed (rc={rc}); log {log}:\n{log.read_text(errors='replace')[-2000:]}")
    out: Dict[str, Dict] = {}
    for path in sorted(prof_dir.rglob("*.trace.json*"), key=lambda p: p.stat().st_mtime):
        m = TRACE_RE.search(path.name)
        if m:  # a later trace of the same batch overwrites an earlier one: the warm pass is kept
            out[str(int(m.group(1)) * int(m.group(2)))] = dict(summarize_trace(read_trace(path)), trace=path.name)
    missing = [t for t in tokens if str(t) not in out]
    if missing:
        raise SystemExit(f"{name}: no prefill trace for {missing} tokens under {prof_dir}")
    return {"command": " ".join(cmd), "env": br.CONFIG_ENV.get(name, {}), "wall_s": round(time.time() - t0, 1),
            "tokens": out}


def render_md(doc: Dict) -> str:
    lines = [f"# Prefill kernel profile ({doc['tag']})", "", f"{doc['device']}; {doc['model']}; commit {doc['commit']}; "
             f"generated {doc['generated']}. GPU activity only (torch profiler); the second pass of each size.", "",
             "| config | tokens | span ms | busy ms | idle ms | kernels | by group (ms) |", "|---|---|---|---|---|---|---|"]
    for name, run in doc["runs"].items():
        for t, s in run["tokens"].items():
            groups = ", ".join(f"{g} {v / 1e3:.2f}" for g, v in s["by_group_us"].items())
            lines.append(f"| {name} | {t} | {s['span_us'] / 1e3:.2f} | {s['busy_us'] / 1e3:.2f} | "
                         f"{s['idle_us'] / 1e3:.2f} | {s['kernels']} | {groups} |")
    for name, run in doc["runs"].items():
        for t, s in run["tokens"].items():
            lines += ["", f"## {name}, {t} tokens: largest kernels", "", "| kernel | calls | total ms |", "|---|---|---|"]
            lines += [f"| `{k['name']}` | {k['calls']} | {k['total_us'] / 1e3:.3f} |" for k in s["top"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="h200")
    ap.add_argument("--configs", nargs="+", choices=list(br.CONFIGS),
                    default=["upstream", "layerwise", "layerwise_fa2_prefill"])
    ap.add_argument("--tokens", nargs="+", type=int, choices=sorted(br.PREFILL_BS), default=[1024, 4096])
    ap.add_argument("--timeout", type=int, default=400, help="per configuration, seconds")
    ap.add_argument("--results-dir", default=str(Path(__file__).resolve().parent / "scratch"),
                    help="where prefill-profile-TAG.{json,md} go (default lab/scratch/, git-ignored)")
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="prefill_profile_"))
    model = br.write_model_dir(workdir / "qwen3-30b-a3b-shapes", br.QWEN3_30B_A3B)
    doc = {"targets": {}, "note": "diagnostic for issue 4's prefill target; no target of its own",
           "tag": args.tag, "commit": commit(), "device": br.device_name(), "generated": utc_now(),
           "model": "Qwen3-30B-A3B shapes, bf16, dummy weights, TP 1", "runs": {}}
    out = Path(args.results_dir) / f"prefill-profile-{args.tag}.json"
    for name in args.configs:
        doc["runs"][name] = profile_config(model, name, args.tokens, workdir, args.timeout)
        save(out, doc)
        out.with_suffix(".md").write_text(render_md(doc))
    print(f"[prefill_profile] wrote {out} and {out.with_suffix('.md')}")
    for name, run in doc["runs"].items():
        for t, s in run["tokens"].items():
            print(f"  {name} {t}: span {s['span_us'] / 1e3:.2f} ms, busy {s['busy_us'] / 1e3:.2f}, idle {s['idle_us'] / 1e3:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

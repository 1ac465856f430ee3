#!/usr/bin/env python3
"""Layerwise CUDA-graph runner vs upstream, side by side on one GPU (Qwen3-30B-A3B shapes).

One run measures six configurations with upstream's one-batch benchmark
(`python -m sglang.benchmark.one_batch`, model built in-process, `--load-format dummy`, bf16,
FlashInfer attention, 128-token prompts, 8 output tokens; every batch size PASSES = 3 times, the
median reported, every sample kept):

  disabled              graphs off in both phases
  upstream              decode `full` (ceiling 256), prefill `breakable` at 128/1024/4096 tokens
  layerwise             the product's default: both phases layerwise (decode: full <= 256,
                        layerwise above, up to 1024; prefill buckets 128/1024/4096 via the legacy
                        --piecewise-cuda-graph-tokens), the lean eager MoE (SGLANG_SM120_LEAN_MOE=1)
  layerwise_every_size  the same with --cuda-graph-layerwise-every-size: every decode size
                        layerwise, bs 1 included (host time per MoE layer at every size)
  layerwise_every_size_256  every size layerwise, upstream's decode sizes (<= 256): graph memory
                        for the same sizes as upstream's full graphs
  full_graphs_1024      upstream's full decode graphs at every size up to 1024 (through the
                        layerwise backend's ceiling, which grows FlashInfer's workspace), prefill
                        off: graph memory and latency of full graphs at layerwise's sizes above 256

and, when named with --configs, the first two layerwise ones on upstream's eager MoE path
(SGLANG_SM120_LEAN_MOE=0): layerwise_upstream_moe, layerwise_every_size_upstream_moe; and
layerwise_captured_prefill and layerwise_fa2_prefill, layerwise with its opt-in captured prefill
attention (SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION=auto: FA3 on SM90, FA2 elsewhere; =fa2:
upstream's captured-prefill plan; runner/prefill_attention.py); the other layerwise configurations
run the default, `eager`: attention as an eager break with upstream's own forward, the tokens of
graphs disabled;
layerwise_zero_copy, layerwise with its lean MoE steps reading the segments' tensors in place
(SGLANG_SM120_LAYERWISE_ZERO_COPY=1, runner/zero_copy.py);
layerwise_captured_decode_attention, layerwise with decode attention kept in the graphs at the
padded batch's plan (SGLANG_SM120_LAYERWISE_DECODE_ATTENTION=captured): what the default eager
attention step on the real batch (graphs disabled's tokens) costs, side by side.

Decode step latency at bs {1, 8, 64, 256, 512, 1024}; prefill latency at 128/1024/4096 tokens
(bs 1/8/32 x 128); capture time and graph memory from the capture logs; host time per eager MoE
step from the layerwise replays. Writes benchmarks/results/runner-<tag>.json (+ .md) with a
top-level "targets" object. Configurations can be run in separate invocations (each must fit
the GPU host's 10-minute command limit) and merged: --configs ... --out SAME_FILE.

    python benchmarks/bench_runner.py --tag h200                      # the six (~6 min on the H200)
    python benchmarks/bench_runner.py --tag h200 --configs disabled upstream
    python benchmarks/bench_runner.py --tag h200 --configs layerwise layerwise_every_size
    python benchmarks/bench_runner.py --diagnose-eager-warmup         # see docs/runner.md

On a 2-GPU host the two halves run side by side (one GPU each, tags h200-a/h200-b) and are then
merged: `--tag h200 --merge h200-a h200-b` (no GPU needed for the merge). `--tp 2` runs every
configuration with tensor parallelism 2 (issue 7).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from _results import RESULTS, commit, ratio, save, target as _target, utc_now

from sglang.sm120.model_shapes import QWEN3_30B_A3B_CONFIG as QWEN3_30B_A3B
# A tiny random Qwen3-MoE: small enough to build anywhere, large enough to show where upstream's
# eager warmup spends its time (diagnose_eager_warmup).
TINY_QWEN3_MOE = dict(
    QWEN3_30B_A3B, hidden_size=1024, num_hidden_layers=8, num_attention_heads=16,
    num_key_value_heads=4, head_dim=64, intermediate_size=2048, moe_intermediate_size=512,
    num_experts=32, num_experts_per_tok=4, vocab_size=32000,
)

DECODE_BS = [1, 8, 64, 256, 512, 1024]
PREFILL_BS = {128: 1, 1024: 8, 4096: 32}  # tokens -> batch of 128-token prompts
INPUT_LEN, OUTPUT_LEN = 128, 8
# one_batch measures every batch size once, after a warmup of the first size only: a size's first
# run can include first-use compiles (2026-12-01: disabled's 1024-token prefill 1357.9 ms) and
# prefill is one sample. PASSES runs of the whole list, reported as the median per size.
PASSES = 3
PREFILL_BUCKETS = ["128", "1024", "4096"]
CONFIGS: Dict[str, List[str]] = {
    "disabled": ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"],
    "upstream": [
        "--cuda-graph-backend-decode", "full", "--cuda-graph-max-bs", "256",
        "--cuda-graph-backend-prefill", "breakable", "--cuda-graph-bs-prefill", *PREFILL_BUCKETS,
    ],
    "layerwise": [
        "--cuda-graph-backend-decode", "layerwise", "--cuda-graph-backend-prefill", "layerwise",
        "--piecewise-cuda-graph-tokens", *PREFILL_BUCKETS,
    ],
    "layerwise_every_size": [
        "--cuda-graph-backend-decode", "layerwise", "--cuda-graph-backend-prefill", "layerwise",
        "--piecewise-cuda-graph-tokens", *PREFILL_BUCKETS, "--cuda-graph-layerwise-every-size",
    ],
    # upstream's own decode sizes (<= 256), all layerwise: graph memory for the same sizes
    "layerwise_every_size_256": [
        "--cuda-graph-backend-decode", "layerwise", "--cuda-graph-layerwise-every-size",
        "--cuda-graph-max-bs", "256", "--cuda-graph-backend-prefill", "disabled",
    ],
    # upstream's full decode graphs at every layerwise size (ceiling 1024 through the layerwise
    # backend, which grows FlashInfer's workspace for it), prefill off: graph memory and decode
    # latency of full graphs at the sizes layerwise captures above 256
    "full_graphs_1024": [
        "--cuda-graph-config", '{"decode": {"backend": "layerwise", "layerwise_full_max_bs": 1024}, '
                               '"prefill": {"backend": "disabled"}}',
    ],
}
# on request: the same sizes on upstream's eager MoE path (what SGLANG_SM120_LEAN_MOE=0 selects),
# and layerwise with its captured prefill attention on upstream's FA2 plan
UPSTREAM_MOE_OF = {"layerwise_upstream_moe": "layerwise", "layerwise_every_size_upstream_moe": "layerwise_every_size"}
DEFAULT_CONFIGS = list(CONFIGS)
CONFIGS.update({name: CONFIGS[of] for name, of in UPSTREAM_MOE_OF.items()})
CONFIGS["layerwise_fa2_prefill"] = CONFIGS["layerwise"]
CONFIGS["layerwise_captured_prefill"] = CONFIGS["layerwise"]
CONFIGS["layerwise_zero_copy"] = CONFIGS["layerwise"]
CONFIGS["layerwise_captured_decode_attention"] = CONFIGS["layerwise"]
# environment a configuration adds to its one_batch process: every layerwise configuration names
# its eager MoE path and where prefill and decode run attention, so a row means the same whatever
# the default
_UPSTREAM_MOE, _LEAN_MOE = {"SGLANG_SM120_LEAN_MOE": "0"}, {"SGLANG_SM120_LEAN_MOE": "1"}
_DEFAULT_ATTENTION = {"SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION": "eager",
                      "SGLANG_SM120_LAYERWISE_DECODE_ATTENTION": "eager"}
# what an on-request configuration changes on top of the product's default
_VARIANT_ENV = {"layerwise_fa2_prefill": {"SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION": "fa2"},
                "layerwise_captured_prefill": {"SGLANG_SM120_LAYERWISE_PREFILL_ATTENTION": "auto"},
                "layerwise_zero_copy": {"SGLANG_SM120_LAYERWISE_ZERO_COPY": "1"},
                # the eager decode attention step's cost (it gives graphs disabled's tokens)
                "layerwise_captured_decode_attention": {"SGLANG_SM120_LAYERWISE_DECODE_ATTENTION": "captured"}}
CONFIG_ENV: Dict[str, Dict[str, str]] = {
    name: {**(_UPSTREAM_MOE if name in UPSTREAM_MOE_OF else _LEAN_MOE), **_DEFAULT_ATTENTION,
           **_VARIANT_ENV.get(name, {})}
    for name in CONFIGS if name.startswith("layerwise")
}
CAPTURE_RE = re.compile(
    r"Capture (?:target )?(prefill|decode) CUDA graph end\. elapsed=([\d.]+) s, mem usage=([\d.]+) GB"
)
LAYERWISE_CAPTURE_TAG = "SM120_LAYERWISE_CAPTURE"
LAYERWISE_HOST_TAG = "SM120_LAYERWISE_HOST"


def write_model_dir(path: Path, config: dict) -> Path:
    """config.json + a small word-level tokenizer (one_batch loads one; the host is offline)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(997)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 40960,
    }))
    return path


def one_batch_cmd(model_dir: Path, name: str, batch_sizes: List[int], jsonl: Path, tp: int,
                  extra: List[str], ep: int = 1) -> List[str]:
    """upstream's one-batch benchmark on the dummy-weight model, the setup every run here shares."""
    return [
        sys.executable, "-m", "sglang.benchmark.one_batch", "--model-path", str(model_dir),
        "--load-format", "dummy", "--attention-backend", "flashinfer",
        "--mem-fraction-static", "0.85", "--max-running-requests", "1024",
        "--batch-size", *map(str, batch_sizes), "--input-len", str(INPUT_LEN),
        "--output-len", str(OUTPUT_LEN), "--run-name", name, "--result-filename", str(jsonl),
        "--tp-size", str(tp), "--ep-size", str(ep), *extra,
    ]


def run_one_batch(model_dir: Path, name: str, extra: List[str], workdir: Path, timeout: int,
                  tp: int = 1, ep: int = 1) -> dict:
    jsonl = workdir / f"{name}.jsonl"
    jsonl.unlink(missing_ok=True)
    batch_sizes = sorted(set(DECODE_BS) | set(PREFILL_BS.values()))
    cmd = one_batch_cmd(model_dir, name, batch_sizes * PASSES, jsonl, tp, extra, ep)
    env = dict(os.environ, SGLANG_SM120_LAYERWISE_TIMING="1", **CONFIG_ENV.get(name, {}))
    print(f"[bench_runner] {name}: {' '.join(f'{k}={v}' for k, v in CONFIG_ENV.get(name, {}).items())}"
          f" {' '.join(cmd)}", flush=True)
    t0 = time.time()
    log_path = workdir / f"{name}.log"
    # Streamed to the file (not captured) so a run stopped at its limit leaves its log behind.
    with open(log_path, "w") as log_file:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"{name}: one_batch still running after {timeout} s; log: {log_path}\n"
                             f"{log_path.read_text(errors='replace')[-3000:]}")
    wall = time.time() - t0
    log = log_path.read_text(errors="replace")
    if proc.returncode != 0:
        raise SystemExit(f"{name}: one_batch failed (rc={proc.returncode}); log: {workdir / (name + '.log')}\n{log[-3000:]}")
    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    decode, prefill, samples = summarize_rows(rows)
    capture, host, totals = parse_capture_log(log)
    return {
        "command": " ".join(cmd), "wall_s": round(wall, 1), "device": device_name(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "decode_s": decode,
        "prefill_s": prefill, "samples": samples, "capture": capture, "capture_totals": totals, "host_step": host,
    }


def parse_capture_log(log: str):
    """(capture, host_step, capture_totals) from a one_batch log: upstream's capture-end lines and
    the layerwise runner's capture and host-time reports."""
    capture = {"upstream_log": {}, "layerwise": {}}
    for phase, elapsed, mem in CAPTURE_RE.findall(log):
        capture["upstream_log"][phase] = {"elapsed_s": float(elapsed), "mem_gb": float(mem)}
    host = {}
    for line in log.splitlines():
        if line.startswith(LAYERWISE_CAPTURE_TAG + " "):
            rep = json.loads(line[len(LAYERWISE_CAPTURE_TAG) + 1:])
            capture["layerwise"][rep["phase"]] = rep
        elif line.startswith(LAYERWISE_HOST_TAG + " "):
            rep = json.loads(line[len(LAYERWISE_HOST_TAG) + 1:])
            host[rep["phase"]] = rep["sizes"]
    totals = {}
    for phase in ("prefill", "decode"):
        up = capture["upstream_log"].get(phase, {})
        lw = capture["layerwise"].get(phase, {})
        # layerwise: the upstream log line covers buffers + the warm pass, our report the capture
        totals[phase] = {
            "capture_s": round(up.get("elapsed_s", 0.0) + lw.get("elapsed_s", 0.0), 3),
            "graph_mem_gb": round(up.get("mem_gb", 0.0) + lw.get("mem_bytes", 0) / 2**30, 4),
        }
    return capture, host, totals


def summarize_rows(rows: List[dict], decode_bs: List[int] = DECODE_BS, prefill_bs: Dict[int, int] = PREFILL_BS):
    """one_batch's result rows -> (decode step s per bs, prefill s per token count, samples): the
    median over the passes; the samples keep every measurement."""
    def med(values):
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    dec = {bs: [r.get("median_decode_latency") for r in rows if r["batch_size"] == bs] for bs in decode_bs}
    pre = {tokens: [r.get("prefill_latency") for r in rows if r["batch_size"] == bs] for tokens, bs in prefill_bs.items()}
    decode = {str(bs): med(v) for bs, v in dec.items() if v}
    prefill = {str(tokens): med(v) for tokens, v in pre.items()}
    samples = {"decode_s": {str(bs): v for bs, v in dec.items() if v},
               "prefill_s": {str(t): v for t, v in pre.items() if v}}
    return decode, prefill, samples


def _worst_host_us(run: dict, min_size: int = 0):
    """Largest host time per eager MoE layer over the run's decode sizes >= min_size."""
    us = [s["step_host_us"] for s in run["host_step"].get("decode", []) if s["size"] >= min_size]
    return max(us) if us else None


def _vs_upstream(t: Dict[str, dict], runs: Dict[str, dict], pairs, times: str, sizes, what: str, limit: str) -> None:
    """t[f"{prefix}_vs_{what}{size}"]: the configuration's time over upstream's, at most `limit`, for
    each (configuration, prefix) that ran beside upstream."""
    up = runs.get("upstream")
    for name, prefix in pairs:
        run = runs.get(name)
        if run and up:
            for size in sizes:
                r = ratio(run[times].get(size), up[times].get(size))
                t[f"{prefix}_vs_{what}{size}"] = _target(r, f"<= {limit}", lambda v: v <= float(limit))


def size_memory_totals(run: dict, phase: str, kind: str, sizes=None) -> Dict[str, float]:
    """GB a run's capture took for its `kind` (full / layerwise) sizes of `phase`, summed from the
    capture report's per-size readings (sizes: only those); {} when the report has none."""
    per_size = run.get("capture", {}).get("layerwise", {}).get(phase, {}).get("size_memory", {})
    picked = {int(k): v for k, v in per_size.items()
              if v.get("kind") == kind and (sizes is None or int(k) in sizes)}
    if not picked:
        return {}
    out = {part: round(sum(v[part] for v in picked.values()) / 2**30, 4)
           for part in ("allocated", "reserved", "pool", "outside")}
    out["graph"] = round(out["pool"] + out["outside"], 4)  # the graph pool's growth + the driver's
    out["sizes"] = sorted(picked)
    # pool blocks a size left allocated (readings since d0e0574; None in older reports)
    kept = [v.get("kept_blocks") for v in picked.values()]
    out["kept_blocks"] = None if None in kept else sum(kept)
    top = picked[max(picked)].get("kept_largest")  # what the largest size left allocated
    out["largest_size_kept_mb"] = None if top is None else [round(b / 2**20, 2) for b in top]
    # the allocations the largest size's output (the logits) holds (None in reports that predate
    # the reading). Upstream 0.5.16 writes decode logits into one preallocated fp32
    # buffer shared by every size (graph_shared_output), so this is not graph-pool memory: the
    # reading says where the logits live, it is not subtracted from anything.
    held = picked[max(picked)].get("output_bytes")
    out["largest_size_output_gb"] = None if held is None else round(held / 2**30, 4)
    return out


def _per_size_graph_mem(t: Dict[str, dict], key: str, seg_run, full_run, sizes_of: str, what: str) -> None:
    """t[key]: the layerwise sizes of seg_run against the full-graph sizes of full_run, summed
    over the sizes of `sizes_of` kind (whichever run sets them); only where both read the same."""
    if not (seg_run and full_run):
        return
    if sizes_of == "full":
        full = size_memory_totals(full_run, "decode", "full")
        seg = size_memory_totals(seg_run, "decode", "layerwise", sizes=set(full.get("sizes", [])))
    else:
        seg = size_memory_totals(seg_run, "decode", "layerwise")
        full = size_memory_totals(full_run, "decode", "full", sizes=set(seg.get("sizes", [])))
    if not (seg and full and seg["sizes"] == full["sizes"]):
        return
    sizes = seg["sizes"]
    t[key] = dict(_target(ratio(seg["graph"], full["graph"]), "<= 0.5", lambda v: v <= 0.5),
                  measure=what.format(n=len(sizes), first=sizes[0], last=sizes[-1])
                  + f": layerwise {seg['graph']} GB, full graphs {full['graph']} GB")


def compute_targets(runs: Dict[str, dict]) -> Dict[str, dict]:
    t: Dict[str, dict] = {}
    dis, up = runs.get("disabled"), runs.get("upstream")
    lw, every = runs.get("layerwise"), runs.get("layerwise_every_size")
    if dis and lw:
        for bs in ("512", "1024"):
            sp = ratio(dis["decode_s"].get(bs), lw["decode_s"].get(bs))
            t[f"decode_speedup_vs_eager_bs{bs}"] = _target(sp, ">= 1.6", lambda v: v >= 1.6)
    for name, key, min_size in (("layerwise", "eager_moe_host_us_per_layer_bs512_1024", 512),
                                ("layerwise_every_size", "eager_moe_host_us_per_layer_all_sizes", 0),
                                ("layerwise_upstream_moe", "upstream_moe_host_us_per_layer_bs512_1024", 512),
                                ("layerwise_every_size_upstream_moe", "upstream_moe_host_us_per_layer_all_sizes", 0)):
        if runs.get(name):
            t[key] = _target(_worst_host_us(runs[name], min_size=min_size), "<= 100", lambda v: v <= 100)
    _vs_upstream(t, runs, (("layerwise_every_size", "every_size"),
                           ("layerwise_every_size_upstream_moe", "every_size_upstream_moe")),
                 "decode_s", ("64", "256"), "full_graph_bs", "1.10")
    # the comparison: the same decode sizes, layerwise vs full graphs; without
    # layerwise_every_size_256, sizes up to 1024 against upstream's up to 256 (an upper bound)
    same = runs.get("layerwise_every_size_256")
    mem_run = same or every
    if mem_run and up:
        r = ratio(mem_run["capture_totals"]["decode"]["graph_mem_gb"], up["capture_totals"]["decode"]["graph_mem_gb"])
        t["decode_graph_mem_layerwise_vs_full_same_sizes"] = _target(r, "<= 0.5", lambda v: v <= 0.5)
        t["decode_graph_mem_layerwise_vs_full_same_sizes"]["measure"] = (
            "drop in free memory over each configuration's whole decode capture (upstream's log line, "
            "plus the layerwise capture report): warm-up forwards' allocator growth included")
        if not same:
            t["decode_graph_mem_layerwise_vs_full_same_sizes"]["note"] = (
                "not the same sizes: layerwise_every_size captures up to 1024, upstream up to 256 "
                "(run layerwise_every_size_256 for the comparison)")
    # the same comparison size by size, from one reading around each size's capture in both runs:
    # layerwise_every_size_256's layerwise sizes vs layerwise's full-graph sizes (upstream's
    # full backend, called by ours), graph pool growth + memory outside the allocator
    _per_size_graph_mem(t, "decode_graph_mem_per_size_layerwise_vs_full", same, lw, sizes_of="full",
                        what="sum over the {n} sizes of graph-pool growth + memory outside torch's "
                             "allocator around each size's capture")
    # layerwise's own sizes (above the 256 ceiling) against full graphs at exactly those sizes
    _per_size_graph_mem(t, "decode_graph_mem_layerwise_sizes_vs_full_1024", lw, runs.get("full_graphs_1024"),
                        sizes_of="layerwise",
                        what="layerwise's {n} layerwise sizes ({first}-{last}), graph-pool growth + memory "
                             "outside the allocator per size")
    _vs_upstream(t, runs, (("layerwise", "prefill"), ("layerwise_upstream_moe", "prefill_upstream_moe"),
                           ("layerwise_fa2_prefill", "prefill_fa2"),
                           ("layerwise_captured_prefill", "prefill_captured"),
                           ("layerwise_zero_copy", "prefill_zero_copy")),
                 "prefill_s", ("1024", "4096"), "breakable_", "1.0")
    if lw and up:
        r = ratio(lw["capture_totals"]["prefill"]["capture_s"], up["capture_totals"]["prefill"]["capture_s"])
        t["prefill_capture_time_vs_breakable"] = _target(r, "<= 0.5", lambda v: v <= 0.5)
    return t


def size_memory_lines(runs: Dict[str, dict], names: List[str]) -> List[str]:
    """Per configuration and kind of size, what the captures took (GB), from the per-size readings."""
    rows = []
    for n in names:
        for phase in ("prefill", "decode"):
            for kind in ("full", "layerwise"):
                m = size_memory_totals(runs[n], phase, kind)
                if m:
                    held = m["largest_size_output_gb"]
                    rows.append(f"| {n} | {phase} | {kind} | {len(m['sizes'])} | {m['allocated']:.3f} | "
                                f"{m['reserved']:.3f} | {m['pool']:.3f} | {m['outside']:.3f} | {m['graph']:.3f} | "
                                f"{'-' if held is None else f'{held:.3f}'} | "
                                f"{'-' if m['kept_blocks'] is None else m['kept_blocks']} | "
                                f"{'-' if m['largest_size_kept_mb'] is None else m['largest_size_kept_mb']} |")
    if not rows:
        return []
    return ["", "## Graph memory by captured size (GB, summed over the sizes)", "",
            "Read around each size's capture: live tensors (allocated), torch's allocator (reserved), "
            "the graph pool's part of it (pool), outside the allocator (the driver); graph = pool + outside; "
            "output = the allocations the largest size's output (the logits) holds: upstream's shared logits "
            "buffer, outside the graph pool.", "",
            "| config | phase | kind | sizes | allocated | reserved | pool | outside | graph | largest size's output | "
            "pool blocks kept | largest size keeps (MB) |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows]


def capture_time_lines(runs: Dict[str, dict], names: List[str]) -> List[str]:
    """Where layerwise capture time went (the runner's size_timings): the warm pass's forwards (in
    upstream's constructor, so inside its logged elapsed), the probe forward and the captured
    forward with instantiation; and upstream's capture loop between our calls (the time a pass
    spent on a size outside our code, from the second size of each pass on; 0 in reports
    that predate it).
    Prefill per bucket, decode summed over its sizes."""
    rows = []
    for n in names:
        for phase in ("prefill", "decode"):
            timings = runs[n].get("capture", {}).get("layerwise", {}).get(phase, {}).get("size_timings")
            if not timings:
                continue
            groups = [(k, [v]) for k, v in timings.items()] if phase == "prefill" else [
                (f"{len(timings)} sizes", list(timings.values()))]
            for label, ts in groups:
                keys = ("warm_s", "probe_s", "capture_s", "warm_gap_s", "capture_gap_s")
                cells = [f"{sum(t.get(k, 0.0) for t in ts):.3f}" for k in keys]
                rows.append(f"| {n} | {phase} | {label} | " + " | ".join(cells) + " |")
    if not rows:
        return []
    return ["", "## Layerwise capture time by step (s)", "",
            "| config | phase | size | warm pass | probe forward | captured forward | upstream before it, warm pass "
            "| upstream before it, capture pass |", "|---|---|---|---|---|---|---|---|", *rows]


def capture_memory_lines(runs: Dict[str, dict], names: List[str]) -> List[str]:
    """Where layerwise graph memory went (the capture report): torch's allocator
    (graph pool and eager caches) vs outside it (the driver's instantiated graphs, workspaces), and
    the latter per segment graph: is it the pool or the number of graphs?"""
    rows = []
    for n in names:
        for phase in ("prefill", "decode"):
            rep = runs[n].get("capture", {}).get("layerwise", {}).get(phase, {})
            if "allocator_bytes" not in rep:
                continue
            graphs = rep.get("graphs", 0)
            per_graph = f"{rep['outside_allocator_bytes'] / graphs / 2**20:.2f}" if graphs else "-"
            rows.append(f"| {n} | {phase} | {rep['mem_bytes'] / 2**30:.3f} | {rep['allocator_bytes'] / 2**30:.3f} | "
                        f"{rep['outside_allocator_bytes'] / 2**30:.3f} | {graphs} | {per_graph} |")
    if not rows:
        return []
    return ["", "## Layerwise capture memory (GB)", "",
            "| config | phase | total | torch allocator | outside it | segment graphs | outside per graph (MB) |",
            "|---|---|---|---|---|---|---|", *rows]


def host_time_lines(runs: Dict[str, dict], names: List[str]) -> List[str]:
    """Per configuration, phase and size: the eager MoE step's wall time per layer (what the
    targets use) and, where the report has it, the thread's CPU time (the rest is waiting), and
    the decode attention step's wall time where attention is an eager step too."""
    rows = []
    for n in names:
        for phase, sizes in runs[n].get("host_step", {}).items():
            for s in sorted(sizes, key=lambda s: s["size"]):
                cpu, att = s.get("step_cpu_us"), s.get("attention_step_host_us")
                rows.append(f"| {n} | {phase} | {s['size']} | {s['step_host_us']:.1f} | "
                            f"{'-' if cpu is None else f'{cpu:.1f}'} | {'-' if att is None else f'{att:.1f}'} | "
                            f"{s.get('replays', '-')} |")
    if not rows:
        return []
    return ["", "## Eager steps per layer (us)", "",
            "| config | phase | size | MoE wall | MoE CPU | attention wall | replays |",
            "|---|---|---|---|---|---|---|", *rows]


def render_md(result: dict) -> str:
    runs = result["runs"]
    names = [n for n in CONFIGS if n in runs]
    lines = [f"# Layerwise runner benchmark ({result['tag']})", "",
             f"{result['device']}; {result['model']}; commit {result.get('commit', 'unknown')}; "
             f"generated {result['generated']}.", "",
             *([f"Commit note: {result['commit_note']}.", ""] if result.get("commit_note") else []),
             "## Decode step, median (ms)", "", "| bs | " + " | ".join(names) + " |",
             "|---|" + "---|" * len(names)]
    for bs in DECODE_BS:
        cells = [f"{runs[n]['decode_s'].get(str(bs), float('nan')) * 1e3:.2f}" if runs[n]['decode_s'].get(str(bs)) else "-" for n in names]
        lines.append(f"| {bs} | " + " | ".join(cells) + " |")
    lines += ["", "## Prefill (ms)", "", "| tokens | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for tokens in PREFILL_BS:
        cells = [f"{runs[n]['prefill_s'][str(tokens)] * 1e3:.1f}" if runs[n]['prefill_s'].get(str(tokens)) else "-" for n in names]
        lines.append(f"| {tokens} | " + " | ".join(cells) + " |")
    lines += ["", "## Capture", "", "| config | prefill s | prefill GB | decode s | decode GB |", "|---|---|---|---|---|"]
    for n in names:
        c = runs[n]["capture_totals"]
        lines.append(f"| {n} | {c['prefill']['capture_s']} | {c['prefill']['graph_mem_gb']} | {c['decode']['capture_s']} | {c['decode']['graph_mem_gb']} |")
    lines += capture_time_lines(runs, names)
    lines += capture_memory_lines(runs, names)
    lines += size_memory_lines(runs, names)
    lines += host_time_lines(runs, names)
    lines += ["", "## Targets", "", "| target | value | threshold | met |", "|---|---|---|---|"]
    for k, v in result["targets"].items():
        lines.append(f"| {k} | {v['value']} | {v['target']} | {'yes' if v['met'] else 'NO'}"
                     f"{' (' + v['note'] + ')' if v.get('note') else ''} |")
    if result.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    for n, why in sorted(result.get("failed", {}).items()):
        lines.append(f"\nNot measured: `{n}`: {why}")
    lines += ["", "Commands:", ""] + [f"- `{runs[n]['command']}`" for n in names]
    return "\n".join(lines) + "\n"


def device_name() -> str:
    try:
        import torch

        return torch.cuda.get_device_name(0)
    except Exception:  # noqa: BLE001
        return "unknown device"


def diagnose_eager_warmup(workdir: Path, limit_s: int, results: Path = RESULTS) -> None:
    """Upstream 0.5.16 with graphs disabled can take minutes in one_batch's warmup even on a tiny
    MoE. Run it with Python stacks dumped every 15 s and summarise where the
    time goes (docs/runner.md explains the reading of the code behind it)."""
    model = write_model_dir(workdir / "tiny-qwen3-moe", TINY_QWEN3_MOE)
    dump = workdir / "eager-warmup-stacks.txt"
    script = (
        "import faulthandler, sys\n"
        f"f = open({str(dump)!r}, 'w')\n"
        "faulthandler.dump_traceback_later(15, repeat=True, file=f)\n"
        "from sglang.benchmark.one_batch import cli_main\n"
        "sys.argv = ['one_batch'] + sys.argv[1:]\n"
        "cli_main()\n"
    )
    cmd = [sys.executable, "-c", script, "--model-path", str(model), "--load-format", "dummy",
           "--attention-backend", "flashinfer", "--disable-cuda-graph", "--batch-size", "16",
           "--input-len", "256", "--output-len", "32"]
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = "timeout", (e.stdout or b"").decode() + (e.stderr or b"").decode()
    wall = time.time() - t0
    frames = {}
    if dump.exists():
        for block in dump.read_text().split("Thread 0x"):
            lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File")]
            if lines:
                top = " <- ".join(lines[:4])
                frames[top] = frames.get(top, 0) + 1
    report = workdir / "runner-eager-warmup-diagnosis.txt"
    with open(report, "w") as f:
        f.write(f"command: {' '.join(cmd)}\nrc: {rc}\nwall: {wall:.1f} s\n\n")
        f.write("most frequent innermost frames (count of 15 s samples):\n")
        for top, n in sorted(frames.items(), key=lambda kv: -kv[1])[:15]:
            f.write(f"{n:4d}  {top}\n")
        f.write("\n--- log tail ---\n" + out[-4000:])
    results.mkdir(parents=True, exist_ok=True)
    dest = results / "runner-eager-warmup-diagnosis.txt"
    dest.write_text(report.read_text())
    print(f"[bench_runner] wrote {dest} (rc={rc}, {wall:.0f} s)")


def profile_eager_moe(workdir: Path, results: Path, limit_s: int, tp: int = 1, batch: int = 64) -> None:
    """Where the host time of the eager MoE between layerwise segments goes: one decode batch of
    the Qwen3-30B-shaped model under layerwise-every-size, the eager steps under cProfile
    (SGLANG_SM120_LAYERWISE_PROFILE; the profiler inflates them, read it for proportions)."""
    model = write_model_dir(workdir / "qwen3-30b-a3b-shapes", QWEN3_30B_A3B)
    results.mkdir(parents=True, exist_ok=True)
    prof = results / "runner-eager-moe-profile.txt"
    cmd = one_batch_cmd(model, "profile", [batch], workdir / "profile.jsonl", tp, [
        "--cuda-graph-backend-decode", "layerwise", "--cuda-graph-layerwise-every-size",
        "--cuda-graph-backend-prefill", "disabled"])
    env = dict(os.environ, SGLANG_SM120_LAYERWISE_TIMING="1", SGLANG_SM120_LAYERWISE_PROFILE=str(prof))
    print(f"[bench_runner] eager MoE profile: {' '.join(cmd)}", flush=True)
    log = workdir / "profile.log"
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=limit_s).returncode
    host = [ln for ln in log.read_text(errors="replace").splitlines() if ln.startswith(LAYERWISE_HOST_TAG)]
    with open(prof, "a") as f:
        f.write(f"\ncommand: {' '.join(cmd)}\nrc: {rc}\n" + "\n".join(host) + "\n")
    print(f"[bench_runner] wrote {prof} (rc={rc})")
    if rc != 0:
        raise SystemExit(f"profile run failed (rc={rc}); log: {log}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="h200", help="results go to benchmarks/results/runner-TAG.json/.md")
    # Default order: `disabled` first, so its eager passes pay the first-use compiles (Triton MoE
    # kernels per config) that would otherwise land in whichever configuration captures first
    # (a layerwise prefill capture took 20x longer first than last on the H200).
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=DEFAULT_CONFIGS)
    ap.add_argument("--workdir", default=None, help="logs and the model config (default: a temp dir)")
    ap.add_argument("--timeout", type=int, default=900, help="per-configuration limit in seconds")
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel size of every configuration")
    ap.add_argument("--ep", type=int, default=1,
                    help="expert-parallel size of every configuration: 1 or the --tp size (sglang spreads "
                         "experts over the whole TP group)")
    ap.add_argument("--results-dir", default=str(RESULTS), help="where runner-TAG.json/.md go")
    ap.add_argument("--merge", nargs="+", metavar="TAG", default=None,
                    help="no GPU: merge the runs of runner-TAG.json files (same results dir) into --tag")
    ap.add_argument("--diagnose-eager-warmup", action="store_true")
    ap.add_argument("--profile-eager-moe", action="store_true",
                    help="cProfile the eager MoE steps of one layerwise decode batch (bs 64)")
    args = ap.parse_args(argv)
    if args.ep not in (1, args.tp):
        ap.error(f"--ep {args.ep}: expert parallelism spans the TP group, so it is 1 or --tp ({args.tp})")
    results = Path(args.results_dir)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench_runner_"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.diagnose_eager_warmup:
        diagnose_eager_warmup(workdir, limit_s=min(args.timeout, 400), results=results)
        return
    if args.profile_eager_moe:
        profile_eager_moe(workdir, results, limit_s=args.timeout, tp=args.tp)
        return
    out = results / f"runner-{args.tag}.json"
    result = json.loads(out.read_text()) if out.exists() else {"runs": {}}
    if args.merge:
        for tag in args.merge:
            part = results / f"runner-{tag}.json"
            if not part.exists():
                raise SystemExit(f"--merge {tag}: {part} does not exist")
            doc = json.loads(part.read_text())
            clash = set(doc["runs"]) & set(result["runs"])
            if clash and args.merge.index(tag) > 0:
                raise SystemExit(f"--merge {tag}: configuration(s) {sorted(clash)} already merged from another tag")
            result["runs"].update(doc["runs"])
            failed = result.setdefault("failed", {})
            failed.update(doc.get("failed", {}))
            for name in result["runs"]:
                failed.pop(name, None)
            for key in ("commit", "tp_size", "ep_size", "model", "device"):
                result.setdefault(key, doc.get(key))
        result["merged_from"] = args.merge
    else:
        model = write_model_dir(workdir / "qwen3-30b-a3b-shapes", QWEN3_30B_A3B)
        result.update(commit=commit(), tp_size=args.tp, ep_size=args.ep, device=device_name(), workdir=str(workdir),
                      command=" ".join([os.path.basename(sys.executable), *sys.argv]))
        failed = result.setdefault("failed", {})
        for name in args.configs:
            print(f"[bench_runner] configuration {name} ({args.configs.index(name) + 1}/{len(args.configs)})", flush=True)
            try:
                result["runs"][name] = run_one_batch(model, name, CONFIGS[name], workdir, args.timeout,
                                                     args.tp, args.ep)
                failed.pop(name, None)
            except SystemExit as e:  # one configuration's failure must not lose the others' figures
                print(f"[bench_runner] {name} FAILED: {e}", flush=True)
                failed[name] = str(e).splitlines()[0]
            # Saved after every configuration: a call stopped at the host's limit keeps what finished.
            write_results(out, result, args.tag)
        if failed:
            raise SystemExit(f"[bench_runner] failed configurations: {sorted(failed)}")
        return
    write_results(out, result, args.tag)


def write_results(out: Path, result: dict, tag: str) -> None:
    result.update(
        tag=tag,
        model=f"Qwen3-30B-A3B shapes (48 layers, 128 experts top-8), bf16, dummy weights, TP {result.get('tp_size', 1)}"
              + (f", EP {result['ep_size']}" if (result.get("ep_size") or 1) > 1 else ""),
        generated=utc_now(),
    )
    result["targets"] = compute_targets(result["runs"])
    out.parent.mkdir(parents=True, exist_ok=True)
    save(out, result)
    out.with_suffix(".md").write_text(render_md(result))
    print(f"[bench_runner] wrote {out} and {out.with_suffix('.md')}")
    for k, v in result["targets"].items():
        print(f"  {k}: {v['value']} (target {v['target']}) {'met' if v['met'] else 'NOT met'}")


if __name__ == "__main__":
    main()

"""Serving-matrix results: bench_serving records -> cells, targets, the markdown table and the plot.

A results document (benchmarks/results/serving-TAG.json):
    {"runs": {config: {"server": {...}, "cells": {"<concurrency>": cell}}}, "targets": {...}, ...}
A cell holds the curated numbers of one `python -m sglang.benchmark.serving` run (or "error").
"""
from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from pathlib import Path
from typing import Dict, List, Optional

from _results import ratio, target

CONCURRENCY = (1, 10, 256, 1024)
CONFIG_ORDER = ("upstream_default", "upstream_bs256", "layerwise")
# Keys of upstream 0.5.16's JSONL record (sglang/benchmark/serving.py, `result` dict) kept per cell.
REQUIRED = ("completed", "duration", "output_throughput", "total_throughput", "median_ttft_ms",
            "p99_ttft_ms", "median_itl_ms", "p99_itl_ms")
OPTIONAL = ("total_input_tokens", "total_output_tokens", "request_throughput", "mean_itl_ms",
            "median_tpot_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms", "max_concurrency",
            "concurrency", "max_output_tokens_per_s", "max_concurrent_requests",
            "clients")  # per-client summaries when a measurement ran several clients (_serving_client)
FAST_VS_BS256 = 1.15   # fork / upstream(max bs 256), output tok/s at concurrency 1024
NOT_SLOWER = 0.97      # fork / upstream default, output tok/s at every concurrency


def last_record(path: Path) -> dict:
    """bench_serving appends one JSON line per run to --output-file; the last is ours."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: bench_serving wrote no result line")
    return json.loads(lines[-1])


def parse_record(rec: dict, num_prompts: int) -> dict:
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ValueError(f"bench_serving record lacks {', '.join(missing)} (upstream format changed?)")
    cell = {k: rec[k] for k in REQUIRED + OPTIONAL if k in rec}
    cell["num_prompts"] = num_prompts
    cell["complete"] = rec["completed"] == num_prompts
    return cell


_DECODE_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] Decode batch.*?#running-req: (\d+)"
                          r".*?gen throughput \(token/s\): ([\d.]+)", re.M)


def server_decode_rate(log_path, t0: float, t1: float, min_running: int) -> Optional[dict]:
    """The scheduler's own decode throughput while [t0, t1] ran with >= min_running requests: its
    "Decode batch" lines (one per 40 steps, local time) -- what the GPU side delivered, whatever
    the HTTP stream and the client made of it. None when the log holds no such line."""
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return None
    lo, hi = (dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") for t in (t0, t1))
    rates = [float(m[3]) for m in _DECODE_LINE.finditer(text)
             if lo <= m[1] <= hi and int(m[2]) >= min_running]
    if len(rates) < 2:
        return None
    rates = rates[1:]  # the first line after a pause averages over the idle time before it
    return {"median_tok_s": round(statistics.median(rates), 1), "max_tok_s": round(max(rates), 1),
            "lines": len(rates), "min_running": min_running}


def cell(doc: dict, config: str, conc: int) -> Optional[dict]:
    return doc.get("runs", {}).get(config, {}).get("cells", {}).get(str(conc))


def value(doc: dict, config: str, conc: int, key: str = "output_throughput") -> Optional[float]:
    """A usable measurement: the cell exists, has no error and every request completed."""
    c = cell(doc, config, conc)
    if not c or "error" in c or not c.get("complete"):
        return None
    return c.get(key)


def compute_targets(doc: dict) -> Dict[str, dict]:
    t = {"output_tps_c1024_layerwise_vs_upstream_bs256": target(
        ratio(value(doc, "layerwise", 1024), value(doc, "upstream_bs256", 1024)),
        f">= {FAST_VS_BS256}", lambda v: v >= FAST_VS_BS256)}
    for c in CONCURRENCY:
        t[f"output_tps_c{c}_layerwise_vs_upstream_default"] = target(
            ratio(value(doc, "layerwise", c), value(doc, "upstream_default", c)),
            f">= {NOT_SLOWER}", lambda v: v >= NOT_SLOWER)
    return t


def _why_missing(doc: dict, config: str, conc: int) -> Optional[str]:
    c = cell(doc, config, conc)
    if c is None:
        return f"{config} at concurrency {conc} not measured"
    if "error" in c:
        return f"{config} at concurrency {conc} failed: {c['error'][:160]}"
    if not c.get("complete"):
        return f"{config} at concurrency {conc}: only {c.get('completed')} of {c.get('num_prompts')} requests completed"
    return None


def missed(doc: dict) -> List[str]:
    """One line per missed target saying why (a missing or failed measurement, or the ratio)."""
    out = []
    for name, t in doc["targets"].items():
        if t["met"]:
            continue
        conc = int(re.search(r"_c(\d+)_", name).group(1))
        other = "upstream_bs256" if "bs256" in name else "upstream_default"
        reasons = [r for r in (_why_missing(doc, "layerwise", conc), _why_missing(doc, other, conc)) if r]
        why = "; ".join(reasons) if reasons else f"measured {t['value']} (target {t['target']})"
        out.append(f"{name}: {why}")
    return out


def _fmt(v, digits=1) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def _power(c: dict) -> str:
    p = (c.get("gpu") or {}).get("power_w")
    if isinstance(p, dict):
        return f"{p['median']:.0f} / {p['max']:.0f}"
    return "not readable" if p else "-"


def _decode_rate(doc: dict, config: str, conc: int) -> Optional[float]:
    d = value(doc, config, conc, "server_decode")
    return d.get("median_tok_s") if isinstance(d, dict) else None


def _decode(c: dict) -> str:
    d = c.get("server_decode")
    return f"{d['median_tok_s']:,.0f} (>= {d['min_running']} running)" if isinstance(d, dict) else "-"


def _resolved(facts: dict) -> str:
    """What the server made of its flags: graph backends and sizes per phase, KV pool."""
    parts = []
    for phase, ph in sorted((facts.get("cuda_graph_config") or {}).items()):
        if isinstance(ph, dict):
            sizes = ph.get("bs") or []
            parts.append(f"{phase} {ph.get('backend')} max_bs {ph.get('max_bs')} ({len(sizes)} sizes)")
    if facts.get("max_total_num_tokens"):
        parts.append(f"KV pool {facts['max_total_num_tokens']:,} tokens")
    return "; ".join(parts) or "-"


def serving_path(doc: dict) -> str:
    """How requests reached the servers: one tokenizer process or one client can cap a figure."""
    w = doc.get("workload", {})
    procs = w.get("client_procs", 1)
    parts = [f"{procs} bench_serving client{'s' if procs > 1 else ''} per cell",
             "streamed" if w.get("stream", True) else "not streamed"]
    if w.get("server_args"):
        parts.append(f"every server also given {w['server_args']}")
    return ", ".join(parts)


def render_md(doc: dict) -> str:
    w = doc.get("workload", {})
    m = doc.get("model", {})
    lines = [f"# Serving benchmark ({doc.get('tag')})", "",
             f"{doc.get('device', 'unknown device')}; commit {doc.get('commit', 'unknown')}; generated {doc.get('generated')}.",
             f"Model: {m.get('description', '?')}. Workload: {w.get('description', '?')}; "
             f"{serving_path(doc)}.", "",
             "| config | concurrency | prompts | output tok/s | total tok/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | GPU W median / max | server decode tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    configs = [n for n in CONFIG_ORDER if n in doc.get("runs", {})]
    for conc in CONCURRENCY:
        for name in configs:
            c = cell(doc, name, conc)
            if c is None:
                continue
            if "error" in c:
                lines.append(f"| {name} | {conc} | - | failed: {c['error'][:80]} | | | | | |")
                continue
            done = f"{c['completed']}/{c['num_prompts']}"
            label = f"{name} (measured as {c['measured_as']})" if c.get("measured_as") else name
            lines.append(
                f"| {label} | {conc} | {done} | {_fmt(c['output_throughput'])} | {_fmt(c['total_throughput'])} | "
                f"{_fmt(c['median_ttft_ms'])} / {_fmt(c['p99_ttft_ms'])} | "
                f"{_fmt(c['median_itl_ms'], 2)} / {_fmt(c['p99_itl_ms'], 2)} | {_power(c)} | {_decode(c)} |")
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    lines += ["", "## Targets", "", "| target | value | threshold | met |", "|---|---|---|---|"]
    for k, v in doc["targets"].items():
        lines.append(f"| {k} | {v['value']} | {v['target']} | {'yes' if v['met'] else 'NO'} |")
    miss = missed(doc)
    lines += ["", "Missed: " + ("none." if not miss else "")] + [f"- {x}" for x in miss]
    lines += ["", "## Servers", "", "| config | ready s | flags | resolved |", "|---|---|---|---|"]
    for name in configs:
        s = doc["runs"][name].get("server", {})
        lines.append(f"| {name} | {_fmt(s.get('ready_s'), 0)} | `{' '.join(s.get('flags', []))}` | "
                     f"{s.get('error', '')[:120] or s.get('note') or _resolved(s.get('facts', {}))} |")
    lines += ["", "Reproduce: see docs/serving-bench.md. Invocations:", ""]
    lines += [f"- `{inv['command']}` ({inv.get('when')})" for inv in doc.get("invocations", [])]
    return "\n".join(lines) + "\n"


def plot_png(doc: dict, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("output_throughput", None, "output tok/s (client)"),
              ("server_decode", None, "decode tok/s at the scheduler (server log)"),
              ("median_itl_ms", "p99_itl_ms", "ITL ms (solid p50, dashed p99)"),
              ("median_ttft_ms", "p99_ttft_ms", "TTFT ms (solid p50, dashed p99)")]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    configs = [n for n in CONFIG_ORDER if n in doc.get("runs", {})]
    for ax, (key, p99, title) in zip(axes.flat, panels):
        for i, name in enumerate(configs):
            for k, style in ((key, "-o"), (p99, "--x")):
                if k is None:
                    continue
                pts = [(c, _decode_rate(doc, name, c) if k == "server_decode" else value(doc, name, c, k))
                       for c in CONCURRENCY]
                pts = [(c, v) for c, v in pts if v is not None]
                if pts:
                    ax.plot(*zip(*pts), style, color=f"C{i}", label=name if k == key else None)
        ax.set_xscale("log")
        ax.set_xticks(list(CONCURRENCY), [str(c) for c in CONCURRENCY])
        ax.set_xlabel("concurrency")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.set_yscale("log")  # 1 to 1024 requests span two decades; ratios read the same everywhere
    axes.flat[0].legend()
    fig.suptitle(f"{doc.get('model', {}).get('description', '')}\n{serving_path(doc)}\n"
                 f"{doc.get('device', '')}, commit {str(doc.get('commit', ''))[:10]}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_reports(doc: dict, json_path: Path) -> List[Path]:
    """Recompute targets, then write the .md and .png beside the JSON (not the JSON itself)."""
    doc["targets"] = compute_targets(doc)
    md = json_path.with_suffix(".md")
    md.write_text(render_md(doc))
    return [md, plot_png(doc, json_path.with_suffix(".png"))]

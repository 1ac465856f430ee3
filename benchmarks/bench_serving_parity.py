#!/usr/bin/env python3
"""Serving throughput where layerwise replays upstream's own full decode graphs (issue 43 item 7).

Up to upstream's full-graph ceiling (256 on an H200 at TP 1) the layerwise runner replays the same
full decode graphs upstream captures, so a server with the seed's flags should serve as fast as
upstream's configuration. Per model, one upstream server (no graph flags) and one layerwise server
(--enable-piecewise-cuda-graph) run side by side, each KV pool capped so both fit; at each
concurrency both are warmed, then measured ROUNDS times each, alternating which goes first
(upstream, layerwise / layerwise, upstream / ...), and the medians are compared.

    python benchmarks/bench_serving_parity.py --results-dir RESULTS \\
        [--models qwen3_moe-bf16 glm4_moe-bf16 deepseek_v2-bf16 qwen3-30b-a3b-nvfp4] \\
        [--concurrency 64 256] [--rounds 5]

Load: upstream's bench_serving client (random ids, IN input + OUT output tokens, greedy,
ignore_eos), 2 x concurrency prompts per measurement. A concurrency above the layerwise server's
logged full-graph ceiling is measured but has no target (layerwise graphs run there, not
upstream's). Writes RESULTS/serving-parity.json (+ .md), targets: layerwise / upstream median
output tok/s >= 0.97 per model and concurrency.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import _results
import _serving_report as report
import _serving_setup as setup
import bench_serving_matrix as matrix

CONFIGS: Dict[str, List[str]] = {"upstream": [], "layerwise": ["--enable-piecewise-cuda-graph"]}
DEFAULT_MODELS = ["qwen3_moe-bf16", "glm4_moe-bf16", "deepseek_v2-bf16", "qwen3-30b-a3b-nvfp4"]
FULLSIZE = "qwen3-30b-a3b-nvfp4"
NOT_SLOWER = report.NOT_SLOWER
INPUT_LEN = OUTPUT_LEN = 256
MEM_FRACTION = 0.7  # with the KV pools capped, the second server still finds its share free


def round_order(rounds: int) -> List[List[str]]:
    """Which configuration goes first in each round: alternating, upstream first in round 0."""
    names = list(CONFIGS)
    return [names if r % 2 == 0 else names[::-1] for r in range(rounds)]


def max_total_tokens(concurrencies: List[int], input_len: int, output_len: int) -> int:
    """A KV pool for the largest concurrency's two waves, so both servers fit side by side."""
    return 2 * max(concurrencies) * (input_len + output_len)


def summarize(cells: Dict[str, Dict[str, List[Optional[float]]]], full_ceiling: Optional[int]) -> Dict[str, dict]:
    """{conc: {config: [tok/s per round]}} -> {conc: medians, spread, ratio, on_full_graphs}."""
    out = {}
    for conc, by_config in cells.items():
        row: dict = {"on_full_graphs": full_ceiling is not None and int(conc) <= full_ceiling}
        for name, vals in by_config.items():
            got = [v for v in vals if v is not None]
            row[name] = {"rounds": vals, "median": round(statistics.median(got), 2) if got else None,
                         "spread": round(max(got) / min(got), 4) if len(got) > 1 and min(got) > 0 else None}
        row["ratio"] = _results.ratio(row.get("layerwise", {}).get("median"), row.get("upstream", {}).get("median"))
        out[conc] = row
    return out


def compute_targets(models: Dict[str, dict]) -> Dict[str, dict]:
    targets = {}
    for model, m in models.items():
        if "summary" not in m:  # the servers did not start or the rounds died: say so, never met
            targets[f"{model}_layerwise_vs_upstream"] = {
                **_results.target(None, f">= {NOT_SLOWER}", lambda v: False),
                "why_missing": m.get("error", "not measured")}
        for conc, row in m.get("summary", {}).items():
            if not row["on_full_graphs"]:
                continue
            t = _results.target(row["ratio"], f">= {NOT_SLOWER} (median of the rounds, output tok/s)",
                                lambda v: v >= NOT_SLOWER)
            if row["ratio"] is None:
                t["why_missing"] = m.get("error") or "a configuration has no successful round"
            targets[f"{model}_c{conc}_layerwise_vs_upstream"] = t
    return targets


def render_md(doc: dict) -> str:
    lines = [f"# Serving parity at full-graph sizes ({doc.get('gpu')})", "",
             f"- commit `{doc.get('commit')}`, {doc.get('date')}; {doc['rounds']} rounds per configuration, "
             f"alternating order; {doc['input_len']} in + {doc['output_len']} out tokens, 2 x concurrency prompts",
             "- upstream: no graph flags; layerwise: `--enable-piecewise-cuda-graph`; output tok/s, median "
             "of the rounds (spread = best / worst round)", "",
             "| model | conc | full graphs | upstream | spread | layerwise | spread | layerwise / upstream |",
             "|---|---|---|---|---|---|---|---|"]
    for model, m in doc["models"].items():
        if m.get("error"):
            lines.append(f"| {model} | - | - | {m['error'][:120]} | | | | |")
        for conc, row in m.get("summary", {}).items():
            u, lw = row.get("upstream", {}), row.get("layerwise", {})
            lines.append(f"| {model} | {conc} | {'yes' if row['on_full_graphs'] else 'no'} | {u.get('median')} | "
                         f"{u.get('spread')} | {lw.get('median')} | {lw.get('spread')} | {row['ratio']} |")
    return "\n".join(lines) + "\n"


def measure_once(srv, model_dir: str, served: str, conc: int, work: Path, a, warmup: bool = False) -> Optional[float]:
    """Output tok/s of one bench_serving_matrix cell on this server (None when it failed or
    was incomplete; the cell's log in `work` says why)."""
    cell = matrix.run_cell(srv, model_dir, served, conc, a, work, warmup=warmup)
    if cell.get("error") or not cell.get("complete"):
        print(f"[parity] {served}-c{conc}: {cell.get('error') or 'incomplete'}", flush=True)
        return None
    return cell["output_throughput"]


def run_rounds(concurrencies: List[int], rounds: int,
               measure: Callable[[str, int, int, bool], Optional[float]]) -> Dict[str, Dict[str, list]]:
    """measure(config, conc, round, warmup) at each concurrency: a warm-up per server, then the rounds."""
    cells: Dict[str, Dict[str, list]] = {}
    for conc in concurrencies:
        for name in CONFIGS:
            measure(name, conc, -1, True)
        cells[str(conc)] = {name: [None] * rounds for name in CONFIGS}
        for r, order in enumerate(round_order(rounds)):
            for name in order:
                cells[str(conc)][name][r] = measure(name, conc, r, False)
    return cells


def model_dir_of(name: str, work: Path) -> str:
    if name == FULLSIZE:
        return setup.prepare_model(setup.DEFAULT_MODEL_DIR, None)["dir"]
    from sglang.sm120.tiny import serving

    return str(serving.tiny_model(work / "models", *name.rsplit("-", 1)))


def run_model(name: str, a, work: Path) -> dict:
    from sglang.sm120.plan import compare

    model_dir = model_dir_of(name, work)
    flags = setup.common_flags(MEM_FRACTION) + ["--max-total-tokens",
                                                str(max_total_tokens(a.concurrency, a.input_len, a.output_len))]
    servers, row = {}, {"flags": flags, "configs": CONFIGS}
    try:
        for cfg, extra in CONFIGS.items():
            servers[cfg] = setup.start_server(f"{name}-{cfg}", model_dir, flags + extra, work / "logs",
                                              a.startup_timeout)
        logged = compare.logged(Path(servers["layerwise"].log_path).read_text(errors="replace"))
        ceiling = logged.get("decode", {}).get("full_max")
        row["layerwise_full_ceiling"] = ceiling

        def measure(cfg, conc, r, warmup):
            label = f"{name}-{cfg}-c{conc}-" + ("warmup" if warmup else f"r{r}")
            cell_dir = work / ("warmup" if warmup else f"r{r}")  # each round's bench_serving files kept
            cell_dir.mkdir(parents=True, exist_ok=True)
            v = measure_once(servers[cfg], model_dir, f"{name}-{cfg}", conc, cell_dir, a, warmup)
            print(f"[parity] {label}: {v} tok/s", flush=True)
            return v

        row["summary"] = summarize(run_rounds(a.concurrency, a.rounds, measure), ceiling)
    except Exception as e:  # noqa: BLE001 - recorded; the next model still runs
        row["error"] = f"{type(e).__name__}: {e}"[-1500:]
    finally:
        for srv in servers.values():
            srv.stop()
    return row


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--concurrency", nargs="+", type=int, default=[64, 256])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--input-len", type=int, default=INPUT_LEN)
    ap.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--cell-timeout", type=float, default=300)
    # bench_serving_matrix.run_cell's knobs: 2 x concurrency prompts, one streaming client
    ap.set_defaults(waves=2, client_procs=1, stream=True)
    ap.add_argument("--results-dir", default=str(_results.RESULTS))
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args(argv)
    if a.rounds < 1 or min(a.concurrency) < 1:
        ap.error("--rounds and every --concurrency must be at least 1")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    from _gpu_sampler import device_name

    setup.offline_env()
    work = Path(a.workdir or tempfile.mkdtemp(prefix="serving-parity-"))
    work.mkdir(parents=True, exist_ok=True)
    out = Path(a.results_dir) / "serving-parity.json"
    doc = {"benchmark": "serving-parity", "commit": _results.commit(), "date": _results.utc_now(),
           "gpu": device_name(), "rounds": a.rounds, "concurrency": a.concurrency, "input_len": a.input_len,
           "output_len": a.output_len, "models": {}}
    for name in a.models:
        t0 = time.time()
        doc["models"][name] = run_model(name, a, work)
        doc["models"][name]["wall_s"] = round(time.time() - t0, 1)
        doc["targets"] = compute_targets(doc["models"])
        _results.save(out, doc)
        out.with_suffix(".md").write_text(render_md(doc))
        print(f"[parity] {name}: done; wrote {out}", flush=True)
    missed = [k for k, t in doc["targets"].items() if not t["met"]]
    print(f"[parity] wrote {out}; targets missed: {missed or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

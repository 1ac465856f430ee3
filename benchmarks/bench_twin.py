#!/usr/bin/env python3
"""GLM-5 rank twin on one GPU held to a 96 GB card: upstream's full graphs vs layerwise decode.

    python benchmarks/bench_twin.py                       # everything, the issue's contexts
    python benchmarks/bench_twin.py --quick               # one process per configuration (256-token contexts)
    python benchmarks/bench_twin.py --configs layerwise --groups 256   # a piece; merges into the same file
    python benchmarks/bench_twin.py --configs layerwise_moe_sm120 layerwise_moe_marlin --skip histogram profile

The twin (python -m sglang.sm120.tiny.twin; one TP-8 rank of GLM-5-NVFP4 as a TP-1 model,
`--load-format dummy`, router spread by sglang.sm120.tiny.twin_router) runs under upstream's
one-batch benchmark, reusing bench_runner's command, log parsing and capture reports. Each
configuration runs alone on the GPU beside a ballast process (benchmarks/ballast.py) that
leaves the server an RTX PRO 6000's memory:

  upstream_ceiling   upstream's full decode graphs at the ceiling upstream resolves for GLM-5 at
                     TP 8 on that card (`plan`, faked card; eager above it)
  full_graphs_1024   upstream's full decode graphs raised to 1024
  layerwise          the fork's layerwise decode (full graphs up to its ceiling, layerwise to 1024)
  layerwise_moe_sm120 / layerwise_moe_marlin (by name only) layerwise with `--moe-runner-backend`
                     sm120 (the fork's grouped W4A16 MoE kernel) or marlin (upstream's NVFP4 MoE on SM90)

Decode at bs 1, 64, 256, 512, 1024 with ~256k context tokens in all, one process per context
group (one_batch takes one input length per run): 4096 tokens for bs 1 and 64, 1024 for 256,
512 for 512, 256 for 1024 (`--quick`: 256 for all). Prefill graphs are off in every
configuration (decode is the question). Per cell: median step ms, graph memory, capture s,
time to ready, fits or OOM, the KV pool (tokens). Then at bs 1024: the routing histogram
(counted in upstream_ceiling's eager bs-1024 decode, else in a graphs-off run of its own, so
capture warm-ups are not counted) and a torch-profiler split of layerwise's
decode step (MoE kernels, attention + indexer kernels, the rest; host time from the runner's
reports). Results: benchmarks/results/glm5-twin-h200.json (+ .md) with "targets".
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from _results import RESULTS, commit, ratio, save, target as _target, utc_now  # noqa: E402
import bench_runner  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DECODE_BS = [1, 64, 256, 512, 1024]
# input length -> batch sizes (one one_batch process each): ~256k context tokens at the large sizes
GROUPS: Dict[int, List[int]] = {4096: [1, 64], 1024: [256], 512: [512], 256: [1024]}
QUICK_GROUPS: Dict[int, List[int]] = {256: DECODE_BS}
OUTPUT_LEN = 8
PASSES = 2
CARD = "rtx-pro-6000"
MEM_FRACTION = "0.92"  # the field's (public GLM-5-NVFP4 TP8 deployment report)
HIST_BS = 1024
FALLBACK_UPSTREAM_CEILING = 256  # only when `plan` cannot resolve (recorded as such)
CONFIGS: Dict[str, List[str]] = {
    "upstream_ceiling": ["--cuda-graph-backend-decode", "full", "--cuda-graph-max-bs-decode", "{ceiling}",
                         "--cuda-graph-backend-prefill", "disabled"],
    "full_graphs_1024": ["--cuda-graph-backend-decode", "full", "--cuda-graph-max-bs-decode", "1024",
                         "--cuda-graph-backend-prefill", "disabled"],
    # full graphs up to the TP-8 rank's ceiling, as on the user's card (at TP 1 the runner would
    # take the twin's own, smaller one), per-layer graphs above it
    "layerwise": ["--cuda-graph-backend-decode", "layerwise", "--cuda-graph-max-bs-decode", "1024",
                  "--cuda-graph-config", '{"decode": {"layerwise_full_max_bs": {ceiling}}}',
                  "--cuda-graph-backend-prefill", "disabled"],
}
DEFAULT_CONFIGS = list(CONFIGS)
# By name only (issue 42): layerwise decode with the routed experts on the fork's grouped W4A16
# kernel against upstream's Marlin NVFP4 MoE, named explicitly (auto is Marlin on SM90 anyway).
for _backend in ("sm120", "marlin"):
    CONFIGS[f"layerwise_moe_{_backend}"] = CONFIGS["layerwise"] + ["--moe-runner-backend", _backend]
CONFIG_ENV = {name: {"SGLANG_SM120_LEAN_MOE": "1"} for name in CONFIGS if name.startswith("layerwise")}
KV_TOKENS_RE = re.compile(r"#tokens: (\d+)|max_total_num_tokens=(\d+)")
OOM_RE = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY", re.I)
MOE_KERNEL_RE = re.compile(r"moe|expert|grouped|topk_sigmoid|biased_grouped_topk|moe_fused_gate|"
                           r"count_and_sort|align_block", re.I)
ATTN_KERNEL_RE = re.compile(r"mla|nsa|indexer|mqa|sparse|attn|attention|flash|paged|rope|rotary|topk", re.I)


def ready_markers(log: str) -> Dict[str, bool]:
    return {"kv_pool": bool(KV_TOKENS_RE.search(log)),
            "decode_captured": any(p == "decode" for p, _, _ in bench_runner.CAPTURE_RE.findall(log))}


def one_batch_cmd(model_dir: Path, name: str, batch_sizes: List[int], input_len: int, jsonl: Path,
                  extra: List[str], passes: int = PASSES) -> List[str]:
    """bench_runner's one_batch command for the twin: run through the router prelude, upstream's
    attention choice (no --attention-backend), the field's memory fraction, `input_len` contexts."""
    cmd = bench_runner.one_batch_cmd(model_dir, name, batch_sizes * passes, jsonl, 1, extra)
    cmd = _set(cmd, "--input-len", str(input_len))
    cmd = _set(cmd, "--output-len", str(OUTPUT_LEN))
    cmd = _set(cmd, "--mem-fraction-static", MEM_FRACTION)
    i = cmd.index("--attention-backend")
    del cmd[i:i + 2]
    from sglang.sm120.tiny.twin_router import ONE_BATCH_PRELUDE

    assert cmd[1:3] == ["-m", "sglang.benchmark.one_batch"]
    return [cmd[0], "-c", ONE_BATCH_PRELUDE, *cmd[3:]]


def _set(cmd: List[str], flag: str, value: str) -> List[str]:
    i = cmd.index(flag)
    return cmd[:i + 1] + [value] + cmd[i + 2:]


def config_args(name: str, ceiling: int) -> List[str]:
    return [a.replace("{ceiling}", str(ceiling)) for a in CONFIGS[name]]


# ----------------------------------------------------------------------------- running

class Ballast:
    """benchmarks/ballast.py for the length of one configuration's process."""

    def __init__(self, workdir: Path, card: str = CARD):
        self.ready = workdir / "ballast.json"
        self.cmd = [sys.executable, str(REPO / "benchmarks" / "ballast.py"), "--card", card,
                    "--ready-file", str(self.ready)]
        self.proc = None
        self.info = None

    def __enter__(self):
        self.ready.unlink(missing_ok=True)
        self.proc = subprocess.Popen(self.cmd)
        for _ in range(240):
            if self.ready.exists():
                self.info = json.loads(self.ready.read_text())
                return self
            if self.proc.poll() is not None:
                raise SystemExit(f"ballast exited (rc={self.proc.returncode}) before holding memory")
            time.sleep(0.5)
        raise SystemExit("ballast not ready after 120 s")

    def __exit__(self, *exc):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return False


def run_process(cmd: List[str], env: dict, log_path: Path, timeout: int):
    """Run, streaming to log_path; returns (rc, wall_s, first time each ready marker appeared)."""
    t0 = time.time()
    seen: Dict[str, float] = {}
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            if time.time() - t0 > timeout:
                proc.kill()
                proc.wait()
                return "timeout", time.time() - t0, seen
            text = log_path.read_text(errors="replace")
            for k, hit in ready_markers(text).items():
                if hit and k not in seen:
                    seen[k] = round(time.time() - t0, 1)
            time.sleep(0.5)
    text = log_path.read_text(errors="replace")
    for k, hit in ready_markers(text).items():
        if hit and k not in seen:
            seen[k] = round(time.time() - t0, 1)
    return proc.returncode, time.time() - t0, seen


def assemble_cell(name: str, input_len: int, batch_sizes: List[int], rc, wall: float, seen: Dict[str, float],
                  log: str, rows: List[dict], probe: Optional[dict], ballast: Optional[dict], cmd: List[str]) -> dict:
    """One process's results (a configuration at one context length) from its outputs."""
    decode, _, samples = bench_runner.summarize_rows(rows, decode_bs=batch_sizes, prefill_bs={})
    capture, host, totals = bench_runner.parse_capture_log(log)
    kv = next((int(a or b) for a, b in KV_TOKENS_RE.findall(log)), None)
    oom = rc != 0 and bool(OOM_RE.search(log))
    status = "ok" if rc == 0 else ("oom" if oom else f"failed rc={rc}")
    ready = seen.get("decode_captured", seen.get("kv_pool"))
    return {
        "config": name, "input_len": input_len, "batch_sizes": batch_sizes, "status": status,
        "fits": rc == 0, "rc": rc, "wall_s": round(wall, 1), "time_to_ready_s": ready, "markers_s": seen,
        "kv_pool_tokens": kv, "decode_s": decode, "samples": samples["decode_s"],
        "decode_capture_s": totals["decode"]["capture_s"], "decode_graph_mem_gb": totals["decode"]["graph_mem_gb"],
        "capture": capture, "host_step": host, "probe": probe, "ballast": ballast,
        "command": " ".join(cmd[:2] + ["<prelude>"] + cmd[3:]),
        "log_tail": log[-2000:] if rc != 0 else None,
    }


def run_cell(model_dir: Path, name: str, input_len: int, batch_sizes: List[int], workdir: Path, timeout: int,
             ceiling: int, passes: int, extra_env: Optional[dict] = None, extra_args: Optional[List[str]] = None,
             label: Optional[str] = None) -> dict:
    label = label or f"{name}-ctx{input_len}"
    jsonl, log_path, probe_path = (workdir / f"{label}.{ext}" for ext in ("jsonl", "log", "probe.json"))
    for p in (jsonl, probe_path):
        p.unlink(missing_ok=True)
    args = config_args(name, ceiling) + (extra_args or [])
    cmd = one_batch_cmd(model_dir, label, batch_sizes, input_len, jsonl, args, passes)
    trap_log = workdir / f"{label}.traps.jsonl"
    trap_log.unlink(missing_ok=True)
    env = dict(os.environ, SGLANG_SM120_LAYERWISE_TIMING="1", SGLANG_SM120_TWIN_PROBE=str(probe_path),
               SGLANG_SM120_TRAPS="log", SGLANG_SM120_TRAP_LOG=str(trap_log),
               **CONFIG_ENV.get(name, {}), **(extra_env or {}))
    print(f"[bench_twin] {label}: {' '.join(cmd[3:])}", flush=True)
    with Ballast(workdir) as ballast:
        rc, wall, seen = run_process(cmd, env, log_path, timeout)
    log = log_path.read_text(errors="replace")
    rows = [json.loads(x) for x in jsonl.read_text().splitlines() if x.strip()] if jsonl.exists() else []
    probe = json.loads(probe_path.read_text()) if probe_path.exists() else None
    cell = assemble_cell(name, input_len, batch_sizes, rc, wall, seen, log, rows, probe, ballast.info, cmd)
    cell["trap_hits"] = len(trap_log.read_text().splitlines()) if trap_log.exists() else 0
    return cell


def upstream_ceiling() -> dict:
    """Upstream's decode ceiling for real GLM-5 at TP 8 on the 96 GB card (the fork's `plan`,
    upstream's own resolution with the card faked)."""
    cmd = [sys.executable, "-m", "sglang.sm120", "plan", "--model-path", "glm-5", "--gpu", CARD,
           "--tp-size", "8", "--json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
        plan = json.loads(out)
        return {"ceiling": plan["upstream"]["full_graph_ceiling"], "rule": plan["upstream"]["ceiling_rule"],
                "chunked_prefill_size": plan["upstream"]["chunked_prefill_size"], "source": " ".join(cmd[1:])}
    except (subprocess.SubprocessError, ValueError, KeyError) as e:
        return {"ceiling": FALLBACK_UPSTREAM_CEILING, "rule": f"fallback ({type(e).__name__}: plan did not resolve)",
                "source": " ".join(cmd[1:])}


# ----------------------------------------------------------------------------- profile split

def kernel_split(trace_paths: List[str]) -> dict:
    """GPU kernel time of torch-profiler traces, by category (MoE, attention incl. the DSA
    indexer, other), by kernel name; the names are kept (top 40) so the split can be redone."""
    by_name: Dict[str, float] = {}
    for p in trace_paths:
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "rt") as f:
            events = json.load(f).get("traceEvents", [])
        for ev in events:
            if ev.get("cat") == "kernel" and "dur" in ev:
                by_name[ev["name"]] = by_name.get(ev["name"], 0.0) + float(ev["dur"])
    cats = {"moe_us": 0.0, "attention_us": 0.0, "other_us": 0.0}
    for name, us in by_name.items():
        key = "moe_us" if MOE_KERNEL_RE.search(name) else "attention_us" if ATTN_KERNEL_RE.search(name) else "other_us"
        cats[key] += us
    total = sum(cats.values())
    return {**{k: round(v, 1) for k, v in cats.items()}, "gpu_total_us": round(total, 1),
            "fractions": {k[:-3]: round(v / total, 4) if total else None for k, v in cats.items()},
            "top_kernels_us": dict(sorted(((k, round(v, 1)) for k, v in by_name.items()), key=lambda kv: -kv[1])[:40]),
            "note": "kernel categories by name (MOE_KERNEL_RE, then ATTN_KERNEL_RE); host time is the runner's "
                    "SM120_LAYERWISE_HOST report"}


def run_profile(model_dir: Path, workdir: Path, timeout: int, ceiling: int) -> dict:
    prof_dir = workdir / "profile"
    prof_dir.mkdir(exist_ok=True)
    for f in prof_dir.glob("*.trace.json*"):
        f.unlink()
    cell = run_cell(model_dir, "layerwise", 256, [HIST_BS], workdir, timeout, ceiling, 1,
                    extra_env={"SGLANG_TORCH_PROFILER_DIR": str(prof_dir)},
                    extra_args=["--profile", "--profile-stage", "decode"], label="profile-layerwise-bs1024")
    traces = sorted(glob.glob(str(prof_dir / "*.trace.json*")))
    cell["kernel_split"] = kernel_split(traces) if traces else None
    cell["traces"] = [os.path.basename(t) for t in traces]
    return cell


def run_histogram(model_dir: Path, workdir: Path, timeout: int, ceiling: int) -> dict:
    """Routing at bs 1024 with graphs off (capture warm-ups would count their fake batches)."""
    return run_cell(model_dir, "layerwise", 256, [HIST_BS], workdir, timeout, ceiling, 1,
                    extra_env={"SGLANG_SM120_TWIN_HISTOGRAM_BS": str(HIST_BS)},
                    extra_args=["--disable-cuda-graph"], label="histogram-eager-bs1024")


# ----------------------------------------------------------------------------- targets

def cell_ms(cells: Dict[str, dict], config: str, bs: int) -> Optional[float]:
    for c in cells.values():
        if c["config"] == config and c["status"] == "ok" and c["decode_s"].get(str(bs)) is not None:
            return round(c["decode_s"][str(bs)] * 1e3, 3)
    return None


def _config_max(cells: Dict[str, dict], config: str, key: str) -> Optional[float]:
    vals = [c[key] for c in cells.values() if c["config"] == config and c["status"] == "ok" and c.get(key) is not None]
    return max(vals) if vals else None


def histogram_of(doc: dict) -> dict:
    """The routing histogram's per-layer summaries, wherever the run recorded it ({} if none)."""
    return ((doc.get("histogram") or {}).get("probe") or {}).get("histogram") or {}


def compute_targets(doc: dict) -> Dict[str, dict]:
    cells, t = doc.get("cells", {}), {}
    lw_fits = cell_ms(cells, "layerwise", 1024) is not None
    t["layerwise_decode_bs1024_in_96gb"] = _target(1.0 if lw_fits else 0.0, "== 1 (bs 1024 decoded)", lambda v: v == 1)
    lw_mem, full_mem = _config_max(cells, "layerwise", "decode_graph_mem_gb"), _config_max(cells, "full_graphs_1024", "decode_graph_mem_gb")
    t["decode_graph_mem_layerwise_vs_full_1024"] = _target(ratio(lw_mem, full_mem), "<= 0.5", lambda v: v <= 0.5)
    if full_mem is None:
        t["decode_graph_mem_layerwise_vs_full_1024"]["note"] = "full graphs at 1024 did not fit or did not run"
    for bs in DECODE_BS:
        full = cell_ms(cells, "full_graphs_1024", bs)
        ceiling = doc.get("upstream_ceiling", {}).get("ceiling") or 0
        if full is None and bs <= ceiling:
            full = cell_ms(cells, "upstream_ceiling", bs)
        lw = cell_ms(cells, "layerwise", bs)
        if full is not None and lw is not None:
            t[f"step_time_layerwise_vs_full_bs{bs}"] = _target(ratio(lw, full), "<= 1.05", lambda v: v <= 1.05)
    t["decode_capture_s_layerwise"] = _target(_config_max(cells, "layerwise", "decode_capture_s"), "<= 60", lambda v: v <= 60)
    lw_cells = [c for c in cells.values() if c["config"] == "layerwise"]
    t["trap_hits_layerwise"] = _target(sum(c.get("trap_hits", 0) for c in lw_cells) if lw_cells else None,
                                       "== 0", lambda v: v == 0)
    kv = [c["kv_pool_tokens"] for c in cells.values() if c.get("kv_pool_tokens")]
    field = doc.get("field", {}).get("kv_tokens")
    t["kv_pool_vs_96gb_card"] = _target(ratio(min(kv), field) if kv and field else None, "0.85..1.15",
                                        lambda v: 0.85 <= v <= 1.15)
    t["kv_pool_vs_96gb_card"]["measure"] = "twin's KV pool (tokens, smallest over its runs) / the field's ~314k at 0.92"
    probes = [c.get("probe") for c in list(cells.values()) + [doc.get("histogram") or {}, doc.get("profile") or {}]]
    probes = [p for p in probes if p]
    t["no_nonfinite_logits"] = _target(None if not probes else float(not any(p["nonfinite_logits"] for p in probes)),
                                       "== 1 (no NaN/Inf in any step of any run)", lambda v: v == 1)
    hist = histogram_of(doc)
    if hist:
        from sglang.sm120.tiny.twin_router import spread_ok

        ok = all(spread_ok(h) for h in hist.values())
        worst = max(h["max_over_mean"] or 99 for h in hist.values())
        t["router_spread_bs1024"] = dict(_target(worst, "<= 3.0 and every expert hit", lambda v: v <= 3.0 and ok),
                                         measure="largest per-expert count / mean, first and last MoE layer")
    else:
        t["router_spread_bs1024"] = _target(None, "<= 3.0 and every expert hit", lambda v: False)
    return t


# ----------------------------------------------------------------------------- report

def render_md(doc: dict) -> str:
    cells = doc.get("cells", {})
    names = [n for n in CONFIGS if any(c["config"] == n for c in cells.values())]
    lines = [f"# GLM-5 rank twin ({doc.get('variant')}) on {doc.get('device')}, held to a 96 GB card", "",
             f"commit {doc.get('commit')}; generated {doc.get('generated')}; upstream ceiling "
             f"{doc.get('upstream_ceiling', {}).get('ceiling')} ({doc.get('upstream_ceiling', {}).get('rule')}).", "",
             "## Decode step, median (ms)", "", "| bs | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for bs in DECODE_BS:
        lines.append(f"| {bs} | " + " | ".join(_fmt(cell_ms(cells, n, bs)) for n in names) + " |")
    lines += ["", "## Runs", "", "| run | status | ctx | KV tokens | decode graph GB | capture s | ready s | traps |",
              "|---|---|---|---|---|---|---|---|"]
    for label, c in cells.items():
        lines.append(f"| {label} | {c['status']} | {c['input_len']} | {c['kv_pool_tokens']} | {c['decode_graph_mem_gb']} | "
                     f"{c['decode_capture_s']} | {c['time_to_ready_s']} | {c.get('trap_hits')} |")
    prof = (doc.get("profile") or {}).get("kernel_split")
    if prof:
        lines += ["", "## Layerwise decode at bs 1024: GPU time by kernel category", "",
                  f"MoE {prof['moe_us']} us, attention + indexer {prof['attention_us']} us, other {prof['other_us']} us "
                  f"(fractions {prof['fractions']})."]
    lines += ["", "## Targets", "", "| target | value | threshold | met |", "|---|---|---|---|"]
    for k, v in doc.get("targets", {}).items():
        lines.append(f"| {k} | {v['value']} | {v['target']} | {'yes' if v['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def _fmt(x):
    return "-" if x is None else f"{x:.2f}"


def write_results(out: Path, doc: dict) -> None:
    doc["generated"] = utc_now()
    doc["targets"] = compute_targets(doc)
    save(out, doc)
    out.with_suffix(".md").write_text(render_md(doc))
    print(f"[bench_twin] wrote {out}")
    for k, v in doc["targets"].items():
        print(f"  {k}: {v['value']} (target {v['target']}) {'met' if v['met'] else 'NOT met'}")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", default="experts-fp4", choices=("experts-fp4", "all-fp4"))
    ap.add_argument("--configs", nargs="*", choices=list(CONFIGS), default=DEFAULT_CONFIGS,
                    help="default: " + " ".join(DEFAULT_CONFIGS) + "; layerwise_moe_sm120 / layerwise_moe_marlin "
                    "compare the MoE backends (experts-fp4 variant); none: only the histogram and profile runs")
    ap.add_argument("--groups", nargs="+", type=int, help="context lengths to run (default: all of the plan)")
    ap.add_argument("--quick", action="store_true", help="one process per configuration, 256-token contexts")
    ap.add_argument("--skip", nargs="*", default=[], choices=("histogram", "profile"))
    ap.add_argument("--timeout", type=int, default=900, help="per process, seconds")
    ap.add_argument("--passes", type=int, default=PASSES)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(RESULTS / "glm5-twin-h200.json"))
    return ap.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    from sglang.sm120.tiny import twin

    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="bench_twin_"))
    model = workdir / f"glm5-twin-{a.variant}"
    if not (model / "config.json").exists():
        twin.write(str(model), a.variant)
    out = Path(a.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    if doc.get("variant") not in (None, a.variant):
        raise SystemExit(f"{out} holds variant {doc['variant']}; pass another --out for {a.variant}")
    weights = twin.weight_bytes(a.variant)
    doc.update(variant=a.variant, commit=commit(), device=bench_runner.device_name(), workdir=str(workdir),
               model=f"GLM-5 rank twin (TP 8 rank as TP 1), {a.variant}, dummy weights, router spread",
               weight_bytes=weights, field={"weight_gb": twin.FIELD_WEIGHT_GB, "kv_tokens": twin.FIELD_KV_TOKENS,
                                            "mem_fraction_static": twin.FIELD_MEM_FRACTION},
               card=CARD, command=" ".join([os.path.basename(sys.executable), *sys.argv]))
    print(twin.render_bytes(a.variant, weights), flush=True)
    doc.setdefault("upstream_ceiling", upstream_ceiling())
    ceiling = doc["upstream_ceiling"]["ceiling"]
    groups = QUICK_GROUPS if a.quick else {k: v for k, v in GROUPS.items() if not a.groups or k in a.groups}
    cells = doc.setdefault("cells", {})
    for name in a.configs:
        for input_len, sizes in groups.items():
            label = f"{name}-ctx{input_len}"
            # upstream's full graphs stop below HIST_BS, so its bs-1024 decode is eager and the gates'
            # hooks see the real routing: the histogram comes with that run, not a process of its own
            hist = "histogram" not in a.skip and name == "upstream_ceiling" and ceiling < HIST_BS <= max(sizes)
            cells[label] = run_cell(model, name, input_len, sizes, workdir, a.timeout, ceiling, a.passes,
                                    extra_env={"SGLANG_SM120_TWIN_HISTOGRAM_BS": str(HIST_BS)} if hist else None)
            if hist and histogram_of({"histogram": cells[label]}):
                doc["histogram"] = {"from": label, "probe": cells[label]["probe"]}
            write_results(out, doc)  # after every process: a call stopped at its limit keeps what finished
    if "histogram" not in a.skip and not histogram_of(doc):
        doc["histogram"] = run_histogram(model, workdir, a.timeout, ceiling)
        write_results(out, doc)
    if "profile" not in a.skip:
        doc["profile"] = run_profile(model, workdir, a.timeout, ceiling)
        write_results(out, doc)


if __name__ == "__main__":
    main()

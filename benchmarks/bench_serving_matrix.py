#!/usr/bin/env python3
"""End-to-end serving benchmark: upstream vs the fork's layerwise runner, one server per configuration.

Model: random-weight ModelOpt NVFP4 with Qwen3-30B-A3B's shapes (48 layers, 128 experts top-8,
vocab 151,936), built on the GPU by `python -m sglang.sm120.tiny.fullsize` (reused when present).
Load: upstream's own client, `python -m sglang.benchmark.serving --backend sglang` with the
`random-ids` dataset and `--tokenize-prompt` (random token ids sent as input_ids: exact lengths and
no download; the `random` dataset samples ShareGPT text and would fetch it from the Hub), fixed
seed, 256 input + 256 output tokens, greedy, ignore_eos (every request generates 256 tokens).
Prompts per concurrency: max(8, 2 x concurrency) -- two waves -- so a configuration's four
concurrencies take ~2-4 minutes after its server is ready.

Configurations (server flags in _serving_setup.CONFIGS, common flags: FlashInfer attention,
--max-running-requests 1024, --mem-fraction-static 0.80 so the KV pool holds 1024 x 512 tokens
many times over, --watchdog-timeout 1200):
  upstream_default   no graph flags
  upstream_bs256     --cuda-graph-max-bs 256
  layerwise          --cuda-graph-backend-decode layerwise --cuda-graph-backend-prefill layerwise

Results: benchmarks/results/serving-TAG.json (+ .md, .png), saved after every measurement and
merged across invocations, so each GPU-host command can run a subset:
    python benchmarks/bench_serving_matrix.py --tag h200 --configs upstream_default
    python benchmarks/bench_serving_matrix.py --tag h200 --configs layerwise --concurrency 256 1024
    python benchmarks/bench_serving_matrix.py --tag h200 --merge h200-a h200-b     # no GPU
    python benchmarks/bench_serving_matrix.py --plot-only benchmarks/results/serving-h200.json
See docs/serving-bench.md.
"""
from __future__ import annotations

import argparse
import copy
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import _results
import _serving_client as client
import _serving_report as report
import _serving_setup as setup
import soak
from _gpu_sampler import GpuSampler, device_name

from sglang.sm120 import launcher

INPUT_LEN = OUTPUT_LEN = 256
WAVES, MIN_PROMPTS = 2, 8
SEED = 1
MODEL_DESCRIPTION = ("Qwen3-30B-A3B shapes (48 layers, 128 experts top-8, vocab 151936), ModelOpt NVFP4, "
                     "random weights from sglang.sm120.tiny.fullsize")


def num_prompts(conc: int, waves: int = WAVES) -> int:
    return max(MIN_PROMPTS, waves * conc)


def bench_command(port: int, model_dir: str, served: str, conc: int, prompts: int, out_file: Path,
                  input_len: int = INPUT_LEN, output_len: int = OUTPUT_LEN, seed: int = SEED,
                  stream: bool = True, details: bool = False) -> List[str]:
    return client.command(port, model_dir, served, conc, prompts, out_file, input_len, output_len, seed,
                          stream, details)


def cell_timeout(a, elapsed: float) -> float:
    """--cell-timeout, shortened under --time-budget so a run started late still ends (with its
    error recorded) about 150 s after the budget, inside the host's command limit."""
    if not a.time_budget:
        return a.cell_timeout
    return max(60.0, min(a.cell_timeout, a.time_budget + 150 - elapsed))


def run_cell(srv, model_dir: str, name: str, conc: int, a, workdir: Path, warmup: bool = False,
             timeout: float = None) -> dict:
    """One measurement: bench_serving as --client-procs processes (one for the warm-up). warmup:
    the same prompt shape at this concurrency but 16 output tokens, so first-use costs (kernel
    JIT, allocator growth at the largest batch) are paid before anything is measured."""
    prompts = conc if warmup else num_prompts(conc, a.waves)
    label = f"{name}-warmup-c{conc}" if warmup else f"{name}-c{conc}"
    parts = client.split(conc, prompts, 1 if warmup else a.client_procs)
    outs = [workdir / (f"{label}.jsonl" if len(parts) == 1 else f"{label}-p{i}.jsonl") for i in range(len(parts))]
    cmds = []
    for i, ((c, n), out_file) in enumerate(zip(parts, outs)):
        out_file.unlink(missing_ok=True)
        cmds.append(bench_command(srv.port, model_dir, name, c, n, out_file, a.input_len,
                                  min(16, a.output_len) if warmup else a.output_len,
                                  (a.seed + 1 if warmup else a.seed) + 1000 * i, a.stream, len(parts) > 1))
    print(f"[bench] {label}: {prompts} prompts" + (f" over {len(parts)} clients" if len(parts) > 1 else ""), flush=True)
    t0 = time.time()
    with GpuSampler() as gpu:
        rc, out = client.run_all(cmds, timeout or a.cell_timeout)
    t1 = time.time()
    (workdir / f"{label}.log").write_text(str(out))
    base = {"command": " ".join(cmds[0]) + (f"  (x{len(cmds)} clients, seeds +1000 each)" if len(cmds) > 1 else ""),
            "wall_s": round(t1 - t0, 1), "gpu": gpu.summary,
            "server_decode": report.server_decode_rate(srv.log_path, t0, t1, min_running=max(1, int(0.9 * conc)))}
    if rc != 0:
        return {**base, "error": f"bench_serving exit {rc}; server alive: {srv.alive()}; tail: {str(out)[-600:]}"}
    try:
        cell = report.parse_record(client.merge_records([report.last_record(f) for f in outs]), prompts)
    except (OSError, ValueError, KeyError) as e:
        return {**base, "error": f"unreadable bench_serving result: {e}"}
    if not a.stream:  # one response per request: no first token, no inter-token gaps to time
        cell.update({k: None for k in client.LATENCY_KEYS if k in cell})
    return {**base, **cell, "streamed": a.stream, "client_procs": len(parts)}


def save(doc: dict, out: Path, copy_to: str = None) -> None:
    doc["generated"] = _results.utc_now()
    doc["targets"] = report.compute_targets(doc)
    _results.save(out, doc)
    files = [out] + report.write_reports(doc, out)
    if copy_to:
        os.makedirs(copy_to, exist_ok=True)
        for f in files:
            shutil.copy(f, copy_to)


def measure(a, doc: dict, out: Path) -> None:
    setup.offline_env()
    t_start = time.time()
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="serving_matrix_"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = setup.prepare_model(a.model_dir, a.layers)
    kv_needed = 1024 * (a.input_len + a.output_len)
    check_same_setup(doc, a, model)
    doc["model"] = {**model, "description": MODEL_DESCRIPTION if not a.layers else
                    MODEL_DESCRIPTION.replace("48 layers", f"{a.layers} layers (reduced)"),
                    "kv_bytes_per_token": setup.kv_bytes_per_token(a.model_dir)}
    doc["workload"] = {
        "description": f"bench_serving random-ids, {a.input_len} in + {a.output_len} out tokens, "
                       f"seed {a.seed}, greedy, ignore_eos, max(8, {a.waves} x concurrency) prompts",
        "input_len": a.input_len, "output_len": a.output_len, "seed": a.seed, "waves": a.waves,
        "stream": a.stream, "client_procs": a.client_procs, "server_args": a.server_args,
        "kv_tokens_needed_at_1024": kv_needed}
    doc.setdefault("invocations", []).append({"command": " ".join([os.path.basename(sys.executable), *sys.argv]),
                                              "when": _results.utc_now(), "commit": _results.commit()})
    doc.update(commit=_results.commit(), device=device_name())
    fingerprints = resolve_configs(a) if a.dedupe and len(a.configs) > 1 else {}
    measured_here = {}  # fingerprint -> the configuration measured with it in this invocation
    for name in a.configs:
        if a.time_budget and time.time() - t_start > a.time_budget:
            print(f"[bench] time budget ({a.time_budget}s) spent: skipping {name}", flush=True)
            continue
        flags = config_flags(a, name)
        fp = fingerprints.get(name)
        if fp in measured_here:
            alias_run(doc, name, measured_here[fp], flags, fp)
            save(doc, out, a.copy_to)
            continue
        run = doc["runs"].setdefault(name, {"cells": {}})
        if fp:
            measured_here[fp] = name
            run["resolved_args_sha256"] = fp
        try:
            srv = setup.start_server(name, a.model_dir, flags, workdir, a.startup_timeout)
        except launcher.ServerError as e:
            run["server"] = {"flags": flags, "error": str(e)[-2000:]}
            save(doc, out, a.copy_to)
            print(f"[bench] {name}: server failed to start; see the results file", flush=True)
            continue
        try:
            facts = setup.server_facts(srv.url)
            run["server"] = {"flags": flags, "ready_s": round(srv.ready_seconds, 1), "facts": facts}
            if a.warmup:
                warm = run_cell(srv, a.model_dir, name, max(a.concurrency), a, workdir, warmup=True,
                                timeout=cell_timeout(a, time.time() - t_start))
                run["server"]["warmup"] = {k: warm.get(k) for k in ("wall_s", "completed", "error") if k in warm}
            pool = facts.get("max_total_num_tokens")
            if isinstance(pool, int) and pool < kv_needed:
                print(f"[bench] WARNING {name}: KV pool {pool} tokens < {kv_needed} needed at concurrency 1024; "
                      f"raise --mem-fraction-static", flush=True)
            for conc in a.concurrency:
                if a.time_budget and time.time() - t_start > a.time_budget:
                    print(f"[bench] time budget spent: skipping {name} concurrency {conc}", flush=True)
                    continue
                run["cells"][str(conc)] = c = run_cell(srv, a.model_dir, name, conc, a, workdir,
                                                       timeout=cell_timeout(a, time.time() - t_start))
                print(f"[bench] {name} c={conc}: " + (c.get("error") or
                      f"{c['output_throughput']:.0f} out tok/s, ITL p50 {c['median_itl_ms']:.2f} ms"), flush=True)
                if not srv.alive():
                    for rest in a.concurrency[a.concurrency.index(conc) + 1:]:
                        run["cells"][str(rest)] = {"error": f"server died during concurrency {conc}"}
                    save(doc, out, a.copy_to)
                    break
                save(doc, out, a.copy_to)
            if a.then_soak and name == "layerwise":
                soak_this_server(a, srv, model, flags)
        finally:
            shut = srv.stop()
            run.setdefault("server", {"flags": flags})["shutdown"] = {"clean": shut.clean, "seconds": round(shut.seconds, 1)}
            if a.copy_to:
                tail = launcher.log_tail(srv.log_path, 400)
                Path(a.copy_to, f"{out.stem}-{name}.server.log").write_text(tail)
            save(doc, out, a.copy_to)


def config_flags(a, name: str) -> List[str]:
    flags = setup.common_flags(a.mem_fraction_static) + setup.CONFIGS[name] + shlex.split(a.server_args)
    if a.then_soak and name == "layerwise":
        flags.append("--reject-unknown-model")  # the soak's unknown-model cases want a 404 (soak.py)
    return flags


def resolve_configs(a) -> dict:
    """{config: fingerprint of its resolved ServerArgs} for the configurations that resolved."""
    out = {}
    for name in a.configs:
        try:
            out[name] = setup.fingerprint(setup.resolve_server_args(a.model_dir, config_flags(a, name)))
        except RuntimeError as e:
            print(f"[bench] {name}: {e}; it gets its own server", flush=True)
    return out


def alias_run(doc: dict, name: str, same_as: str, flags: List[str], fp: str) -> None:
    """`name` resolves to exactly the server arguments of `same_as`, measured just before in this
    invocation: launching it again would start the same server, so its cells are that server's."""
    src = doc["runs"][same_as]
    print(f"[bench] {name}: its flags resolve to the same server arguments as {same_as} (sha256 {fp[:12]}); "
          f"reporting {same_as}'s measurements for it instead of starting the same server again", flush=True)
    doc["runs"][name] = {
        "same_server_as": same_as, "resolved_args_sha256": fp,
        "server": {"flags": flags, "note": f"not started: ServerArgs resolve identically to {same_as}'s "
                   f"(differences only in {', '.join(setup.INPUT_ONLY_FIELDS)}, --served-model-name and --port)"},
        "cells": {c: {**v, "measured_as": same_as} for c, v in copy.deepcopy(src.get("cells", {})).items()}}


def soak_this_server(a, srv, model: dict, flags: List[str]) -> None:
    """The soak (benchmarks/soak.py) on the layerwise server once its cells are measured: one
    server start fewer on the GPU host. Writes soak-TAG.json."""
    sa = soak.parse_args(["--tag", a.tag, "--minutes", str(a.then_soak), "--results-dir", a.results_dir,
                          "--model-dir", a.model_dir, "--drain-timeout", str(a.soak_drain_timeout),
                          "--warmup-minutes", str(a.soak_warmup_minutes)]
                         + (["--copy-to", a.copy_to] if a.copy_to else []))
    doc = soak.new_doc(sa, model, "layerwise", flags)
    doc["server"]["shared_with"] = f"serving-{a.tag}.json's layerwise server, after its cells were measured"
    try:
        soak.run_soak(sa, srv, model, doc)
    finally:
        soak.finish(sa, doc)


def check_same_setup(doc: dict, a, model: dict) -> None:
    """Cells merged into one file must share the workload and the model."""
    w = doc.get("workload")
    if w:
        w = {"stream": True, "client_procs": 1, "server_args": "", **w}  # files from before these options
        for opt in ("input_len", "output_len", "seed", "waves", "stream", "client_procs", "server_args"):
            if w.get(opt) != getattr(a, opt):
                raise SystemExit(f"--{opt.replace('_', '-')}: {getattr(a, opt)} differs from the {w.get(opt)} "
                                 f"already in serving-{a.tag}.json (use another --tag)")
    m = doc.get("model")
    if m and m.get("spec") != model["spec"]:
        raise SystemExit(f"--layers/--model-dir: the model differs from the one in serving-{a.tag}.json "
                         f"(use another --tag)")


def merge(doc: dict, results: Path, tags: List[str]) -> None:
    for tag in tags:
        part = results / f"serving-{tag}.json"
        if not part.exists():
            raise SystemExit(f"--merge {tag}: {part} does not exist")
        other = _results.load(part, {})
        for name, run in other.get("runs", {}).items():
            mine = doc["runs"].setdefault(name, {"cells": {}})
            clash = set(mine["cells"]) & set(run.get("cells", {}))
            if clash:
                raise SystemExit(f"--merge {tag}: {name} at concurrency {sorted(clash)} already present")
            mine["cells"].update(run.get("cells", {}))
            mine.setdefault("server", run.get("server", {}))
        for key in ("commit", "device", "model", "workload"):
            doc.setdefault(key, other.get(key))
        doc.setdefault("invocations", []).extend(other.get("invocations", []))
    doc["merged_from"] = tags


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tag", default="h200", help="results go to RESULTS_DIR/serving-TAG.json/.md/.png")
    ap.add_argument("--configs", nargs="+", choices=list(report.CONFIG_ORDER), default=list(report.CONFIG_ORDER))
    ap.add_argument("--concurrency", nargs="+", type=int, default=sorted(report.CONCURRENCY, reverse=True),
                    help="measured in this order (default 1024 256 10 1: the cells the targets lean on "
                         "first, in case --time-budget cuts the run short)")
    ap.add_argument("--input-len", type=int, default=INPUT_LEN)
    ap.add_argument("--output-len", type=int, default=OUTPUT_LEN)
    ap.add_argument("--waves", type=int, default=WAVES, help="prompts = max(8, WAVES x concurrency)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--client-procs", type=int, default=1,
                    help="bench_serving processes per measurement, each with 1/N of the concurrency and "
                         "prompts (one Python client can lag a fast server at high concurrency)")
    ap.add_argument("--no-stream", dest="stream", action="store_false",
                    help="bench_serving --disable-stream: throughput only (TTFT/ITL reported as null)")
    ap.add_argument("--model-dir", default=None, help="checkpoint directory (built there when absent)")
    ap.add_argument("--layers", type=int, default=None, help="fewer decoder layers (smoke runs only)")
    ap.add_argument("--mem-fraction-static", type=float, default=0.80)
    ap.add_argument("--server-args", default="", help="extra launch_server flags for every server (shell syntax)")
    ap.add_argument("--startup-timeout", type=float, default=600, help="seconds for a server to answer /health")
    ap.add_argument("--cell-timeout", type=float, default=300, help="seconds for one bench_serving run")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="skip the unrecorded warm-up run at the highest concurrency before measuring")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="start no new measurement after this many seconds (fit a command limit)")
    ap.add_argument("--no-dedupe", dest="dedupe", action="store_false",
                    help="start every configuration's server even when two resolve to the same ServerArgs "
                         "(by default the second reports the first's measurements, marked so)")
    ap.add_argument("--then-soak", type=float, default=0, metavar="MINUTES",
                    help="after the layerwise cells, soak that same server for MINUTES (benchmarks/soak.py, "
                         "writes soak-TAG.json); its server then also gets --reject-unknown-model")
    ap.add_argument("--soak-drain-timeout", type=float, default=300.0)
    ap.add_argument("--soak-warmup-minutes", type=float, default=2.0,
                    help="soak.py --warmup-minutes: the soak's traffic, not timed, before memory is read")
    ap.add_argument("--results-dir", default=str(_results.RESULTS))
    ap.add_argument("--workdir", default=None, help="logs and raw JSONL (default: a temp dir)")
    ap.add_argument("--copy-to", default=None, help="also copy the results (and server log tails) here after every save")
    ap.add_argument("--merge", nargs="+", metavar="TAG", help="no GPU: merge serving-TAG.json files into --tag")
    ap.add_argument("--plot-only", metavar="FILE.json", help="no GPU: redraw FILE's .md and .png (targets recomputed)")
    a = ap.parse_args(argv)
    bad = [c for c in a.concurrency if c < 1]
    if bad:
        ap.error(f"--concurrency: values must be >= 1, got {bad}")
    for opt in ("input_len", "output_len", "waves", "client_procs"):
        if getattr(a, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')}: must be >= 1, got {getattr(a, opt)}")
    if a.then_soak < 0 or (a.then_soak and "layerwise" not in a.configs):
        ap.error("--then-soak: needs minutes > 0 and the layerwise configuration in --configs")
    if not 0 < a.mem_fraction_static < 1:
        ap.error(f"--mem-fraction-static: must be in (0, 1), got {a.mem_fraction_static}")
    if a.model_dir is None:
        a.model_dir = setup.DEFAULT_MODEL_DIR + (f"-{a.layers}l" if a.layers else "")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.plot_only:
        path = Path(a.plot_only)
        if not path.exists():
            raise SystemExit(f"--plot-only: {path} does not exist")
        doc = _results.load(path, {})
        written = report.write_reports(doc, path)
        _results.save(path, doc)  # targets recomputed with the current rules
        print(f"[bench] wrote {', '.join(map(str, written))}")
        return 0
    results = Path(a.results_dir)
    out = results / f"serving-{a.tag}.json"
    doc = _results.load(out, {"runs": {}})
    doc["tag"] = a.tag
    if a.merge:
        merge(doc, results, a.merge)
        save(doc, out, a.copy_to)
    else:
        measure(a, doc, out)
    print(f"[bench] wrote {out} (+ .md, .png)")
    for k, v in doc["targets"].items():
        print(f"  {k}: {v['value']} (target {v['target']}) {'met' if v['met'] else 'NOT met'}")
    for line in report.missed(doc):
        print(f"  missed -- {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

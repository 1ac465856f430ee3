"""Grouped NVFP4 W4A16 MoE (ours) against upstream's NVFP4 Marlin MoE and bf16 Triton fused MoE.

    python3 benchmarks/bench_moe_fp4.py [--shapes glm5-tp8,...] [--tokens 1,2,...] [--results-dir DIR]
    python3 benchmarks/bench_moe_fp4.py --plan      # the cases, one JSON line each; no GPU needed
    python3 benchmarks/bench_moe_fp4.py --k-warps 8/1,4/1,2/1,1/1   # plus ours at fixed warps per tile
    python3 benchmarks/bench_moe_fp4.py --pdl-off --profile 1,64,1024   # plus ours without PDL; kernel split
    python3 benchmarks/bench_moe_fp4.py --m-tiles 2,4   # plus ours at a fixed M tile (8-token MMA tiles per item)

One run times, per MoE shape set of sglang.sm120.model_shapes.MOE_SHAPES (GLM-5 one rank of TP 8 and
of EP 8, Qwen3-30B-A3B) and tokens 1..1024, top-8, synthetic_routing:
  - ours: sglang.sm120.kernels.moe_w4a16 on pack_experts' layout;
  - Marlin: upstream's NVFP4 MoE as ModelOptNvFp4FusedMoEMethod runs it on SM80-SM90
    (prepare_moe_nvfp4_layer_for_marlin, then the Marlin MoE runner's fused function);
  - bf16: upstream's Triton fused_experts on bf16 experts of the same shapes.
Each is a whole MoE layer call, timed by sglang.sm120.check.gemm_timing.time_ops (median of
CUDA-graph replays of a chain of calls with different routings, whose weights exceed 2.5x L2;
sglang.sm120.check.moe_timing). Per cell: us, speedup vs Marlin and bf16, and ours' GB/s and % of
the device-to-device copy bandwidth (measured in the same run) on the weight bytes actually read:
distinct local experts hit x PackedExperts.expert_weight_bytes() (bf16's own bytes for bf16).
Gate and up share one global scale per expert (Marlin keeps one), so ours and Marlin compute the
same function; both are held against moe_reference before anything is timed, and a backend that
does not import, fails or is off the reference is recorded as missing with the reason. Targets
per shape set: geomean speedup vs Marlin >= 1.3 over tokens 1-256, and >= 1.0 at every size.

Writes RESULTS/moe-fp4-h200.json and .md (RESULTS = --results-dir, default benchmarks/results/;
copies them and the log to $OUT when set). sglang.sm120 is the installed fork's; the kernel
library $SGLANG_SM120_KERNEL_LIB's when set.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import functools
import json
import math
import os
import re
import shutil
import sys
import time
from pathlib import Path

from _results import REPO, Log, commit, target

from sglang.sm120.model_shapes import MOE_SHAPES, moe_shape

TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
GEOMEAN_MAX_TOKENS = 256
TARGET_GEOMEAN_VS_MARLIN = 1.3
TARGET_MIN_VS_MARLIN = 1.0
RESULT_NAME = "moe-fp4-h200"
SEED = 0


def cases(shape_names=None, tokens=TOKENS):
    """Every (shape set, tokens) cell of a run, in run order."""
    shapes = [moe_shape(n) for n in shape_names] if shape_names else list(MOE_SHAPES)
    return [{"shape": s.name, "tokens": t, "experts": s.experts, "global_experts": s.routed_over,
             "hidden": s.hidden, "inter": s.inter, "topk": s.topk, "routed_scaling": s.routed_scaling,
             "gate_up": [2 * s.inter, s.hidden], "down": [s.hidden, s.inter]}
            for s in shapes for t in tokens]


def _geomean(v):
    v = [x for x in v if x]
    return round(math.exp(sum(map(math.log, v)) / len(v)), 3) if v else None


def set_ratios(r, copy_bw):
    """The row's ratios and bandwidths from its times and bytes."""
    r["speedup_vs_marlin"] = round(r["marlin_us"] / r["ours_us"], 4) if r.get("marlin_us") else None
    r["speedup_vs_bf16"] = round(r["bf16_us"] / r["ours_us"], 4) if r.get("bf16_us") else None
    for b in ("ours", "marlin", "bf16"):
        us, nbytes = r.get(f"{b}_us"), r["bf16_weight_bytes" if b == "bf16" else "weight_bytes"]
        r[f"{b}_gbps"] = round(nbytes / (us * 1e-6) / 1e9, 1) if us else None
        r[f"{b}_bw_pct"] = round(100.0 * nbytes / (us * 1e-6) / copy_bw, 1) if us else None


def summarize(rows, shape_names, missing=None):
    """(targets, summary): per shape set, geomean of ours vs Marlin over tokens 1-256 and the
    minimum over every size (a shape set without Marlin rows misses both, with the reason)."""
    targets, summary = {}, {}
    missing = missing or {}
    for name in shape_names:
        mine = [r for r in rows if r["shape"] == name]
        small = [r["speedup_vs_marlin"] for r in mine if r["tokens"] <= GEOMEAN_MAX_TOKENS and r.get("speedup_vs_marlin")]
        every = [r["speedup_vs_marlin"] for r in mine if r.get("speedup_vs_marlin")]
        complete = len(every) == len(mine) and bool(mine)
        geo = _geomean(small) if complete else None
        low = round(min(every), 3) if complete else None
        why = None if complete else (missing.get(name) or "Marlin was not timed at every size")
        t1 = target(geo, f">= {TARGET_GEOMEAN_VS_MARLIN} (geomean, tokens 1-{GEOMEAN_MAX_TOKENS})",
                    lambda v: v >= TARGET_GEOMEAN_VS_MARLIN)
        t2 = target(low, f">= {TARGET_MIN_VS_MARLIN} at every size", lambda v: v >= TARGET_MIN_VS_MARLIN)
        if why:
            t1["missing"] = t2["missing"] = why
        else:
            t2["at_tokens"] = min(mine, key=lambda r: r["speedup_vs_marlin"])["tokens"]
        targets[f"speedup_vs_marlin_geomean_1_{GEOMEAN_MAX_TOKENS}_{name}"] = t1
        targets[f"speedup_vs_marlin_min_{name}"] = t2
        summary[name] = {
            "speedup_vs_marlin_geomean_1_256": geo,
            "speedup_vs_bf16_geomean_1_256": _geomean([r["speedup_vs_bf16"] for r in mine
                                                       if r["tokens"] <= GEOMEAN_MAX_TOKENS and r.get("speedup_vs_bf16")]),
            "ours_bw_pct_max": max((r["ours_bw_pct"] for r in mine if r.get("ours_bw_pct")), default=None),
        }
    return targets, summary


def write_md(path, meta, rows, targets, summary):
    L = [f"# Grouped NVFP4 W4A16 MoE vs upstream Marlin NVFP4 MoE and bf16 fused MoE ({meta['device']})", "",
         f"- date {meta['date']}, commit `{meta['commit']}`, torch {meta['torch']}, sglang {meta.get('sglang')}",
         f"- copy bandwidth {meta['copy_bw_tbps']:.3f} TB/s (read + write, device to device); launch floor "
         f"{meta['launch_floor_us']:.2f} us", f"- Marlin: {meta['marlin']}", f"- bf16: {meta['bf16']}", "",
         "Microseconds per MoE layer call (median of CUDA-graph replays over routings whose weights exceed 2.5x L2). "
         "`x` = that backend's time / ours. `experts` = distinct local experts a call hits (mean); GB/s and % copy BW "
         "on the weight bytes those experts hold (FP4 + scales; bf16's own for bf16).", "",
         "## Targets", "", "| target | value | goal | met |", "|---|---|---|---|"]
    for k, t in targets.items():
        L.append(f"| {k} | {t['value']} | {t['target']}{' (' + t['missing'] + ')' if t.get('missing') else ''} | "
                 f"{'yes' if t['met'] else '**no**'} |")
    L += ["", "## Per shape set", "", "| shape | x Marlin geomean 1-256 | x bf16 geomean 1-256 | ours max % copy BW |",
          "|---|---|---|---|"]
    for name, s in summary.items():
        L.append(f"| {name} | {s['speedup_vs_marlin_geomean_1_256']} | {s['speedup_vs_bf16_geomean_1_256']} | "
                 f"{s['ours_bw_pct_max']} |")
    f = lambda v, nd=2: "-" if v is None else f"{v:.{nd}f}"  # noqa: E731
    L += ["", "## Rows", "", "| shape | tokens | experts | ours us | GB/s | % copy BW | Marlin us | x Marlin | "
          "bf16 us | x bf16 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['shape']} | {r['tokens']} | {r['experts_hit_mean']:.1f} | {f(r['ours_us'])} | "
                 f"{f(r['ours_gbps'], 0)} | {f(r['ours_bw_pct'], 1)} | {f(r.get('marlin_us'))} | "
                 f"{f(r.get('speedup_vs_marlin'))} | {f(r.get('bf16_us'))} | {f(r.get('speedup_vs_bf16'))} |")
    Path(path).write_text("\n".join(L) + "\n")


# as bench_fp4_gemm.py: the pair the targets compare, Marlin and ours, each timed right after a bf16
# graph: bf16, Marlin, bf16 again, ours
ORDER = ("bf16", "marlin", "bf16_repeat", "sm120")


def flat_row(cell, shape, copy_bw, errors):
    """moe_timing.time_row's cell as this file's row: {backend}_us (ours, marlin, bf16, bf16_repeat),
    {backend}_missing where a backend was not timed, ratios and bandwidths (set_ratios)."""
    r = {k: v for k, v in cell.items() if k not in ("us", "failed")}
    r["bf16_weight_bytes"] = int(cell["experts_hit_mean"] * shape.bf16_bytes_per_expert())
    for key in ORDER:
        name = "ours" if key == "sm120" else key
        r[f"{name}_us"] = cell["us"].get(key)
    for b in ("marlin", "bf16"):
        why = cell["failed"].get(b) or errors.get(b)
        if r[f"{b}_us"] is None:
            r[f"{b}_missing"] = why or "not available"
    set_ratios(r, copy_bw)
    return r


def parse_k_warps(text: str):
    """--k-warps "8/1,4/1" -> ((8, 1), (4, 1)): gate_up/down warps per tile of extra ours columns."""
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        try:
            g, d = (int(v) for v in item.split("/"))
        except ValueError:
            raise ValueError(f"--k-warps: {item!r} is not GATE_UP/DOWN (e.g. 4/1)") from None
        if g not in (1, 2, 4, 8) or d not in (1, 2, 4, 8):
            raise ValueError(f"--k-warps: {item!r}: warps per tile are 1, 2, 4 or 8")
        out.append((g, d))
    return tuple(out)


def sweep_key(g: int, d: int) -> str:
    return f"sm120_kw{g}_{d}"


NOPDL = "sm120_nopdl"


def m_tiles_key(m: int) -> str:
    return f"sm120_m{m}"


def kernel_split(ops, x, routes, calls=8):
    """{backend: {kernel: us per call}} from torch.profiler over `calls` eager calls of each op
    (after one warm-up each): which kernels a layer call runs and how long each takes on the GPU;
    "gpu_sum" is their total (gaps between them are not in it)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from sglang.sm120.check.moe_timing import reason_of

    out = {}
    for key in ("sm120", NOPDL, "marlin", "bf16"):
        if key not in ops:
            continue
        rts = routes(key)
        try:
            ops[key](x, *rts[0])
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for j in range(calls):
                    ops[key](x, *rts[j % len(rts)])
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - an upstream backend failing is reported, ours raises
            if key == "sm120":
                raise
            out[key] = {"failed": reason_of(exc)}
            continue
        per = {}
        for ev in prof.key_averages():
            us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
            if us and ev.count:
                name = re.sub(r"^void ", "", ev.key.replace("(anonymous namespace)::", ""))
                per[name.split("(")[0][:70]] = round(us / calls, 2)
        top = dict(sorted(per.items(), key=lambda kv: -kv[1])[:8])
        top["gpu_sum"] = round(sum(per.values()), 2)
        out[key] = top
    return out


def bench_shape(s, tokens, l2, copy_bw, reps, log, k_warps=(), pdl_off=False, profile_tokens=(), m_tiles=()):
    import torch

    from sglang.sm120 import kernels as K
    from sglang.sm120.check import moe_timing as MT

    dev = torch.device("cuda")
    packed, ops, errors = MT.setup(s, ("marlin", "bf16"), dev, seed=SEED)
    for b, why in errors.items():
        log(f"  {s.name}: {b} not timed: {why}")
    # ours again with one of the plan's choices (or PDL) fixed, same calls otherwise: the levers
    variants = ([(sweep_key(g, d), {"gate_up_k_warps": g, "down_k_warps": d}) for g, d in k_warps]
                + ([(NOPDL, {"pdl": False})] if pdl_off else []) + [(m_tiles_key(m), {"m_tiles": m}) for m in m_tiles])
    for key, kw in variants:
        ops[key] = functools.partial(K.moe_w4a16, experts=packed, routed_scaling_factor=s.routed_scaling, **kw)
    order = ORDER + tuple(key for key, _ in variants)
    rows = []
    for t in tokens:
        cell = MT.time_row(s, t, ops, order, packed.expert_weight_bytes(), l2, reps, dev, seed=SEED + 1)
        r = flat_row(cell, s, copy_bw, errors)
        plan = K.moe_plan(t, s.topk, s.experts, s.hidden, s.inter)
        r["plan_k_warps"] = f"{plan['gate_up_k_warps']}/{plan['down_k_warps']}"
        if k_warps:
            r["k_warps_us"] = {f"{g}/{d}": cell["us"].get(sweep_key(g, d)) for g, d in k_warps}
            log(f"  {s.name:10s} T={t:5d} plan {r['plan_k_warps']}: ours {r['ours_us']} us; fixed "
                + ", ".join(f"{k} {v} us" for k, v in r["k_warps_us"].items()))
        if pdl_off:
            r["ours_nopdl_us"] = cell["us"].get(NOPDL)
            log(f"  {s.name:10s} T={t:5d} ours {r['ours_us']} us, without PDL {r['ours_nopdl_us']} us")
        if m_tiles:
            r["plan_m_tiles"] = plan["m_tiles"]
            r["m_tiles_us"] = {str(m): cell["us"].get(m_tiles_key(m)) for m in m_tiles}
            log(f"  {s.name:10s} T={t:5d} plan M tiles {plan['m_tiles']}: ours {r['ours_us']} us; fixed "
                + ", ".join(f"{k} {v} us" for k, v in r["m_tiles_us"].items()))
        if t in profile_tokens:
            routes = MT.routings(s, t, 8, dev, seed=SEED + 2)
            r["kernel_split_us"] = kernel_split(
                ops, torch.randn(t, s.hidden, device=dev).to(torch.bfloat16),
                lambda key: MT.marlin_weights(routes, s) if key == "marlin" else routes)
            for key, split in r["kernel_split_us"].items():
                log(f"  {s.name:10s} T={t:5d} {key} kernels (us per call): " + json.dumps(split))
        r["expert_weight_bytes"] = packed.expert_weight_bytes()
        rows.append(r)
        log(f"  {s.name:10s} T={t:5d} experts {r['experts_hit_mean']:6.1f}  ours {r['ours_us']:8.2f} us "
            f"({r['ours_bw_pct']:5.1f}% BW)  "
            + (f"marlin {r['marlin_us']:8.2f} us x{r['speedup_vs_marlin']:.2f}  " if r.get("marlin_us") else "marlin n/a  ")
            + (f"bf16 {r['bf16_us']:8.2f} us x{r['speedup_vs_bf16']:.2f}" if r.get("bf16_us") else "bf16 n/a"))
    del ops, packed
    torch.cuda.empty_cache()
    return rows, errors


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="", help="comma list of shape sets (default all: "
                    + ", ".join(s.name for s in MOE_SHAPES) + ")")
    ap.add_argument("--tokens", default="", help="comma list of token counts (default " + ",".join(map(str, TOKENS)) + ")")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--k-warps", default="", help="extra ours columns with fixed gate_up/down warps per "
                    "weight tile, e.g. 8/1,4/1,2/1,1/1 (a sweep of the plan's choice; not in the targets)")
    ap.add_argument("--pdl-off", action="store_true",
                    help="an extra ours column launched without PDL (SGLANG_SM120_PDL=0; not in the targets)")
    ap.add_argument("--m-tiles", default="", help="extra ours columns at a fixed M tile, e.g. 2,4 (8-token "
                    "MMA tiles per work item: 1, 2 or 4; a sweep of the plan's choice, not in the targets)")
    ap.add_argument("--profile", default="", metavar="TOKENS",
                    help="comma list of token counts whose rows also get each backend's kernels and their GPU "
                         "time per call (torch.profiler over eager calls)")
    ap.add_argument("--plan", "--dry-run", dest="plan", action="store_true",
                    help="print the cases (one JSON line each) and exit; needs no GPU")
    args = ap.parse_args(argv)
    names = [n.strip() for n in args.shapes.split(",") if n.strip()] or [s.name for s in MOE_SHAPES]
    try:
        tokens = tuple(int(t) for t in args.tokens.split(",") if t.strip()) or TOKENS
        sel = cases(names, tokens)
        k_warps = parse_k_warps(args.k_warps)
        profile_tokens = tuple(int(t) for t in args.profile.split(",") if t.strip())
        m_tiles = tuple(int(m) for m in args.m_tiles.split(",") if m.strip())
        if any(m not in (1, 2, 4) for m in m_tiles):
            raise ValueError(f"--m-tiles: M tiles are 1, 2 or 4, got {args.m_tiles!r}")
    except ValueError as exc:
        ap.error(str(exc))
    if args.plan:
        for c in sel:
            print(json.dumps(c))
        return 0
    import torch

    from sglang.sm120 import kernels as K
    from sglang.sm120.check.gemm_timing import bench_device, copy_bandwidth, launch_floor_us

    log = Log()
    props = bench_device()
    try:
        import sglang
        sglang_version = getattr(sglang, "__version__", None)
    except ImportError:
        sglang_version = None
    meta = {"date": _dt.date.today().isoformat(), "device": props.name,
            "capability": list(torch.cuda.get_device_capability(0)), "sm_count": props.multi_processor_count,
            "l2_bytes": props.L2_cache_size, "torch": torch.__version__, "cuda": torch.version.cuda,
            "sglang": sglang_version, "commit": commit(), "kernel_archs": K.build_archs(), "reps": args.reps,
            "command": "python3 benchmarks/bench_moe_fp4.py " + " ".join(sys.argv[1:] if argv is None else argv),
            "tokens": list(tokens), "shapes": [c for c in cases(names, tokens[:1])],
            "marlin": "upstream prepare_moe_nvfp4_layer_for_marlin + the Marlin MoE runner's fused function "
                      "(ModelOptNvFp4FusedMoEMethod's SM80-SM90 path)",
            "bf16": "upstream Triton fused_experts on bf16 experts of the same shapes"}
    log(f"device {props.name} sm_{meta['capability'][0]}{meta['capability'][1]}, L2 {props.L2_cache_size >> 20} MB, "
        f"kernels {meta['kernel_archs']}")
    copy_bw, meta["copy_bw_tbps_by_method"] = copy_bandwidth(log)
    meta["copy_bw_tbps"] = copy_bw / 1e12
    meta["launch_floor_us"] = launch_floor_us(args.reps)
    rows, missing = [], {}
    t0 = time.time()
    for name in names:
        s = moe_shape(name)
        log(f"{name}: {s.experts} local experts of {s.routed_over}, gate_up {2 * s.inter} x {s.hidden}, "
            f"down {s.hidden} x {s.inter}, top-{s.topk}")
        shape_rows, errors = bench_shape(s, tokens, props.L2_cache_size, copy_bw, args.reps, log, k_warps,
                                         args.pdl_off, profile_tokens, m_tiles)
        rows += shape_rows
        if "marlin" in errors:
            missing[name] = errors["marlin"]
    targets, summary = summarize(rows, names, missing)
    result = {"meta": meta, "targets": targets, "summary": summary, "rows": rows,
              "elapsed_s": round(time.time() - t0, 1)}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    jpath, mpath = args.results_dir / f"{RESULT_NAME}.json", args.results_dir / f"{RESULT_NAME}.md"
    jpath.write_text(json.dumps(result, indent=1) + "\n")
    write_md(mpath, meta, rows, targets, summary)
    log(f"wrote {jpath} and {mpath}")
    print("TARGETS: " + json.dumps(targets))
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        for path in (jpath, mpath):
            if path.resolve().parent != Path(out).resolve():
                shutil.copy(path, out)
        (Path(out) / "bench_moe_fp4.log").write_text("\n".join(log.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

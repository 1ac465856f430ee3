"""NVFP4 GEMM at decode sizes: sm120 kernels vs torch bf16 matmul vs upstream Marlin FP4.

    python3 benchmarks/bench_fp4_gemm.py [--quick] [--shapes NAME,...]

sglang.sm120 is the installed fork's (or python/'s, PYTHONPATH=python, where no sglang is installed);
the kernel library $SGLANG_SM120_KERNEL_LIB's when set.

Writes benchmarks/results/fp4-gemm.json and .md (the date is in its meta; and copies them, plus the log, to $OUT when
set). Every time is the median of CUDA-graph replays of one op per rotating weight copy (copies
together larger than 2x L2), divided by the number of ops. Bandwidth is bytes moved over that time,
as a percentage of a device-to-device copy measured in the same run. The SM120 table is a roofline
ESTIMATE (public spec sheet figures, see SM120_BW below), not a measurement. The Marlin column uses upstream sglang's
apply_fp4_marlin_linear when sglang (+ its JIT kernels) is importable; otherwise it is recorded as
missing with the reason.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from _results import REPO, Log, commit

from sglang.sm120 import kernels as K
from sglang.sm120 import nvfp4 as F

MS = [1, 2, 4, 8, 16, 32, 64, 128]
TARGET_BW_PCT = 80.0
TARGET_VS_BF16 = 3.0
TARGET_VS_MARLIN = 1.2
BIG_WEIGHT_BYTES = 8 << 20

# RTX PRO 6000 Blackwell roofline (public spec sheet): 1,792 GB/s; dense bf16 ~504 TFLOP/s (W4A16 ridge
# ~79 rows), dense FP4 ~2.0 PFLOP/s (W4A4 ridge ~316 rows).
SM120_BW = 1.792e12
SM120_BF16_FLOPS = 5.04e14
SM120_FP4_FLOPS = 2.0e15


# The timing harness lives in the overlay (the installed wheel carries it for
# `python -m sglang.sm120 check`).
from sglang.sm120.check.gemm_timing import (  # noqa: E402
    bench_device, bf16_bytes, copies_for, copy_bandwidth, fp4_bytes, launch_floor_us, load_marlin, marlin_copies,
    marlin_ops, rotating_weights, select_shapes, shape_weight, shapes, time_ops)


def bench_shape(name, n, k, ms, l2, copy_bw, floor_us, marlin, reps, log):
    w, q = shape_weight(n, k)
    pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    wbytes = 0.5625 * n * k
    n_fp4 = copies_for(wbytes, l2)
    n_bf16 = copies_for(2 * n * k, l2)
    pws = rotating_weights(pw, l2)
    wb = w.to(torch.bfloat16)
    wbs = [wb] + [wb.clone() for _ in range(n_bf16 - 1)]
    del w
    marlin_layers, marlin_err = None, None
    if marlin is not None:
        try:
            marlin_layers = marlin_copies(q, n, k, marlin[1], n_fp4)
        except Exception as exc:
            marlin_err = f"{type(exc).__name__}: {exc}".splitlines()[0]
            log(f"  marlin setup failed for {name}: {marlin_err}")
    in_s = F.input_scale_from_amax(torch.tensor(4.0)).reshape(1).cuda()
    inv = (1.0 / in_s)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        r = {"shape": name, "N": n, "K": k, "M": m, "weight_fp4_bytes": int(wbytes)}
        # Order matters: a graph's time depends on the graph timed just before it (on small weights a
        # plain graph right after a PDL graph runs faster than after a plain one, lab/fp4_lab.py order-probe (git: ada4aec);
        # Marlin and ours both run faster right after a bf16 graph, lab/fp4_lab.py marlin-rows). So the
        # pair the targets compare, `ours` and Marlin, is timed at the end of the row under the same
        # condition, each right after a bf16 graph: bf16, Marlin, bf16 again, ours. bf16 itself
        # follows the split sweep's PDL graphs (W4A4's at M >= 64), the 4/8-warp plain columns
        # follow PDL graphs too: compare those with each other only.
        # `ours_row_start_us`, the plain default timed first in its row (after the previous row's
        # Marlin, not after bf16), is kept beside it to show the order's effect.
        # Targets use the plain launch. With PDL each call of the back-to-back chain prefetches its
        # weights during the previous call's tail: reported beside it, not used for the targets.
        ours_ops = [lambda p=p: K.gemm_w4a16(x, p, pdl=False) for p in pws]
        r["ours_row_start_us"] = time_ops(ours_ops, reps)
        # both W4A16 kernels where the warp-K one applies (plain, right after plain graphs too);
        # the default picks one by csrc's default_w4a16_warpk
        r["default_kernel"] = "warpk" if K.w4a16_plan(m, n, k, sms)["warpk"] else "split"
        if m <= K.WARPK_MAX_M:
            for kernel in ("split", "warpk"):
                r[f"ours_{kernel}_us"] = time_ops(
                    [lambda p=p, kn=kernel: K.gemm_w4a16(x, p, pdl=False, kernel=kn) for p in pws], reps)
            r["ours_warpk_pdl_us"] = time_ops(
                [lambda p=p: K.gemm_w4a16(x, p, pdl=True, kernel="warpk") for p in pws], reps)
        r["ours_pdl_us"] = time_ops([lambda p=p: K.gemm_w4a16(x, p, pdl=True) for p in pws], reps)
        # both warp counts per 128-row CTA of the split-K kernel (same bits); the default picks one by M
        r["default_warps"] = K.w4a16_warps(m, n, k, sms)
        for w in WARP_COUNTS:
            r[f"ours_{w}w_us"] = time_ops(
                [lambda p=p: K.gemm_w4a16(x, p, pdl=False, warps=w, kernel="split") for p in pws], reps)
            r[f"ours_{w}w_pdl_us"] = time_ops(
                [lambda p=p: K.gemm_w4a16(x, p, pdl=True, warps=w, kernel="split") for p in pws], reps)
        # split-K reduced in a thread-block cluster (where the plan has 2..8 splits), PDL on
        r["ours_cluster_pdl_us"] = time_ops(
            [lambda p=p: K.gemm_w4a16(x, p, pdl=True, cluster=True, kernel="split") for p in pws], reps)
        r["cluster_plan"] = K.w4a16_plan(m, n, k, sms, cluster=True, kernel="split")["cluster"]
        # every row times fixed targets beside the default (csrc/kernels.h's rule, fitted on a
        # table of these columns), so the rule is judged on the whole table
        default_plan = K.w4a16_plan(m, n, k, sms, kernel="split")
        r["default_split_target"] = default_plan["split_target"]
        r["split_target_pdl_us"], r["split_target_splits"] = {}, {"default": default_plan["splits"]}
        for label, target in ROW_SPLIT_TARGETS:
            t = max(1, target(sms))
            r["split_target_splits"][label] = K.w4a16_plan(m, n, k, sms, split_target=t)["splits"]
            r["split_target_pdl_us"][label] = time_ops(
                [lambda p=p, t=t: K.gemm_w4a16(x, p, pdl=True, split_target=t) for p in pws], reps)
        if m >= 64:
            r["ours_w4a4_us"] = time_ops(
                [lambda p=p: K.gemm_w4a4(*K.quantize_nvfp4(x, inv, mma_order=True), in_s, p) for p in pws], reps)
        bf16_ops = [lambda b=b: torch.nn.functional.linear(x, b) for b in wbs]
        r["bf16_us"] = time_ops(bf16_ops, reps)
        if marlin_layers is not None:
            try:
                r["marlin_us"] = time_ops(marlin_ops(marlin[0], marlin_layers, x, n, k), reps)
            except Exception as exc:
                marlin_err = f"{type(exc).__name__}: {exc}".splitlines()[0]
                marlin_layers = None
                log(f"  marlin failed for {name}: {marlin_err}")
        if "marlin_us" not in r:
            r["marlin_us"] = None
            r["marlin_missing"] = marlin_err or "not available"
        r["bf16_repeat_us"] = time_ops(bf16_ops, reps)  # so that ours, like Marlin, follows a bf16 graph
        r["ours_us"] = time_ops(ours_ops, reps)
        r["ours_bw_pct"] = 100.0 * fp4_bytes(n, k, m) / (r["ours_us"] * 1e-6) / copy_bw
        r["ours_pdl_bw_pct"] = 100.0 * fp4_bytes(n, k, m) / (r["ours_pdl_us"] * 1e-6) / copy_bw
        r["bf16_bw_pct"] = 100.0 * bf16_bytes(n, k, m) / (r["bf16_us"] * 1e-6) / copy_bw
        set_speedups(r)
        r["speedup_vs_bf16_cluster_pdl"] = r["bf16_us"] / r["ours_cluster_pdl_us"]
        add_floor_bounds(r, floor_us, copy_bw)
        rows.append(r)
        log(f"  {name:28s} M={m:4d}  ours {r['ours_us']:8.2f} us ({r['ours_bw_pct']:5.1f}% BW, "
            f"PDL {r['ours_pdl_us']:.2f} us, PDL+cluster {r['ours_cluster_pdl_us']:.2f} us)  "
            f"bf16 {r['bf16_us']:8.2f} us  x{r['speedup_vs_bf16']:.2f}  "
            + (f"marlin {r['marlin_us']:8.2f} us x{r['speedup_vs_marlin']:.2f}" if r["marlin_us"] else "marlin n/a"))
    del pws, wbs, marlin_layers
    torch.cuda.empty_cache()
    return rows


WARP_COUNTS = (4, 8)  # W4A16 warps per 128-row CTA; the default's plan picks one (K.w4a16_warps)


def set_speedups(r):
    """The speedups the targets read, from the row's times (plain and PDL)."""
    r["speedup_vs_bf16"] = r["bf16_us"] / r["ours_us"]
    r["speedup_vs_bf16_pdl"] = r["bf16_us"] / r["ours_pdl_us"]
    r["speedup_vs_marlin"] = r["marlin_us"] / r["ours_us"] if r.get("marlin_us") else None


def add_floor_bounds(r, floor_us, copy_bw):
    """What a kernel at the launch floor would score on this row (the fastest plain-launch call: the
    floor plus its bytes at the copy bandwidth): the best value each target's metric can take here,
    given the measured floor, copy bandwidth, bf16 and Marlin times."""
    nbytes = fp4_bytes(r["N"], r["K"], r["M"])
    ideal = floor_us + nbytes / copy_bw * 1e6
    r["at_floor_us"] = ideal
    r["at_floor_bw_pct"] = 100.0 * nbytes / (ideal * 1e-6) / copy_bw
    r["at_floor_speedup_vs_bf16"] = r["bf16_us"] / ideal
    r["at_floor_speedup_vs_marlin"] = r["marlin_us"] / ideal if r.get("marlin_us") else None


# Split-K targets swept: "none" (target 1: one CTA per output tile, no reduction pass) up to 8
# CTAs per SM; the default (split_target 0) is csrc/kernels.h's rule (no split where the tiles fill
# 3/4 of the SMs, else 2x for weights >= 8 MB (4x from 32 MB), else 1x at M <= 16 and 0.5x above;
# targets of at most 1x take the most splits whose grid fits the SMs).
SPLIT_TARGET_OF = {"none": lambda sms: 1, "0.25x": lambda sms: sms // 4, "0.5x": lambda sms: sms // 2,
                   "1x": lambda sms: sms, "2x": lambda sms: 2 * sms, "3x": lambda sms: 3 * sms,
                   "4x": lambda sms: 4 * sms, "8x": lambda sms: 8 * sms}
SPLIT_TARGETS = tuple((k, SPLIT_TARGET_OF[k]) for k in ("none", "0.5x", "1x", "2x", "4x", "8x"))
# timed on every row beside the default, PDL launch: the targets the rule chooses among (0.5x-4x)
# and a neighbour below, so the default's choice is judged against each
ROW_SPLIT_TARGETS = tuple((k, SPLIT_TARGET_OF[k]) for k in ("0.25x", "0.5x", "1x", "2x", "3x", "4x"))
ROW_SPLIT_LABELS = "/".join(k for k, _ in ROW_SPLIT_TARGETS)


def tune_splits(sms, reps, log):
    """How the split-K target moves small-M times (informs the default split target), for the
    plain and the PDL launch."""
    out = []
    for name, n, k in [("glm5 o_proj tp8", 6144, 2048), ("qwen3-30b qkv tp1", 5120, 2048),
                       ("glm5 shared gate_up tp8", 512, 6144), ("glm5 q_b tp1", 16384, 2048)]:
        q = F.quantize_weight_modelopt(torch.randn(n, k, device="cuda") * 0.02)
        pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
        pws = rotating_weights(pw, torch.cuda.get_device_properties(0).L2_cache_size)
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            row = {"shape": name, "M": m, "targets": {}}
            for label, target_of in SPLIT_TARGETS:
                t = max(1, target_of(sms))
                row["targets"][label] = {
                    "split_target": t,
                    "splits": K.w4a16_plan(m, n, k, sms, split_target=t)["splits"],
                    "us": time_ops([lambda p=p: K.gemm_w4a16(x, p, split_target=t, pdl=False) for p in pws], reps),
                    "pdl_us": time_ops([lambda p=p: K.gemm_w4a16(x, p, split_target=t, pdl=True) for p in pws], reps),
                }
            out.append(row)
            log(f"  tune {name:24s} M={m:3d} " + " ".join(
                f"{label}:{c['us']:.2f}/{c['pdl_us']:.2f}us/s{c['splits']}" for label, c in row["targets"].items()))
    return out


def sm120_estimate(n, k, m, overhead_us):
    t_fp4 = max(fp4_bytes(n, k, m) / SM120_BW, 2 * m * n * k / SM120_BF16_FLOPS) * 1e6 + overhead_us
    t_bf16 = max(bf16_bytes(n, k, m) / SM120_BW, 2 * m * n * k / SM120_BF16_FLOPS) * 1e6 + overhead_us
    return t_fp4, t_bf16


TARGET_ROWS = {  # target -> (rows it is judged on, metric, the same metric at the launch floor, threshold)
    "bw_pct_of_copy_m_le_16_weights_ge_8MB_min": (
        lambda r: r["M"] <= 16 and r["weight_fp4_bytes"] >= BIG_WEIGHT_BYTES, "ours_bw_pct", "at_floor_bw_pct",
        TARGET_BW_PCT),
    "speedup_vs_bf16_m_1_to_8_min": (
        lambda r: r["M"] <= 8, "speedup_vs_bf16", "at_floor_speedup_vs_bf16", TARGET_VS_BF16),
    "speedup_vs_marlin_m_le_16_min": (
        lambda r: r["M"] <= 16, "speedup_vs_marlin", "at_floor_speedup_vs_marlin", TARGET_VS_MARLIN),
}


def _geomean(v):
    return round(math.exp(sum(map(math.log, v)) / len(v)), 3) if v else None


def summarize(rows, marlin_reason):
    def pick(pred, key):
        return [r[key] for r in rows if pred(r) and r.get(key) is not None]

    targets = {}
    for name, (pred, key, floor_key, threshold) in TARGET_ROWS.items():
        vals, bound = pick(pred, key), pick(pred, floor_key)
        targets[name] = {
            "value": round(min(vals), 2) if vals else None, "target": threshold,
            "met": bool(vals) and min(vals) >= threshold,
            # the same statistic for a kernel at the launch floor (add_floor_bounds), and how many of
            # the judged rows even that kernel would miss: what the H200 allows on these rows
            "at_floor_bound": round(min(bound), 2) if bound else None,
            "rows_unreachable_at_floor": sum(v < threshold for v in bound), "rows": len(vals),
        }
    if not targets["speedup_vs_marlin_m_le_16_min"]["rows"]:
        targets["speedup_vs_marlin_m_le_16_min"]["missing"] = marlin_reason or "no Marlin measurements"
    geo = _geomean
    rmin = lambda v, nd: round(min(v), nd) if v else None  # noqa: E731
    big16 = lambda r: r["M"] <= 16 and r["weight_fp4_bytes"] >= BIG_WEIGHT_BYTES  # noqa: E731
    le8 = lambda r: r["M"] <= 8  # noqa: E731
    big16_bw = pick(big16, "ours_bw_pct")
    extra = {
        "bw_pct_m_le_16_weights_ge_8MB_median": round(statistics.median(big16_bw), 1) if big16_bw else None,
        "speedup_vs_bf16_m_1_to_8_geomean": geo(pick(le8, "speedup_vs_bf16")),
        "speedup_vs_marlin_m_le_16_geomean": geo(pick(lambda r: r["M"] <= 16, "speedup_vs_marlin")),
        "pdl_bw_pct_of_copy_m_le_16_weights_ge_8MB_min": rmin(pick(big16, "ours_pdl_bw_pct"), 1),
        "pdl_speedup_vs_bf16_m_1_to_8_min": rmin(pick(le8, "speedup_vs_bf16_pdl"), 2),
        "pdl_speedup_vs_bf16_m_1_to_8_geomean": geo(pick(le8, "speedup_vs_bf16_pdl")),
        "pdl_cluster_speedup_vs_bf16_m_1_to_8_geomean": geo(pick(le8, "speedup_vs_bf16_cluster_pdl")),
    }
    # the Marlin statistic with ours timed first in its row (after the previous row's Marlin) while
    # Marlin follows the bf16 graph: shows the timing order's effect on the targets' ratio
    row_start = [r["marlin_us"] / r["ours_row_start_us"] for r in rows
                 if r["M"] <= 16 and r.get("marlin_us") and r.get("ours_row_start_us")]
    extra["speedup_vs_marlin_ours_at_row_start_m_le_16_min"] = rmin(row_start, 2)
    # < 1: the warp-K kernel beats the split-K one (plain launches); per M range, over the shapes
    for lo, hi in ((1, 8), (16, 16)):
        ratios = [r["ours_warpk_us"] / r["ours_split_us"] for r in rows
                  if lo <= r["M"] <= hi and r.get("ours_warpk_us") and r.get("ours_split_us")]
        extra[f"warpk_vs_split_time_m{lo}_{hi}_geomean"] = geo(ratios)
    # < 1: that split target beats the default; per M range, geomean over the shapes
    for label, _ in ROW_SPLIT_TARGETS:
        for lo, hi in ((1, 8), (16, 16), (32, 128)):
            ratios = [r["split_target_pdl_us"][label] / r["ours_pdl_us"] for r in rows
                      if lo <= r["M"] <= hi and r.get("split_target_pdl_us", {}).get(label)]
            extra[f"pdl_split_target_{label}_vs_default_time_m{lo}_{hi}_geomean"] = geo(ratios)
    return targets, extra


def warps_cols(r):
    """`4w plain/PDL | 8w plain/PDL`, the default's count marked with *."""
    return " / ".join(f"{w}w{'*' if r.get('default_warps') == w else ''} {r[f'ours_{w}w_us']:.2f}/{r[f'ours_{w}w_pdl_us']:.2f}"
                      for w in WARP_COUNTS if f"ours_{w}w_us" in r)


def write_md(path, meta, rows, targets, extra, est, tuning):
    L = [f"# NVFP4 GEMM benchmark ({meta['date']})", "",
         f"- device: {meta['device']} ({meta['sm_count']} SMs, L2 {meta['l2_bytes'] >> 20} MB)",
         f"- commit: `{meta['commit']}`", f"- command: `{meta['command']}`",
         f"- copy bandwidth measured in this run: {meta['copy_bw_tbps']:.2f} TB/s, the faster of "
         + ", ".join(f"{k} {v:.2f}" for k, v in meta.get("copy_bw_tbps_by_method", {}).items())
         + " (read + write)",
         f"- launch floor: {meta.get('launch_floor_us', float('nan')):.2f} us per call (one-element kernel in "
         "the same graph chain); 'at floor' = that floor + the call's bytes at the copy bandwidth",
         f"- timing: median of {meta['reps']} CUDA-graph replays, rotating weight copies > 2x L2; `ours` "
         "and Marlin (the targets' pair) each timed right after a bf16 graph (the same order for both)",
         f"- Marlin: {meta['marlin']}",
         *([f"- time budget {meta['time_budget_s']:.0f} s: skipped shapes {', '.join(meta['skipped_shapes'])}"]
           if meta.get("skipped_shapes") else []),
         "", "## Targets", "",
         "`at floor`: the same statistic for a kernel at the launch floor; `unreachable`: judged rows that "
         "even that kernel would miss.", "",
         "| target | value | threshold | met | at floor | unreachable |", "|---|---|---|---|---|---|"]
    for k, v in targets.items():
        L.append(f"| {k} | {v['value']} | {v['target']} | {v['met']}{' (' + v['missing'] + ')' if v.get('missing') else ''}"
                 f" | {v.get('at_floor_bound')} | {v.get('rows_unreachable_at_floor')} of {v.get('rows')} |")
    L += ["", "Other figures: " + ", ".join(f"{k} = {v}" for k, v in extra.items()), "",
          f"## Measured on {meta['device']}", "",
          "`ours` is a plain launch (the targets use it); `ours PDL` the same kernel as a programmatic "
          "dependent launch, whose weight prefetch overlaps the previous call's tail in this back-to-back chain; "
          "`PDL+cluster` also reduces split-K in a thread-block cluster (plans of 2..8 splits). "
          "`kernel`: the W4A16 kernel the default ran; `split / warp-K us`: both kernels, plain launch "
          "(warp-K: one CTA per 16-row tile, K split over its 8 warps; M <= 16), then warp-K with PDL.",
          "",
          f"`split {ROW_SPLIT_LABELS}` = PDL us with those split targets in SMs (`ours PDL` is the default: "
          "no split where the tiles fill 3/4 of the SMs, or 1/3 of them with K <= 512, else 2x "
          "for weights >= 8 MB (4x from 32 MB), else 1x at M <= 16 and 0.5x above, a target of at most 1x taking the "
          "most splits whose grid fits the SMs). "
          "`warps` = plain/PDL us with 4 and with 8 warps per 128-row CTA (the same bits); `*` marks the "
          f"count the default ran (SGLANG_SM120_W4A16_WARPS={K.WARPS_DEFAULT}; auto: 8 at 9 <= M <= 16 unless the "
          "split-K grid has more than 3 CTAs per SM, else 4).",
          "",
          f"| shape | N | K | M | ours us | kernel | split / warp-K / warp-K PDL us | BW % | at floor us | ours PDL us | split {ROW_SPLIT_LABELS} | warps | PDL+cluster us | bf16 us | x bf16 | Marlin us | x Marlin | W4A4 us |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sweep = "/".join(f"{r['split_target_pdl_us'][lb]:.2f}" for lb, _ in ROW_SPLIT_TARGETS
                         if lb in r.get("split_target_pdl_us", {}))
        kernels = (f"{r['ours_split_us']:.2f} / {r['ours_warpk_us']:.2f} / {r['ours_warpk_pdl_us']:.2f}"
                   if r.get("ours_warpk_us") else "")
        L.append(f"| {r['shape']} | {r['N']} | {r['K']} | {r['M']} | {r['ours_us']:.2f} | {r.get('default_kernel', 'split')} | "
                 f"{kernels} | {r['ours_bw_pct']:.1f} | "
                 f"{r['at_floor_us']:.2f} | {r['ours_pdl_us']:.2f} | {sweep} | {warps_cols(r)} | {r['ours_cluster_pdl_us']:.2f}{'' if r['cluster_plan'] else ' (no cluster)'} | "
                 f"{r['bf16_us']:.2f} | {r['speedup_vs_bf16']:.2f} | "
                 f"{'%.2f' % r['marlin_us'] if r['marlin_us'] else 'n/a'} | "
                 f"{'%.2f' % r['speedup_vs_marlin'] if r['speedup_vs_marlin'] else 'n/a'} | "
                 f"{'%.2f' % r['ours_w4a4_us'] if r.get('ours_w4a4_us') else ''} |")
    L += ["", "## SM120 (RTX PRO 6000) -- ESTIMATE from the roofline, not measured", "",
          est["note"], "", "| shape | M | est. ours us | est. bf16 us | est. x bf16 |", "|---|---|---|---|---|"]
    for e in est["rows"]:
        L.append(f"| {e['shape']} | {e['M']} | {e['est_ours_us']:.2f} | {e['est_bf16_us']:.2f} | {e['est_speedup_vs_bf16']:.2f} |")
    if tuning:
        L += ["", "## Split-K target sweep (W4A16: plain / PDL us per call, splits; target 'none' = no split)", ""]
        for t in tuning:
            L.append(f"- {t['shape']} M={t['M']}: " + ", ".join(
                f"{label}: {c['us']:.2f} / {c['pdl_us']:.2f} us ({c['splits']} splits)" for label, c in t["targets"].items()))
    path.write_text("\n".join(L) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="4 shapes, fewer replays")
    ap.add_argument("--shapes", default="", help="comma list of shape names (substring match)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--no-tune", action="store_true", help="skip the split-K target sweep")
    ap.add_argument("--results-dir", type=Path, default=REPO / "benchmarks" / "results")
    ap.add_argument("--max-seconds", type=float, default=0.0,
                    help="time budget: shapes not started within it are skipped (and listed in the results)")
    args = ap.parse_args()
    log = Log()
    props = bench_device()
    l2 = props.L2_cache_size
    date = _dt.date.today().isoformat()
    meta = {"date": date, "device": props.name, "capability": list(torch.cuda.get_device_capability(0)),
            "sm_count": props.multi_processor_count, "l2_bytes": l2, "torch": torch.__version__,
            "cuda": torch.version.cuda, "commit": commit(),
            "command": "PYTHONPATH=python python3 benchmarks/bench_fp4_gemm.py " + " ".join(sys.argv[1:]),
            "kernel_archs": K.build_archs(), "reps": args.reps if not args.quick else 7}
    log(f"device {props.name} sm_{meta['capability'][0]}{meta['capability'][1]}, {props.multi_processor_count} SMs, "
        f"L2 {l2 >> 20} MB, kernels {meta['kernel_archs']}")
    copy_bw, meta["copy_bw_tbps_by_method"] = copy_bandwidth(log)
    meta["copy_bw_tbps"] = copy_bw / 1e12
    floor_us = launch_floor_us(meta["reps"])
    meta["launch_floor_us"] = floor_us
    log(f"launch floor: {floor_us:.2f} us per call (one-element kernel, same graph chain)")
    marlin, marlin_reason = load_marlin(log)
    meta["marlin"] = "upstream sglang apply_fp4_marlin_linear" if marlin else f"missing: {marlin_reason}"
    sel = shapes()
    if args.quick:
        sel = [s for s in sel if s[0] in ("glm5 o_proj tp1", "qwen3-30b qkv tp1", "glm5 shared down tp8", "glm5 q_b tp4")]
    if args.shapes:
        sel = select_shapes(args.shapes, sel)
    rows = []
    t0 = time.time()
    meta["time_budget_s"] = args.max_seconds or None
    meta["skipped_shapes"] = []
    for name, n, k in sel:
        if args.max_seconds and time.time() - t0 > args.max_seconds:
            meta["skipped_shapes"].append(name)
            log(f"time budget of {args.max_seconds:.0f} s spent: skipping {name}")
            continue
        try:
            rows += bench_shape(name, n, k, MS, l2, copy_bw, floor_us, marlin, meta["reps"], log)
        except Exception:
            log(f"FAILED {name}:\n{traceback.format_exc()}")
            raise
    over_budget = bool(args.max_seconds) and time.time() - t0 > args.max_seconds
    tuning = [] if (args.no_tune or args.quick or over_budget) else tune_splits(props.multi_processor_count, meta["reps"], log)
    targets, extra = summarize(rows, marlin_reason)
    meta["w4a16_warps_default"] = K.WARPS_DEFAULT
    meta["w4a16_kernel_default"] = K.KERNEL_DEFAULT
    meta["w4a16_default_split_target"] = ("no split where the output tiles fill 3/4 of the SMs, or 1/3 of them "
                                          "with K <= 512, else 2x SMs for weights >= 8 MB "
                                          "(packed + scales; 4x from 32 MB), else 1x SMs at M <= 16 and 0.5x above; "
                                          "a target of at most 1x SMs takes the most splits whose grid fits the SMs "
                                          "(csrc/kernels.h)")
    extra["time_8w_vs_4w_geomean"] = {
        f"m{lo}_{hi}": _geomean([r["ours_8w_us"] / r["ours_4w_us"] for r in rows
                                 if lo <= r["M"] <= hi and "ours_8w_us" in r and "ours_4w_us" in r])
        for lo, hi in ((1, 8), (16, 16), (32, 128))}
    # SM120 estimate: roofline + the fixed per-call overhead measured here for our kernel (the smallest
    # time at M=1 minus its bandwidth time), so tiny shapes are not credited with zero overhead.
    m1 = [r for r in rows if r["M"] == 1]
    overhead = max(0.0, min(r["ours_us"] - fp4_bytes(r["N"], r["K"], 1) / copy_bw * 1e6 for r in m1)) if m1 else 2.0
    est_rows = []
    for r in rows:
        t4, t16 = sm120_estimate(r["N"], r["K"], r["M"], overhead)
        est_rows.append({"shape": r["shape"], "M": r["M"], "est_ours_us": t4, "est_bf16_us": t16,
                         "est_speedup_vs_bf16": t16 / t4})
    est = {"label": "ESTIMATE (roofline, not measured)",
           "note": (f"Estimate: t = max(bytes / 1.792 TB/s, 2*M*N*K / 504 TFLOP/s) + {overhead:.2f} us fixed "
                    "overhead (measured here for our kernel at M=1); bytes = 0.5625*N*K + 2*M*K + 2*M*N "
                    "(bf16: 2*N*K + ...). Assumes both kernels reach the roofline; no SM120 GPU was used."),
           "fixed_overhead_us": overhead, "rows": est_rows}
    result = {"meta": meta, "targets": targets, "summary": extra,
              "rows": rows, "sm120_estimate": est,
              "split_target_sweep": tuning, "elapsed_s": round(time.time() - t0, 1)}
    args.results_dir.mkdir(parents=True, exist_ok=True)
    jpath = args.results_dir / "fp4-gemm.json"
    mpath = args.results_dir / "fp4-gemm.md"
    jpath.write_text(json.dumps(result, indent=1))
    write_md(mpath, meta, rows, targets, extra, est, tuning)
    log(f"wrote {jpath} and {mpath}")
    print("\nSUMMARY (us per call; x = speedup of ours)")
    print(f"{'shape':28s} {'M':>4s} {'ours':>8s} {'BW%':>6s} {'bf16':>8s} {'x':>6s} {'marlin':>8s} {'x':>6s}")
    for r in rows:
        if r["M"] in (1, 8, 16, 64, 128):
            print(f"{r['shape']:28s} {r['M']:4d} {r['ours_us']:8.2f} {r['ours_bw_pct']:6.1f} {r['bf16_us']:8.2f} "
                  f"{r['speedup_vs_bf16']:6.2f} {(r['marlin_us'] or float('nan')):8.2f} "
                  f"{(r['speedup_vs_marlin'] or float('nan')):6.2f}")
    print("TARGETS: " + json.dumps(targets))
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        for path in (jpath, mpath):
            if path.resolve().parent != Path(out).resolve():  # --results-dir $OUT: already there
                shutil.copy(path, out)
        (Path(out) / "bench_fp4_gemm.log").write_text("\n".join(log.lines) + "\n")


if __name__ == "__main__":
    main()

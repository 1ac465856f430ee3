"""FP4 (W4A16) kernel probes in the benchmark's harness (benchmarks/bench_fp4_gemm.py: CUDA-graph
replays of one op per rotating weight copy, the copies together > 2x L2 so weights come from HBM;
weights seeded by the shape, as every tool times the benchmark's values).

    python3 lab/fp4_lab.py SUBCOMMAND [options]    (SUBCOMMAND --help for each)

sglang.sm120 comes from the installed fork, or from python/ (PYTHONPATH=python) where no sglang is
installed; the kernel library from $SGLANG_SM120_KERNEL_LIB when set.

Subcommands:
  order-probe  does the order of the timed graphs move plain-launch times?
  marlin-rows  ours (default plan, plain) against upstream's Marlin FP4 GEMM on chosen rows, ABBA rounds
  pdl-chain    one shape plain vs PDL per M, random vs all-zero activations, SM clock/power sampled
  profile      one launch per case between cudaProfilerStart/Stop, for Nsight Compute
  hot-cold     weights from HBM vs L2-resident: is a call bound by HBM or by its instruction stream?
  kernel-ab    W4A16 kernels side by side on every projection shape at M <= 16, plain and PDL

torch and the fork are imported only when a subcommand runs, so --help works anywhere.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import json
import shutil
import statistics
import subprocess
import sys
import types
from pathlib import Path


# ---- shared helpers ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def bench():
    """The benchmark's timing harness (sglang.sm120.check.gemm_timing: time_ops, rotating_weights,
    shape_weight, ..., as benchmarks/bench_fp4_gemm.py uses it) with the installed fork's kernels
    (`K`) and torch beside it."""
    import torch

    from sglang.sm120 import kernels
    from sglang.sm120.check import gemm_timing

    names = {n: getattr(gemm_timing, n) for n in dir(gemm_timing) if not n.startswith("_")}
    return types.SimpleNamespace(**names, K=kernels, torch=torch)


def device():
    """(L2 bytes, SM count) of GPU 0."""
    props = bench().torch.cuda.get_device_properties(0)
    return props.L2_cache_size, props.multi_processor_count


def int_list(text):
    """"1,2,4" -> [1, 2, 4]; blanks skipped."""
    return [int(v) for v in text.split(",") if v.strip()]


def packed(n, k, l2=None):
    """The benchmark's seeded (N, K) weight: (fp32 weight, modelopt quantization, packed weight,
    rotating packed copies or None without `l2`)."""
    B = bench()
    w, q = B.shape_weight(n, k)
    pw = B.K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
    return w, q, pw, (B.rotating_weights(pw, l2) if l2 else None)


def bf16_copies(w, l2):
    """w as bf16 and enough clones (> 2x L2 in all) that a graph over them reads from HBM."""
    B = bench()
    wb = w.to(B.torch.bfloat16)
    return [wb] + [wb.clone() for _ in range(B.copies_for(2 * w.shape[0] * w.shape[1], l2) - 1)]


def activation(m, k):
    torch = bench().torch
    return torch.randn(m, k, device="cuda").to(torch.bfloat16)


def w4a16_ops(x, pws, **kw):
    """One gemm_w4a16 call per rotating weight copy."""
    K = bench().K
    return [lambda p=p: K.gemm_w4a16(x, p, **kw) for p in pws]


def bf16_ops(x, wbs):
    linear = bench().torch.nn.functional.linear
    return [lambda b=b: linear(x, b) for b in wbs]


def free():
    """Return the freed per-shape tensors (the caller dels them first) to the device before the next shape."""
    bench().torch.cuda.empty_cache()


class Rows:
    """A JSON-lines results file, flushed after every row so a killed run keeps its rows."""

    def __init__(self, path: Path):
        self.f = path.open("w")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()

    def write(self, row):
        self.f.write(json.dumps(row) + "\n")
        self.f.flush()


# ---- subcommands -------------------------------------------------------------------------------

ORDER_SEQUENCE = "PPDPPBPDP"


def order_probe(args):
    """Does the order of the timed CUDA graphs move bench_fp4_gemm.py's plain-launch times? Times one
    op in a fixed sequence of plain (P) and PDL (D) graphs plus a bf16 matmul graph (B), per shape and
    M, and prints each position's time (one JSON row per shape and M), so the condition that moves
    plain launches shows."""
    B = bench()
    l2, _ = device()
    out = []
    for n, k in ((640, 2048), (512, 6144), (6144, 2048), (16384, 2048)):
        w, _, _, pws = packed(n, k, l2)
        wbs = bf16_copies(w, l2)
        for m in (1, 16):
            x = activation(m, k)
            times = []
            for step in ORDER_SEQUENCE:
                ops = bf16_ops(x, wbs) if step == "B" else w4a16_ops(x, pws, pdl=(step == "D"))
                times.append(round(B.time_ops(ops, 15), 3))
            row = {"N": n, "K": k, "M": m, "sequence": ORDER_SEQUENCE, "us": times}
            out.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


def marlin_rows(args):
    """Re-times ours (the default W4A16 plan, plain launch) against upstream's Marlin FP4 GEMM on
    chosen rows, in ABBA rounds (ours, Marlin, Marlin, ours), each timing in the benchmark's harness
    (every graph right after a plain one, as the benchmark orders its target columns). One benchmark
    run times each side once per row, so a row within a few % of the 1.2x line can cross it between
    runs; this says where the row lies once both sides are sampled several times in one process."""
    B = bench()
    args.bf16_copies = args.bf16_copies or args.bf16_before != "none"
    marlin, reason = B.load_marlin(print)
    if marlin is None:
        raise SystemExit(reason)
    l2, _ = device()
    with Rows(args.out) as rows:
        for name, n, k in B.select_shapes(args.shapes):
            w, q, _, pws = packed(n, k, l2)
            wbs = bf16_copies(w, l2) if args.bf16_copies else None
            layers = B.marlin_copies(q, n, k, marlin[1], len(pws))
            for m in int_list(args.ms):
                x = activation(m, k)
                ours_ops = w4a16_ops(x, pws, pdl=False)
                marlin_ops = B.marlin_ops(marlin[0], layers, x, n, k)
                t = {"ours": [], "marlin": []}
                for _ in range(args.rounds):
                    for side in ("ours", "marlin", "marlin", "ours"):
                        if args.bf16_before == "both" or (side == "marlin" and args.bf16_before == "marlin"):
                            t.setdefault("bf16", []).append(B.time_ops(bf16_ops(x, wbs), args.reps))
                        t[side].append(B.time_ops(ours_ops if side == "ours" else marlin_ops, args.reps))
                ours, mar = statistics.mean(t["ours"]), statistics.mean(t["marlin"])
                # the ratio of each round's means: its spread says how far one pair can wander
                per_round = [(t["marlin"][2 * i] + t["marlin"][2 * i + 1]) / (t["ours"][2 * i] + t["ours"][2 * i + 1])
                             for i in range(args.rounds)]
                row = {"shape": name, "N": n, "K": k, "M": m, "ours_us": t["ours"], "marlin_us": t["marlin"],
                       "x_marlin": mar / ours, "x_marlin_per_round": per_round,
                       "x_marlin_single_pairs": [mb / oa for oa, mb in zip(t["ours"][0::2], t["marlin"][0::2])]}
                rows.write(row)
                print(f"{name:28s} M={m:3d} ours {ours:6.2f} us  Marlin {mar:6.2f} us  x Marlin {mar / ours:.3f} "
                      f"(rounds {min(per_round):.3f}-{max(per_round):.3f}; single pairs "
                      f"{min(row['x_marlin_single_pairs']):.3f}-{max(row['x_marlin_single_pairs']):.3f})", flush=True)
            del pws, layers, wbs
            free()


def smi_sampler(path):
    """nvidia-smi sampling SM clock (MHz) and power (W) every 50 ms into `path`, or None."""
    cmd = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"]
    if shutil.which("stdbuf"):  # nvidia-smi block-buffers a file: unflushed samples die with it
        cmd = ["stdbuf", "-oL"] + cmd
    try:
        return subprocess.Popen(cmd, stdout=path.open("w"), stderr=subprocess.DEVNULL)
    except OSError as e:
        print(f"[pdl-probe] no nvidia-smi sampling: {e}", flush=True)
        return None


def pdl_chain(args):
    """Times one shape's W4A16 call, plain and PDL (each twice, interleaved), at each M, with random
    activations and with all-zero ones (same bytes moved, no MMA data toggling), while nvidia-smi
    samples the SM clock and board power into OUT with suffix .smi.csv. A step between two M with
    the same kernel and grid points at the schedule; a gap that follows the data and the clock
    points at power."""
    B = bench()
    shapes = B.select_shapes(args.shape)
    if len(shapes) != 1:
        args.parser.error(f"--shape must name one shape, got {[s[0] for s in shapes]}")
    name, n, k = shapes[0]
    l2, _ = device()
    _, _, _, pws = packed(n, k, l2)
    smi = smi_sampler(args.out.with_suffix(".smi.csv"))
    with Rows(args.out) as rows:
        for m in int_list(args.ms):
            for data in ("random", "zeros"):
                x = activation(m, k)
                if data == "zeros":
                    x.zero_()
                row = {"shape": name, "N": n, "K": k, "M": m, "x": data}
                for pdl in (False, True, False, True):  # each twice, interleaved
                    us = B.time_ops(w4a16_ops(x, pws, pdl=pdl), args.reps)
                    row.setdefault("pdl_us" if pdl else "plain_us", []).append(us)
                rows.write(row)
                print(f"{name} M={m:3d} x={data:6s} plain {row['plain_us']} pdl {row['pdl_us']}", flush=True)
    if smi is not None:
        smi.terminate()
        smi.wait()


# (name, N, K, M, split target as a multiple of the SM count or None = the default plan, warps per CTA)
PROFILE_CASES = [
    (name, n, k, m, mult, warps)
    for name, n, k, m, mult in [
        ("glm5 q_a+kv_a", 2624, 6144, 1, None), ("glm5 q_a+kv_a", 2624, 6144, 1, 0.5),
        ("glm5 q_a+kv_a", 2624, 6144, 16, None), ("glm5 q_b tp1", 16384, 2048, 1, None),
        ("glm5 q_b tp1", 16384, 2048, 1, 0.5), ("glm5 o_proj tp1", 6144, 16384, 1, None),
        ("qwen3-30b o_proj tp4", 2048, 1024, 1, None),
    ]
    for warps in (4, 8)
]
PROFILE_BF16_CASES = [("glm5 q_b tp1", 16384, 2048, 1), ("glm5 o_proj tp1", 6144, 16384, 1)]


def profile(args):
    """One launch per case of the W4A16 GEMM (4 and 8 warps; torch's bf16 GEMM beside it) between
    cudaProfilerStart/Stop, for Nsight Compute:
        ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
            python3 lab/fp4_lab.py profile [--cases-out FILE] [--only "q_b tp1" --ms 1,16]
    Per-instruction stall samples: `ncu --set full --import-source no -k regex:gemm_w4a16 -o REP ...`,
    then `ncu -i REP.ncu-rep --page source --csv --print-source sass`. Why: call times cannot say why
    a large weight streams below cuBLAS's bf16 bandwidth; ncu's stall reasons, achieved occupancy and
    DRAM throughput per kernel can. Every case is launched once outside the profiled range first
    (library load, workspace creation), then once inside it, in the order printed (ncu's report
    lists the kernels in that order). ncu flushes the caches before each replay, so the weights come
    from DRAM as in the benchmark's rotation."""
    ms = int_list(args.ms)
    cases = [(name, n, k, m2, mult, warps) for name, n, k, m, mult, warps in PROFILE_CASES if args.only in name
             for m2 in (ms or [m])]
    bf16_cases = [(name, n, k, m2) for name, n, k, m in PROFILE_BF16_CASES if args.only in name
                  for m2 in (ms or [m])]
    if not cases and not bf16_cases:
        sys.exit(f"error: no case name contains {args.only!r}")
    B = bench()
    torch, K = B.torch, B.K
    if not torch.cuda.is_available() or not K.available():
        sys.exit("error: needs a CUDA GPU and the built kernel library (SGLANG_SM120_KERNEL_LIB)")
    _, sms = device()
    ops, order = [], []
    weights = {}
    for name, n, k, m, mult, warps in cases:
        if (n, k) not in weights:
            weights[(n, k)] = packed(n, k)[2]
        pw, x = weights[(n, k)], activation(m, k)
        target = max(1, int(sms * mult)) if mult else None
        split = {"split_target": target} if target else {}
        plan = K.w4a16_plan(m, n, k, sms, **split)
        ops += w4a16_ops(x, [pw], pdl=False, warps=warps, **split)
        order.append({"kernel": "gemm_w4a16", "case": name, "N": n, "K": k, "M": m, "warps": warps,
                      "split_target": target or "default (csrc/kernels.h rule)", "plan": plan})
    for name, n, k, m in bf16_cases:
        ops += bf16_ops(activation(m, k), [torch.randn(n, k, device="cuda").to(torch.bfloat16)])
        order.append({"kernel": "torch bf16 linear (cuBLAS)", "case": name, "N": n, "K": k, "M": m})
    for op in ops:
        op()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for op in ops:
        op()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    for i, c in enumerate(order):
        print(f"case {i}: {json.dumps(c)}")
    if args.cases_out:  # a diagnostic: no issue target of its own, but the results' shape
        args.cases_out.write_text(json.dumps({"targets": {}, "note": "launch order of the ncu report", "cases": order},
                                             indent=1))


HOT_COLD_CASES = ["16384,2048,1", "16384,2048,1,warps=8", "16384,2048,16",
                  "6144,16384,1", "28672,512,1", "6144,2048,16", "5120,2048,1", "512,6144,1"]
INT_KEYS = {"warps", "split_target"}
BOOL_KEYS = {"cluster"}


def parse_case(case: str):
    """"N,K,M[,key=value...]" -> (n, k, m, gemm_w4a16 keyword arguments)."""
    n, k, m = map(int, case.split(",")[:3])
    kw = {}
    for opt in case.split(",")[3:]:
        key, _, value = opt.partition("=")
        kw[key] = int(value) if key in INT_KEYS else bool(int(value)) if key in BOOL_KEYS else value
    return n, k, m, kw


def hot_cold(args):
    """Is a W4A16 call bound by HBM or by its own instruction stream? Times each case twice: weights
    streamed from HBM (rotating copies, > 2x L2) and L2-resident (one copy, replayed 8 times per
    graph). Where the L2-resident call is nearly as slow, fetching the weights is not what limits it.
    A case is N,K,M[,key=value...] (keys: gemm_w4a16's kernel, warps, split_target, cluster=0|1)."""
    B = bench()
    K = B.K
    l2, sms = device()
    with Rows(args.out) as rows:
        for case in args.cases:
            n, k, m, kw = parse_case(case)
            _, _, pw, pws = packed(n, k, l2)
            x = activation(m, k)
            plan_kw = {key: kw[key] for key in ("kernel", "split_target", "cluster") if key in kw}
            row = {"case": case, "N": n, "K": k, "M": m, "plan": K.w4a16_plan(m, n, k, sms, **plan_kw),
                   "weight_bytes": pw.qweight.numel() + pw.scales.numel()}
            cold = B.time_ops(w4a16_ops(x, pws, pdl=False, **kw), args.reps)
            hot = B.time_ops(w4a16_ops(x, [pw], pdl=False, **kw) * 8, args.reps)
            row.update(hbm_us=cold, l2_us=hot, l2_over_hbm=hot / cold,
                       hbm_tbps=row["weight_bytes"] / cold / 1e6)
            rows.write(row)
            print(f"{case:34s} HBM {cold:6.2f} us ({row['hbm_tbps']:.2f} TB/s)  L2-resident {hot:6.2f} us "
                  f"({row['l2_over_hbm']:.2f}x)", flush=True)
            del pws
            free()


def kernel_spec(text):
    """"KERNEL[:WARPS]" -> (label, kernel, warps or None)."""
    kernel, _, warps = text.partition(":")
    return text, kernel, int(warps) if warps else None


def kernel_ab(args):
    """Times W4A16 kernels side by side on every projection shape at M <= 16, plain and PDL launches:
    the data csrc's kernel rule (default_w4a16_warpk) is fitted on. Each row is timed in the order of
    --kernels and then in reverse, so no kernel always follows another's graph; a spec is KERNEL or
    KERNEL:WARPS ("split", "warpk", "split:8"; WARPS applies to the split-K kernel)."""
    B = bench()
    K = B.K
    specs = [kernel_spec(s.strip()) for s in args.kernels.split(",") if s.strip()]
    l2, sms = device()
    with Rows(args.out) as rows:
        for name, n, k in B.select_shapes(args.shapes):
            _, _, _, pws = packed(n, k, l2)
            for m in int_list(args.ms):
                x = activation(m, k)
                runnable = [(label, kn, w) for label, kn, w in specs if not (kn == "warpk" and m > K.WARPK_MAX_M)]
                row = {"shape": name, "N": n, "K": k, "M": m,
                       "default_kernel": "warpk" if K.w4a16_plan(m, n, k, sms)["warpk"] else "split",
                       "plans": {label: K.w4a16_plan(m, n, k, sms, kernel=kn, warps=w) for label, kn, w in runnable}}
                for pdl in (False, True):
                    t = {}
                    for label, kn, w in runnable + runnable[::-1]:
                        t.setdefault(label, []).append(
                            B.time_ops(w4a16_ops(x, pws, pdl=pdl, kernel=kn, warps=w), args.reps))
                    sfx = "_pdl" if pdl else ""
                    for label in t:
                        row[f"{label}{sfx}_us"] = statistics.mean(t[label])
                rows.write(row)
                print(f"{name:28s} M={m:3d} " + " ".join(
                    f"{lb} {row[lb + '_us']:6.2f}/{row[lb + '_pdl_us']:6.2f}" for lb, _, _ in runnable), flush=True)
            del pws
            free()


# ---- command line ------------------------------------------------------------------------------

def parser():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()), epilog=__doc__.split("\n\n", 2)[2],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")

    def command(name, func, *, out_required=True, reps=True):
        summary = next(line.split(None, 1)[1] for line in __doc__.splitlines() if line.startswith(f"  {name} "))
        p = sub.add_parser(name, help=summary.strip(), description=inspect.cleandoc(func.__doc__),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func, parser=p)
        if out_required is not None:
            p.add_argument("--out", type=Path, required=out_required,
                           help="results file (JSON lines)" if out_required else "also write the rows as JSON")
        if reps:
            p.add_argument("--reps", type=int, default=15, help="graph replays per timing (default 15)")
        return p

    command("order-probe", order_probe, out_required=False, reps=False)

    p = command("marlin-rows", marlin_rows)
    p.add_argument("--shapes", required=True, help="comma-separated substrings of the benchmark's shape names")
    p.add_argument("--ms", default="1,2,4,8,16")
    p.add_argument("--rounds", type=int, default=3, help="ABBA rounds (2 timings of each side per round)")
    p.add_argument("--bf16-copies", action="store_true",
                   help="allocate the benchmark's rotating bf16 weight copies before the Marlin layers, as "
                        "bench_fp4_gemm.py does (so the Marlin weights land where they land there)")
    p.add_argument("--bf16-before", choices=("none", "marlin", "both"), default="none",
                   help="time a bf16 torch.nn.functional.linear graph right before every Marlin timing (the graph "
                        "that precedes Marlin in bench_fp4_gemm.py's rows) or before every timing of both sides "
                        "(implies --bf16-copies)")

    p = command("pdl-chain", pdl_chain)
    p.add_argument("--shape", default="glm5 q_b tp1", help="a substring naming exactly one benchmark shape")
    p.add_argument("--ms", default="1,2,4,5,6,7,8,16")

    p = command("profile", profile, out_required=None, reps=False)
    p.add_argument("--cases-out", type=Path, default=None, help="the launch order as JSON ({targets, note, cases})")
    p.add_argument("--only", default="", help="profile only the cases whose name contains this text")
    p.add_argument("--ms", default="", help="comma list of M replacing each selected case's M (e.g. 1,16)")

    p = command("hot-cold", hot_cold)
    p.add_argument("--cases", nargs="*", default=HOT_COLD_CASES, help="N,K,M[,key=value...] (default: %(default)s)")

    p = command("kernel-ab", kernel_ab)
    p.add_argument("--shapes", default="", help="comma-separated substrings of the benchmark's shape names "
                                                "(default: every shape)")
    p.add_argument("--ms", default="1,2,4,8,16")
    p.add_argument("--kernels", default="warpk,split", help="comma-separated KERNEL[:WARPS] specs")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()

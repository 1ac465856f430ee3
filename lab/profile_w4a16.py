"""One launch per case of the W4A16 GEMM (4 and 8 warps; torch's bf16 GEMM beside it) between
cudaProfilerStart/Stop, for Nsight Compute to profile:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python3 lab/profile_w4a16.py [--cases-out FILE] [--only "q_b tp1" --ms 1,16]

Per-instruction stall samples (session 15): `ncu --set full --import-source no -k regex:gemm_w4a16
-o REP ...`, then `ncu -i REP.ncu-rep --page source --csv --print-source sass`.

Why: bench_fp4_gemm.py times calls, but cannot say why a >= 8 MB weight streams at ~2.2 TB/s
while cuBLAS reads bf16 weights at ~3.7 TB/s (2026-12-01). ncu's stall reasons, achieved
occupancy and DRAM throughput per kernel can. Every case is launched once outside the profiled
range first (library load, workspace creation), then once inside it, in the order printed (ncu's
report lists the kernels in the same order). ncu flushes the caches before each replay, so the
weights come from DRAM as in the benchmark's rotation.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_fp4_gemm import K, F  # noqa: E402  (this checkout's overlay, as the benchmark uses it)

# (name, N, K, M, split target as a multiple of the SM count or None = the default plan, warps per CTA)
CASES = [
    (name, n, k, m, mult, warps)
    for name, n, k, m, mult in [
        ("glm5 q_a+kv_a", 2624, 6144, 1, None), ("glm5 q_a+kv_a", 2624, 6144, 1, 0.5),
        ("glm5 q_a+kv_a", 2624, 6144, 16, None), ("glm5 q_b tp1", 16384, 2048, 1, None),
        ("glm5 q_b tp1", 16384, 2048, 1, 0.5), ("glm5 o_proj tp1", 6144, 16384, 1, None),
        ("qwen3-30b o_proj tp4", 2048, 1024, 1, None),
    ]
    for warps in (4, 8)
]
BF16_CASES = [("glm5 q_b tp1", 16384, 2048, 1), ("glm5 o_proj tp1", 6144, 16384, 1)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases-out", type=Path, default=None, help="the launch order as JSON ({targets, note, cases})")
    ap.add_argument("--only", default="", help="profile only the cases whose name contains this text")
    ap.add_argument("--ms", default="", help="comma list of M replacing each selected case's M (e.g. 1,16)")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",") if v.strip()]
    cases = [(name, n, k, m2, mult, warps) for name, n, k, m, mult, warps in CASES if args.only in name
             for m2 in (ms or [m])]
    bf16_cases = [(name, n, k, m2) for name, n, k, m in BF16_CASES if args.only in name for m2 in (ms or [m])]
    if not cases and not bf16_cases:
        sys.exit(f"error: no case name contains {args.only!r}")
    if not torch.cuda.is_available() or not K.available():
        sys.exit("error: needs a CUDA GPU and the built kernel library (SGLANG_SM120_KERNEL_LIB)")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ops, order = [], []
    weights = {}
    for name, n, k, m, mult, warps in cases:
        if (n, k) not in weights:
            q = F.quantize_weight_modelopt(torch.randn(n, k, device="cuda") * 0.02)
            weights[(n, k)] = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
        pw, x = weights[(n, k)], torch.randn(m, k, device="cuda").to(torch.bfloat16)
        target = max(1, int(sms * mult)) if mult else None
        plan = K.w4a16_plan(m, n, k, sms, **({"split_target": target} if target else {}))
        kw = {"pdl": False, "warps": warps, **({"split_target": target} if target else {})}
        ops.append(lambda x=x, pw=pw, kw=kw: K.gemm_w4a16(x, pw, **kw))
        order.append({"kernel": "gemm_w4a16", "case": name, "N": n, "K": k, "M": m, "warps": warps,
                      "split_target": target or "default (csrc/kernels.h rule)", "plan": plan})
    for name, n, k, m in bf16_cases:
        w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ops.append(lambda x=x, w=w: torch.nn.functional.linear(x, w))
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


if __name__ == "__main__":
    main()

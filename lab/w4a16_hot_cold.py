"""Is a W4A16 call bound by HBM or by its own instruction stream? Times each case twice in the
bench's harness: weights streamed from HBM (rotating copies, > 2x L2, as the benchmark does) and
L2-resident (one copy, replayed 8 times per graph). Where the L2-resident call is nearly as slow,
fetching the weights is not what limits it.

    PYTHONPATH=python python3 lab/w4a16_hot_cold.py --out hot_cold.jsonl \
        [--cases N,K,M[,key=value...] ...]   (keys: gemm_w4a16's kernel, warps, split_target, cluster=0|1)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_fp4_gemm as B  # noqa: E402  (puts this checkout's kernels first)

import torch  # noqa: E402

K = B.K
DEFAULT_CASES = ["16384,2048,1", "16384,2048,1,warps=8", "16384,2048,16",
                 "6144,16384,1", "28672,512,1", "6144,2048,16", "5120,2048,1", "512,6144,1"]
INT_KEYS = {"warps", "split_target"}
BOOL_KEYS = {"cluster"}


def parse(case: str):
    n, k, m = map(int, case.split(",")[:3])
    kw = {}
    for opt in case.split(",")[3:]:
        key, _, value = opt.partition("=")
        kw[key] = int(value) if key in INT_KEYS else bool(int(value)) if key in BOOL_KEYS else value
    return n, k, m, kw


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", nargs="*", default=DEFAULT_CASES)
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    with args.out.open("w") as f:
        for case in args.cases:
            n, k, m, kw = parse(case)
            _, q = B.shape_weight(n, k)
            pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
            pws = B.rotating_weights(pw, l2)
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            plan_kw = {key: kw[key] for key in ("kernel", "split_target", "cluster") if key in kw}
            row = {"case": case, "N": n, "K": k, "M": m, "plan": K.w4a16_plan(m, n, k, sms, **plan_kw),
                   "weight_bytes": pw.qweight.numel() + pw.scales.numel()}
            cold = B.time_ops([lambda p=p: K.gemm_w4a16(x, p, pdl=False, **kw) for p in pws], args.reps)
            hot = B.time_ops([lambda: K.gemm_w4a16(x, pw, pdl=False, **kw)] * 8, args.reps)
            row.update(hbm_us=cold, l2_us=hot, l2_over_hbm=hot / cold,
                       hbm_tbps=row["weight_bytes"] / cold / 1e6)
            f.write(json.dumps(row) + "\n")
            f.flush()
            print(f"{case:34s} HBM {cold:6.2f} us ({row['hbm_tbps']:.2f} TB/s)  L2-resident {hot:6.2f} us "
                  f"({row['l2_over_hbm']:.2f}x)", flush=True)
            del pws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

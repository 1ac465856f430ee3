"""Times W4A16 kernels side by side on every projection shape at M <= 16, in the bench's harness
(CUDA-graph replays over rotating weight copies), plain and PDL launches; the data csrc's kernel
rule (default_w4a16_warpk) is fitted on. Each row is timed in the order of --kernels and then in
reverse, so no kernel always follows another's graph; a spec is KERNEL or KERNEL:WARPS ("split",
"warpk", "split:8"; WARPS applies to the split-K kernel).

    PYTHONPATH=python python3 lab/w4a16_kernel_ab.py --out ab.jsonl [--shapes a,b] \
        [--kernels warpk,split]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_fp4_gemm as B  # noqa: E402  (puts this checkout's kernels first)

import torch  # noqa: E402

K = B.K


def _spec(text):
    kernel, _, warps = text.partition(":")
    return text, kernel, int(warps) if warps else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--kernels", default="warpk,split", help="comma-separated KERNEL[:WARPS] specs")
    args = ap.parse_args()
    specs = [_spec(s.strip()) for s in args.kernels.split(",") if s.strip()]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ms = [int(m) for m in args.ms.split(",")]
    with args.out.open("w") as f:
        for name, n, k in B.select_shapes(args.shapes):
            _, q = B.shape_weight(n, k)
            pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
            pws = B.rotating_weights(pw, l2)
            for m in ms:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                runnable = [(label, kn, w) for label, kn, w in specs if not (kn == "warpk" and m > K.WARPK_MAX_M)]
                row = {"shape": name, "N": n, "K": k, "M": m,
                       "default_kernel": "warpk" if K.w4a16_plan(m, n, k, sms)["warpk"] else "split",
                       "plans": {label: K.w4a16_plan(m, n, k, sms, kernel=kn, warps=w) for label, kn, w in runnable}}
                for pdl in (False, True):
                    t = {}
                    for label, kn, w in runnable + runnable[::-1]:
                        t.setdefault(label, []).append(B.time_ops(
                            [lambda p=p, kn=kn, w=w: K.gemm_w4a16(x, p, pdl=pdl, kernel=kn, warps=w) for p in pws],
                            args.reps))
                    sfx = "_pdl" if pdl else ""
                    for label in t:
                        row[f"{label}{sfx}_us"] = statistics.mean(t[label])
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{name:28s} M={m:3d} " + " ".join(
                    f"{lb} {row[lb + '_us']:6.2f}/{row[lb + '_pdl_us']:6.2f}" for lb, _, _ in runnable), flush=True)
            del pws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

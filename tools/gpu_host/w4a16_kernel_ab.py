"""Times the two W4A16 kernels (split-K and warp-K) on every projection shape at M <= 16, in the
bench's harness (CUDA-graph replays over rotating weight copies), plain and PDL launches; the
data csrc's default_w4a16_warpk rule is fitted on. Each row is timed warp-K, split, warp-K, so
neither kernel always follows the other's graph.

    PYTHONPATH=python python3 tools/gpu_host/w4a16_kernel_ab.py --out ab.jsonl [--shapes a,b]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_fp4_gemm as B  # noqa: E402  (puts this checkout's kernels first)

import torch  # noqa: E402

K, F = B.K, B.F


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = [s.strip() for s in args.shapes.split(",") if s.strip()]
    ms = [int(m) for m in args.ms.split(",")]
    with args.out.open("w") as f:
        for name, n, k in B.shapes():
            if want and not any(w in name for w in want):
                continue
            torch.manual_seed(n * 31 + k)
            q = F.quantize_weight_modelopt(torch.randn(n, k, device="cuda") * 0.02)
            pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
            pws = B.rotating_weights(pw, l2)
            for m in ms:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                row = {"shape": name, "N": n, "K": k, "M": m,
                       "split_plan": K.w4a16_plan(m, n, k, sms, kernel="split"),
                       "default_kernel": "warpk" if K.w4a16_plan(m, n, k, sms)["warpk"] else "split"}
                for pdl in (False, True):
                    t = {}
                    for kernel in ("warpk", "split", "warpk"):
                        t.setdefault(kernel, []).append(B.time_ops(
                            [lambda p=p, kn=kernel: K.gemm_w4a16(x, p, pdl=pdl, kernel=kn) for p in pws], args.reps))
                    sfx = "_pdl" if pdl else ""
                    row[f"warpk{sfx}_us"] = statistics.mean(t["warpk"])
                    row[f"split{sfx}_us"] = t["split"][0]
                row["warpk_over_split"] = row["warpk_us"] / row["split_us"]
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{name:28s} M={m:3d} split {row['split_us']:6.2f} warpk {row['warpk_us']:6.2f} "
                      f"({row['warpk_over_split']:.2f}x)  PDL split {row['split_pdl_us']:6.2f} "
                      f"warpk {row['warpk_pdl_us']:6.2f}", flush=True)
            del pws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

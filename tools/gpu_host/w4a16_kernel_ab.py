"""Times two variants of the W4A16 GEMM on every projection shape at M <= 16, in the bench's harness
(CUDA-graph replays over rotating weight copies), plain and PDL launches: the data csrc's default
rules are fitted on. --compare kernel (default): warp-K vs the split-K kernel (default_w4a16_warpk);
--compare pipeline: the split-K kernel's deep vs shallow pipeline (default_w4a16_deep);
--compare onewave: the deep pipeline with as many splits as keep the grid within one CTA per SM vs
the default. Each row is timed A, B, A, so neither variant always follows the other's graph.

    PYTHONPATH=python python3 tools/gpu_host/w4a16_kernel_ab.py --out ab.jsonl [--compare pipeline]
        [--shapes a,b] [--ms 1,4,16]
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



def _one_wave(m, n, k, sms):
    """The deep pipeline with the most splits whose grid stays within one CTA per SM (None: the
    tiles alone exceed the SMs)."""
    tiles = -(-n // 128) * -(-m // 16)
    return {"pipeline": "deep", "split_target": sms // tiles * tiles} if m <= 16 and tiles <= sms else None


# variant A, variant B: (label, gemm_w4a16 keywords or a function of (m, n, k, sms) giving them,
# None to skip the row); the plan key that says which one the default runs
COMPARISONS = {
    "kernel": (("warpk", {"kernel": "warpk"}), ("split", {"kernel": "split"}), "warpk"),
    "pipeline": (("deep", {"pipeline": "deep"}), ("shallow", {"kernel": "split", "pipeline": "shallow"}), "deep"),
    "onewave": (("onewave", _one_wave), ("default", {}), None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--compare", choices=sorted(COMPARISONS), default="kernel")
    ap.add_argument("--shapes", default="")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    (a, a_kws), (b, b_kws), plan_key = COMPARISONS[args.compare]
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
            pws = [pw] + [K.PackedWeight(pw.qweight.clone(), pw.scales.clone(), pw.weight_scale_2.clone(), n, k)
                          for _ in range(B.copies_for(0.5625 * n * k, l2) - 1)]
            for m in ms:
                a_kw, b_kw = (kw(m, n, k, sms) if callable(kw) else kw for kw in (a_kws, b_kws))
                if a_kw is None or b_kw is None:
                    continue
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                default = K.w4a16_plan(m, n, k, sms)
                row = {"shape": name, "N": n, "K": k, "M": m, "compare": args.compare,
                       f"{a}_plan": K.w4a16_plan(m, n, k, sms, **a_kw), f"{b}_plan": K.w4a16_plan(m, n, k, sms, **b_kw),
                       "default": (a if default[plan_key] else b) if plan_key else b}
                for pdl in (False, True):
                    t = {}
                    for label, kw in ((a, a_kw), (b, b_kw), (a, a_kw)):
                        t.setdefault(label, []).append(B.time_ops(
                            [lambda p=p, kw=kw: K.gemm_w4a16(x, p, pdl=pdl, **kw) for p in pws], args.reps))
                    sfx = "_pdl" if pdl else ""
                    row[f"{a}{sfx}_us"] = statistics.mean(t[a])
                    row[f"{b}{sfx}_us"] = t[b][0]
                row[f"{a}_over_{b}"] = row[f"{a}_us"] / row[f"{b}_us"]
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{name:28s} M={m:3d} {b} {row[f'{b}_us']:6.2f} {a} {row[f'{a}_us']:6.2f} "
                      f"({row[f'{a}_over_{b}']:.2f}x)  PDL {b} {row[f'{b}_pdl_us']:6.2f} "
                      f"{a} {row[f'{a}_pdl_us']:6.2f}  default {row['default']}", flush=True)
            del pws
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

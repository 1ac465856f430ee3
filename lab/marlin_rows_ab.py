"""Re-times ours (the default W4A16 plan, plain launch) against upstream's Marlin FP4 GEMM on chosen
rows, in ABBA rounds (ours, Marlin, Marlin, ours), each timing in the benchmark's harness (CUDA-graph
replays over rotating weight copies; every graph right after a plain one, as the benchmark orders
its target columns). One benchmark run times each side once per row, and on rows within a few %
of the 1.2x line that single pair moves the ratio across it between runs; this says where a row
lies once both sides are sampled several times in the same process.

    TVM_FFI_CACHE_DIR=/tmp/jitcache PYTHONPATH=/tmp/site:$PWD/python \\
        python3 lab/marlin_rows_ab.py --shapes "glm5 q_b tp1,gate_up tp4" --out rows.jsonl
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", required=True, help="comma-separated substrings of the benchmark's shape names")
    ap.add_argument("--ms", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=3, help="ABBA rounds (2 timings of each side per round)")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--bf16-copies", action="store_true",
                    help="allocate the benchmark's rotating bf16 weight copies before the Marlin layers, as "
                         "bench_fp4_gemm.py does (so the Marlin weights land where they land there)")
    ap.add_argument("--bf16-before", choices=("none", "marlin", "both"), default="none",
                    help="time a bf16 torch.nn.functional.linear graph right before every Marlin timing (the graph "
                         "that precedes Marlin in bench_fp4_gemm.py's rows) or before every timing of both sides "
                         "(implies --bf16-copies)")
    args = ap.parse_args()
    args.bf16_copies = args.bf16_copies or args.bf16_before != "none"
    marlin, reason = B.load_marlin(print)
    if marlin is None:
        raise SystemExit(reason)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    ms = [int(m) for m in args.ms.split(",")]
    with args.out.open("w") as f:
        for name, n, k in B.select_shapes(args.shapes):
            _, q = B.shape_weight(n, k)
            pws = B.rotating_weights(K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"]), l2)
            wbs = None
            if args.bf16_copies:
                wb = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
                wbs = [wb] + [wb.clone() for _ in range(B.copies_for(2 * n * k, l2) - 1)]
            layers = B.marlin_copies(q, n, k, marlin[1], len(pws))
            for m in ms:
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                ours_ops = [lambda p=p: K.gemm_w4a16(x, p, pdl=False) for p in pws]
                marlin_ops = B.marlin_ops(marlin[0], layers, x, n, k)
                t = {"ours": [], "marlin": []}
                for _ in range(args.rounds):
                    for side in ("ours", "marlin", "marlin", "ours"):
                        if args.bf16_before == "both" or (side == "marlin" and args.bf16_before == "marlin"):
                            t.setdefault("bf16", []).append(B.time_ops(
                                [lambda b=b: torch.nn.functional.linear(x, b) for b in wbs], args.reps))
                        t[side].append(B.time_ops(ours_ops if side == "ours" else marlin_ops, args.reps))
                ours, mar = statistics.mean(t["ours"]), statistics.mean(t["marlin"])
                # the ratio of each round's means: its spread says how far one pair can wander
                per_round = [(t["marlin"][2 * i] + t["marlin"][2 * i + 1]) / (t["ours"][2 * i] + t["ours"][2 * i + 1])
                             for i in range(args.rounds)]
                row = {"shape": name, "N": n, "K": k, "M": m, "ours_us": t["ours"], "marlin_us": t["marlin"],
                       "x_marlin": mar / ours, "x_marlin_per_round": per_round,
                       "x_marlin_single_pairs": [mb / oa for oa, mb in zip(t["ours"][0::2], t["marlin"][0::2])]}
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{name:28s} M={m:3d} ours {ours:6.2f} us  Marlin {mar:6.2f} us  x Marlin {mar / ours:.3f} "
                      f"(rounds {min(per_round):.3f}-{max(per_round):.3f}; single pairs "
                      f"{min(row['x_marlin_single_pairs']):.3f}-{max(row['x_marlin_single_pairs']):.3f})", flush=True)
            del pws, layers, wbs
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

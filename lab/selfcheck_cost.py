"""Where do the NVFP4 self-check's seconds go on this GPU?

Runs the check kit's order (CUDA up, quantize stage) in a fresh process per trial, then times the
server's self-check (fp4_selfcheck.verify_shape) on the quick check's first shape, with or without
a first fp32 matmul (cuBLAS's one-time start) before it, and once more warm. Alternates the two
kinds of trial; writes every trial and the medians as JSON.

    PYTHONPATH=/tmp/site python3 lab/selfcheck_cost.py --out /tmp/res/selfcheck-cost.json --trials 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

N, K = 6144, 256  # the quick check's first shape (glm5 shared down tp8)


def trial(warm_cublas: bool) -> dict:
    import torch

    from sglang.sm120.check import correctness as C
    from sglang.sm120.fp4_selfcheck import verify_shape

    dev = torch.device("cuda", 0)
    torch.zeros(1, device=dev)
    C.run_quantize(lambda m: None)
    torch.cuda.synchronize()
    out = {"warm_cublas": warm_cublas}
    if warm_cublas:
        t = time.perf_counter()
        C.start_cublas()
        out["cublas_start_s"] = round(time.perf_counter() - t, 4)
    first = verify_shape(N, K, dev)
    again = verify_shape(N, K, dev)
    out.update(ok=first.ok and again.ok, selfcheck_s=round(first.seconds, 4), selfcheck_again_s=round(again.seconds, 4))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--one", choices=("cold", "warm"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(trial(args.one == "warm")))
        return 0
    rows = []
    for i in range(args.trials):
        for kind in ("cold", "warm"):
            p = subprocess.run([sys.executable, __file__, "--out", args.out, "--one", kind],
                               capture_output=True, text=True, timeout=300)
            if p.returncode:
                raise SystemExit(f"trial {kind} failed:\n{p.stderr[-3000:]}")
            rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
            print(f"[selfcheck-cost] trial {i + 1} {kind}: {rows[-1]}", flush=True)
    med = {kind: {key: statistics.median(r[key] for r in rows if r["warm_cublas"] == (kind == "warm"))
                  for key in ("selfcheck_s", "selfcheck_again_s") + (("cublas_start_s",) if kind == "warm" else ())}
           for kind in ("cold", "warm")}
    doc = {"what": __doc__.split("\n\n")[0], "targets": {}, "shape": {"N": N, "K": K}, "trials": rows, "median": med,
           "command": " ".join(sys.argv)}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps(med))
    return 0


if __name__ == "__main__":
    sys.exit(main())

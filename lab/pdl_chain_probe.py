"""Times one shape's W4A16 call, plain and PDL, at each M, with random activations and with
all-zero ones (same bytes moved, no MMA data toggling), while `nvidia-smi` samples the SM clock and
board power. A step between two M with the same kernel and grid points at the schedule; a gap that
follows the data and the clock points at power. Session 20 found that way why chains of PDL
launches of glm5 q_b TP 1 ran slower than plain from M 7 on (the split-K kernel's early trigger,
since moved after its store; docs/kernels.md "Session 20").

    PYTHONPATH=python python3 lab/pdl_chain_probe.py --out probe.jsonl \
        [--shape "glm5 q_b tp1"] [--ms 1,2,4,5,6,7,8,16]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_fp4_gemm as B  # noqa: E402  (puts this checkout's kernels first)

import torch  # noqa: E402

K = B.K


def sampler(path):
    """nvidia-smi sampling SM clock (MHz) and power (W) every 50 ms into `path`, or None."""
    cmd = ["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader,nounits", "-lms", "50"]
    if shutil.which("stdbuf"):  # nvidia-smi block-buffers a file: unflushed samples die with it
        cmd = ["stdbuf", "-oL"] + cmd
    try:
        return subprocess.Popen(cmd, stdout=path.open("w"), stderr=subprocess.DEVNULL)
    except OSError as e:
        print(f"[pdl-probe] no nvidia-smi sampling: {e}", flush=True)
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="glm5 q_b tp1")
    ap.add_argument("--ms", default="1,2,4,5,6,7,8,16")
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    shapes = B.select_shapes(args.shape)
    if len(shapes) != 1:
        ap.error(f"--shape must name one shape, got {[s[0] for s in shapes]}")
    name, n, k = shapes[0]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    _, q = B.shape_weight(n, k)
    pws = B.rotating_weights(K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"]), l2)
    smi = sampler(args.out.with_suffix(".smi.csv"))
    with args.out.open("w") as f:
        for m in (int(v) for v in args.ms.split(",")):
            for data in ("random", "zeros"):
                x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
                if data == "zeros":
                    x.zero_()
                row = {"shape": name, "N": n, "K": k, "M": m, "x": data}
                for pdl in (False, True, False, True):  # each twice, interleaved
                    us = B.time_ops([lambda p=p: K.gemm_w4a16(x, p, pdl=pdl) for p in pws], args.reps)
                    row.setdefault("pdl_us" if pdl else "plain_us", []).append(us)
                f.write(json.dumps(row) + "\n")
                f.flush()
                print(f"{name} M={m:3d} x={data:6s} plain {row['plain_us']} pdl {row['pdl_us']}", flush=True)
    if smi is not None:
        smi.terminate()
        smi.wait()


if __name__ == "__main__":
    main()

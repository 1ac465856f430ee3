"""Does the order of the timed CUDA graphs move bench_fp4_gemm.py's plain-launch times? (session 12)

In the H200 runs of 2026-12-02 the row's `ours` plain column, timed before any PDL graph of the
row, ran 1.045x (median) the same op timed later in the row, after a PDL graph; PDL columns agreed
to 1.000x, and a discarded warm-up graph in the first slot did not remove it. This times one op
in a fixed sequence of plain (P) and PDL (D) graphs, plus a bf16 matmul graph (B), per shape and M,
and prints each position's time, so the condition that moves plain launches shows.

    PYTHONPATH=python python3 lab/fp4_order_probe.py [--out FILE.json]
"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEQUENCE = "PPDPPBPDP"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("bench_fp4_gemm", REPO / "benchmarks" / "bench_fp4_gemm.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    torch, K, F = bench.torch, bench.K, bench.F
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    out = []
    for n, k in ((640, 2048), (512, 6144), (6144, 2048), (16384, 2048)):
        w = torch.randn(n, k, device="cuda") * 0.02
        q = F.quantize_weight_modelopt(w)
        pw = K.pack_weight(q["weight"], q["weight_scale"], q["weight_scale_2"])
        pws = bench.rotating_weights(pw, l2)
        wb = w.to(torch.bfloat16)
        wbs = [wb] + [wb.clone() for _ in range(bench.copies_for(2 * n * k, l2) - 1)]
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            times = []
            for step in SEQUENCE:
                if step == "B":
                    ops = [lambda b=b: torch.nn.functional.linear(x, b) for b in wbs]
                else:
                    ops = [lambda p=p, d=(step == "D"): K.gemm_w4a16(x, p, pdl=d) for p in pws]
                times.append(round(bench.time_ops(ops, 15), 3))
            row = {"N": n, "K": k, "M": m, "sequence": SEQUENCE, "us": times}
            out.append(row)
            print(json.dumps(row), flush=True)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())

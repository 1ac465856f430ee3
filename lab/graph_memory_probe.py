"""Device memory per instantiated CUDA graph on this GPU, outside torch's caching allocator.

    python3 lab/graph_memory_probe.py --out RESULTS/graph-memory.json

Why: layerwise decode at upstream's 36 sizes instantiates 36 x 49 segment graphs where upstream's
full graphs are 36, so its graph memory is a multiple of theirs. The capture report splits that
memory into torch's allocator and the rest; this measures the rest per graph directly. For each case, N graphs of K in-place one-element kernels (no allocation inside
the graphs) are captured into one pool and instantiated; the drop in free device memory minus the
growth of torch's reserved memory, over N, is the memory a graph costs outside the allocator.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

CASES = [(64, 1), (64, 64), (512, 1), (512, 16), (2048, 1), (2048, 16)]  # (graphs, kernels per graph)


def measure(n_graphs: int, kernels: int) -> dict:
    t = torch.zeros(1, device="cuda")
    stream = torch.cuda.Stream()
    pool = torch.cuda.graph_pool_handle()
    torch.cuda.synchronize()
    free0, reserved0 = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
    tic = time.perf_counter()
    graphs = []
    for _ in range(n_graphs):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=stream):
            for _ in range(kernels):
                t.add_(1.0)
        graphs.append(g)
    graphs[-1].replay()  # instantiated and runnable
    torch.cuda.synchronize()
    seconds = time.perf_counter() - tic
    free1, reserved1 = torch.cuda.mem_get_info()[0], torch.cuda.memory_reserved()
    outside = (free0 - free1) - (reserved1 - reserved0)
    del graphs
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return {"graphs": n_graphs, "kernels_per_graph": kernels, "free_drop_bytes": free0 - free1,
            "allocator_growth_bytes": reserved1 - reserved0, "outside_allocator_bytes": outside,
            "outside_bytes_per_graph": outside / n_graphs, "capture_seconds": round(seconds, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "scratch" / "graph-memory.json",
                    help="where the JSON goes (default lab/scratch/, git-ignored)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("graph_memory_probe: error: needs a CUDA GPU", file=sys.stderr)
        return 2
    measure(8, 1)  # CUDA context, the pool's first segment, lazy module loads: not counted
    rows = []
    for n, k in CASES:
        r = measure(n, k)
        rows.append(r)
        print(f"[graph-memory] {n:5d} graphs x {k:3d} kernels: {r['outside_bytes_per_graph'] / 1024:9.1f} KiB per graph "
              f"outside the allocator (allocator +{r['allocator_growth_bytes'] / 2**20:.1f} MiB), "
              f"{r['capture_seconds']:.2f} s", flush=True)
    doc = {"targets": {}, "note": "diagnostic for issue 4's graph-memory target; no target of its own",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"[graph-memory] wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

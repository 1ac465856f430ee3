#!/usr/bin/env python3
"""Hold GPU memory in this process so that the next process sees a smaller card's memory free.

    python benchmarks/ballast.py --card rtx-pro-6000 --ready-file F   # then start the server

Why a ballast and not an upstream knob: the KV pool sglang sizes is
`free after loading - free at start x (1 - mem_fraction_static)` (ModelRunner's memory pool:
"free at start" is torch.cuda.mem_get_info when the runner starts), so holding
`free now - card total` in another process makes the server start with what the card would
have free (each process's own CUDA context comes out of that on the real card too) and size the
pool, graphs and workspaces from it through upstream's own code. Upstream's only related knob,
--mem-fraction-static, scales the total it sees (the H200's), which also moves the fraction's
reserve and the memory tiers; a ballast changes nothing in the server.
The memory tiers that read the card's total (nvidia-smi: cuda-graph max bs, chunked prefill)
still see the H200: bench_twin passes the 96 GB card's resolved values explicitly.

Prints and writes (to --ready-file) {"ballast_bytes", "free_before", "free_after", "target_free"},
then sleeps until killed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def ballast_bytes(free_now: int, target_free: int) -> int:
    if target_free > free_now:
        raise ValueError(f"the card to emulate ({target_free / 2**30:.1f} GiB) has more memory than is free "
                         f"here ({free_now / 2**30:.1f} GiB)")
    return free_now - target_free


def main(argv=None) -> int:
    from sglang.sm120.plan.cards import CARDS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--card", default="rtx-pro-6000", choices=sorted(CARDS))
    ap.add_argument("--ready-file", required=True)
    a = ap.parse_args(argv)
    import torch

    free, _total = torch.cuda.mem_get_info(0)
    target = CARDS[a.card].memory_bytes
    n = ballast_bytes(free, target)
    held = torch.empty(n, dtype=torch.uint8, device="cuda:0")  # one cudaMalloc (caching allocator, large block)
    torch.cuda.synchronize()
    after, _ = torch.cuda.mem_get_info(0)
    doc = {"card": a.card, "ballast_bytes": n, "free_before": free, "free_after": after, "target_free": target,
           "pid": os.getpid()}
    tmp = a.ready_file + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, a.ready_file)
    print(json.dumps(doc), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while held is not None:
        time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

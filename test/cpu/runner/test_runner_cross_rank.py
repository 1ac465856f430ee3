"""Cross-rank decisions of the layerwise runner on a real 2-rank gloo group (two CPU processes).

Under tensor parallelism every rank must capture each size the same way: the same graph kind (a
full graph and a layerwise one place the collectives differently) and the same dropped sizes, or
the ranks' collectives stop pairing. The runner agrees through `_LayerwiseCommon._agree` (a MAX
all-reduce over the TP group's CPU group), called the same number of times on every rank. Here
each rank fails differently (one runs out of memory, the other cannot capture a full graph, one
runs out of memory in the warm pass) and both must end with the same plan, without a hang.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend")

RANK_SCRIPT = textwrap.dedent('''
    import json, sys
    from types import SimpleNamespace

    import torch
    import torch.distributed as dist

    from sglang.sm120.runner.backend import _LayerwiseCommon
    from sglang.sm120.runner.layerwise import SizeCapturer

    rank, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    common = _LayerwiseCommon.__new__(_LayerwiseCommon)
    common.phase, common.size_timings, common._warm_oom = "decode", {}, None
    common._tp_group = SimpleNamespace(world_size=2, cpu_group=dist.group.WORLD, barrier=dist.barrier)
    common._device_module = SimpleNamespace(synchronize=lambda: None)

    def oom(what):
        raise torch.OutOfMemoryError(f"CUDA out of memory (rank {rank}, {what})")

    # warm pass: rank 1 runs out of memory at size 300 on its first forward, rank 0 does not
    for size in (512, 300, 64):
        common._warm(size, (lambda s=size: oom("warm") if rank == 1 and s == 300 else None), None)

    # capture: rank 1 runs out of memory on layerwise 512; rank 0 cannot capture a full graph of 64
    captured, released = [], []

    def full(size):
        if rank == 0 and size == 64:
            raise RuntimeError("operation not permitted when stream is capturing")
        captured.append(("full", size))

    def layerwise(size):
        if rank == 1 and size == 512:
            oom("capture")
        captured.append(("layerwise", size))

    c = SizeCapturer(planned=[1, 8, 64, 256, 512, 1024], full_max_bs=256, capture_full=full,
                     capture_layerwise=layerwise, release=released.append, agree=common._agree)
    results = [c.capture(s) for s in c.order()]
    json.dump({"warm_oom": common._warm_oom, "results": results, "summary": c.summary(),
               "captured": captured, "released": released}, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()
''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_failing_differently_end_with_the_same_plan(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(tmp_path / f"rank{r}.json")],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in (0, 1)]
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the ranks hung: their collectives did not pair")
        assert p.returncode == 0, out
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))

    # rank 1's warm-pass OOM at 300 is every rank's
    assert r0["warm_oom"] == r1["warm_oom"] == 300
    # the same plan on both ranks: 1024 captured, then dropped with 512 (rank 1's OOM), 256 full,
    # 64 and below layerwise (rank 0's full-graph failure)
    for r in (r0, r1):
        assert r["results"] == ["layerwise", None, "full", "layerwise", "layerwise", "layerwise"]
        assert r["summary"]["full"] == [256] and r["summary"]["layerwise"] == [1, 8, 64]
        assert r["summary"]["dropped"] == [512, 1024] and r["summary"]["moe_capturable"] is False
    # what each rank had captured and let go
    assert r0["released"] == [512, 1024]   # its own 512, and 1024 captured before the OOM
    assert r1["released"] == [1024, 64]    # 1024; its full graph of 64 (rank 0 could not)
    assert ["full", 64] in r1["captured"] and ["full", 64] not in r0["captured"]
    assert "stream is capturing" in r0["summary"]["fallback_reason"]
    assert r1["summary"]["fallback_reason"] == "full-graph capture failed on another rank"

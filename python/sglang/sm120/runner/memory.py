"""Device memory readings around a capture: what it took, split the way a capture can take it.

Live tensors (`allocated`), everything torch's caching allocator holds (`reserved`), the part of
that in the graph pool's segments (`pool`), and free device memory (`free`): what leaves free
memory beyond `reserved` is outside the allocator (the driver's instantiated graphs). The pool
blocks left allocated after a capture say which tensors a captured size keeps, and
`held_bytes` where a captured size's output (its logits) lives.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict

import torch


def memory_point(pool) -> Dict[str, int]:
    """Device memory now, after a device sync; `pool` and `pool_blocks` are of the given graph pool
    (none for None). Zeros without CUDA."""
    if not torch.cuda.is_available():
        return {"allocated": 0, "reserved": 0, "pool": 0, "free": 0, "pool_blocks": frozenset()}
    torch.cuda.synchronize()
    pool_bytes, live = 0, set()
    if pool is not None:
        want = tuple(pool)
        for seg in torch.cuda.memory._snapshot()["segments"]:
            if tuple(seg.get("segment_pool_id", ())) == want:
                pool_bytes += seg["total_size"]
                addr = seg["address"]
                for block in seg["blocks"]:
                    addr = block.get("address", addr)
                    if block["state"] == "active_allocated":
                        live.add((addr, block["size"]))
                    addr += block["size"]
    return {"allocated": torch.cuda.memory_allocated(), "reserved": torch.cuda.memory_reserved(),
            "pool": pool_bytes, "free": torch.cuda.mem_get_info()[0], "pool_blocks": frozenset(live)}


def memory_delta(before: Dict[str, Any], after: Dict[str, Any], largest: int = 6) -> Dict[str, Any]:
    """What one capture took: the growth of each part, `outside` the allocator, and the pool
    blocks it left allocated (count and the largest sizes: which tensors a size keeps)."""
    d: Dict[str, Any] = {k: after[k] - before[k] for k in ("allocated", "reserved", "pool")}
    d["outside"] = (before["free"] - after["free"]) - d["reserved"]
    kept = sorted((size for _, size in after["pool_blocks"] - before["pool_blocks"]), reverse=True)
    d["kept_blocks"] = len(kept)
    d["kept_largest"] = kept[:largest]
    return d


def held_bytes(obj) -> int:
    """Bytes of the distinct allocations the tensors inside `obj` hold (tensors in dataclasses,
    tuples, lists and dicts; a view counts its whole allocation, each allocation once). For a
    captured decode size under upstream 0.5.16 that is its one preallocated fp32 logits buffer,
    shared by every size and outside the graph pool."""
    seen: Dict[int, int] = {}

    def walk(x) -> None:
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        elif dataclasses.is_dataclass(x) and not isinstance(x, type):
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, (tuple, list)):
            for e in x:
                walk(e)
        elif isinstance(x, dict):
            for e in x.values():
                walk(e)

    walk(obj)
    return sum(seen.values())

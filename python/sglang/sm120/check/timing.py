"""Timing stage: our sm120 backend beside every upstream FP4 backend this GPU runs, and bf16.

Every backend is timed as a whole linear layer (what a server pays per call: upstream's apply with
its activation quantization; ours through sglang.sm120.fp4_layer; bf16 as torch's linear) on the
same weight, by gemm_timing.time_ops (CUDA-graph replays over rotating weight copies larger than
L2). `x <backend>` = that backend's time / ours (> 1: ours is faster); `% copy BW` = bytes a call
must move (FP4 weights + scales, bf16 activations and output; bf16 weights for bf16) per second,
over the device-to-device copy bandwidth measured in the same run on the same GPU.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Sequence, Tuple

import torch

from . import gemm_timing as T
from . import upstream_fp4 as U

DECODE_MS = (1, 2, 4, 8, 16)
PREFILL_MS = (256, 1024, 4096)
QUICK_DECODE_MS = (1, 4, 16)
QUICK_PREFILL_MS = (1024,)
OURS, BF16 = "sm120", "bf16"


def _geomean(v: Sequence[float]):
    v = [x for x in v if x]
    return round(math.exp(sum(map(math.log, v)) / len(v)), 3) if v else None


def _ours_layers(q: dict, input_scale: torch.Tensor, copies: int) -> list:
    from sglang.sm120 import fp4_layer
    from sglang.sm120.fp4_selfcheck import _synthetic_layer

    layer = _synthetic_layer(q, input_scale)
    fp4_layer.repack(layer)
    return [layer] + [U.clone_layer(layer) for _ in range(copies - 1)]


def _ref(kind: str, x: torch.Tensor, input_scale, wd: torch.Tensor) -> torch.Tensor:
    from sglang.sm120 import nvfp4 as F

    from sglang.sm120.fp4_tolerance import exact_dequant

    if kind == "w4a16":
        return x.float() @ wd.t()
    return exact_dequant(*F.quantize_nvfp4(x, 1.0 / input_scale), input_scale) @ wd.t()


def time_shape(name: str, n: int, k: int, ms: Sequence[int], l2: int, copy_bw: float, reps: int,
               status: Dict[str, Dict], log: Callable[[str], None]) -> List[Dict]:
    """One row per M: microseconds per call of ours, bf16 and each upstream backend that works."""
    from sglang.sm120 import fp4_layer
    from sglang.sm120 import nvfp4 as F

    from sglang.sm120.fp4_tolerance import exact_dequant

    w, q = T.shape_weight(n, k)
    wb = w.to(torch.bfloat16)
    del w
    fp4_copies = T.copies_for(0.5625 * n * k, l2)
    g = torch.Generator(device="cuda").manual_seed(k)
    x_all = torch.randn(max(ms), k, device="cuda", generator=g).to(torch.bfloat16)
    in_s = F.input_scale_from_amax(x_all.float().abs().max())
    wd = exact_dequant(q["weight"], q["weight_scale"], q["weight_scale_2"])
    x_chk = x_all[:64]
    ops: Dict[str, Tuple[list, Callable]] = {
        OURS: (_ours_layers(q, in_s, fp4_copies), fp4_layer.apply),
        BF16: ([wb] + [wb.clone() for _ in range(T.copies_for(2 * n * k, l2) - 1)], torch.nn.functional.linear),
    }
    for b in U.names():
        st = status[b]
        try:
            prep = U.prepare(b, q, n, k, in_s, fp4_copies)
            why = U.sanity(prep, x_chk, _ref(U.reference_kind(b), x_chk, in_s, wd))
        except Exception as exc:
            why = U.reason_of(exc)
        if why is None:
            ops[b] = (prep.layers, prep.op)
            st["shapes_ok"] += 1
        else:
            st["errors"].setdefault(why, []).append(name)
    del wd
    rows = []
    for m in ms:
        x = x_all[:m]
        r = {"shape": name, "N": n, "K": k, "M": m, "phase": "decode" if m <= DECODE_MS[-1] else "prefill",
             "us": {}, "bw_pct": {}, "x": {}, "failed": {}}
        for b, (layers, fn) in ops.items():
            try:
                t = T.time_ops([lambda L=L, fn=fn: fn(L, x) for L in layers], reps)
            except Exception as exc:
                r["failed"][b] = U.reason_of(exc)
                continue
            r["us"][b] = round(t, 3)
            nbytes = T.bf16_bytes(n, k, m) if b == BF16 else T.fp4_bytes(n, k, m)
            r["bw_pct"][b] = round(100.0 * nbytes / (t * 1e-6) / copy_bw, 1)
        ours = r["us"].get(OURS)
        for b, t in r["us"].items():
            if b != OURS and ours:
                r["x"][b] = round(t / ours, 3)
        ups = [t for b, t in r["us"].items() if b not in (OURS, BF16)]
        r["best_upstream"] = min((b for b in r["us"] if b not in (OURS, BF16)), key=r["us"].get) if ups else None
        log(f"  {name:28s} M={m:5d}  " + "  ".join(
            f"{b} {t:.2f} us" + (f" (x{r['x'][b]:.2f})" if b in r["x"] else "") for b, t in r["us"].items()))
        rows.append(r)
    del ops
    torch.cuda.empty_cache()
    return rows


def run(shapes: Sequence[Tuple[str, int, int]], ms: Sequence[int], reps: int, log: Callable[[str], None]) -> Dict:
    t0 = time.time()
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 64 << 20)
    copy_bw, by_way = T.copy_bandwidth(log)
    floor = T.launch_floor_us(reps)
    log(f"  launch floor {floor:.2f} us per call")
    status = {b: {"description": U.describe(b), "shapes_ok": 0, "errors": {}} for b in U.names()}
    rows: List[Dict] = []
    for name, n, k in shapes:
        rows += time_shape(name, n, k, ms, l2, copy_bw, reps, status, log)
    backends = {}
    for b, st in status.items():
        backends[b] = {"description": st["description"], "available": st["shapes_ok"] > 0,
                       "reason": None if st["shapes_ok"] else "; ".join(st["errors"]) or "not tried",
                       "failed_shapes": {why: shp for why, shp in st["errors"].items()} if st["shapes_ok"] else {}}
    major = torch.cuda.get_device_capability()[0]
    w4a4 = ("hardware FP4 MMA" if major == 12 else
            "emulated (no FP4 MMA on this GPU: sm120 rows above the W4A16 limit measure the emulation, not SM120 speed)")
    return {"w4a4": w4a4, "copy_bw_tbps": round(copy_bw / 1e12, 3), "copy_bw_tbps_by_method": by_way,
            "launch_floor_us": round(floor, 3), "reps": reps, "rows": rows, "backends": backends,
            "summary": summarize(rows), "seconds": round(time.time() - t0, 1)}


def summarize(rows: Sequence[Dict]) -> Dict:
    """Geomeans of `x` (other / ours) per backend and phase, and against the best upstream backend."""
    out: Dict[str, Dict] = {}
    for phase in ("decode", "prefill"):
        sel = [r for r in rows if r["phase"] == phase]
        per = {}
        names = sorted({b for r in sel for b in r["x"]})
        for b in names:
            per[b] = _geomean([r["x"][b] for r in sel if b in r["x"]])
        best = [r["us"][r["best_upstream"]] / r["us"][OURS] for r in sel
                if r.get("best_upstream") and r["us"].get(OURS)]
        per["best_upstream"] = _geomean(best)
        per["best_upstream_min"] = round(min(best), 3) if best else None
        ours_bw = sorted(r["bw_pct"][OURS] for r in sel if OURS in r["bw_pct"])
        per["ours_bw_pct_median"] = ours_bw[len(ours_bw) // 2] if ours_bw else None
        out[phase] = per
    return out

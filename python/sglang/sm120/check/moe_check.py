"""MoE stage: the grouped NVFP4 W4A16 MoE (kernels.moe_w4a16) against moe_reference on the MoE shape
sets of sglang.sm120.model_shapes.MOE_SHAPES, then timed beside upstream's NVFP4 MoE backend for
this GPU and bf16 (sglang.sm120.check.moe_timing).

Correctness (decides the stage, and so the exit code): per shape set and token count, top-8
synthetic routing (expert parallelism's ids over the global experts for glm5-ep8), within
sglang.sm120.moe_tolerance; plus one routing that leaves most experts without rows.

Timing (informative): upstream's NVFP4 MoE backend under --moe-runner-backend auto for ModelOpt
checkpoints (0.5.16's arg_groups/overrides.py) is Marlin on SM80-SM90, FlashInfer's TRT-LLM MoE on
SM100 and FlashInfer's CUTLASS MoE otherwise (SM120 included). The check times Marlin, upstream's W4A16 NVFP4 MoE, wherever it runs; FlashInfer's
CUTLASS MoE needs upstream's whole FusedMoE layer (dispatcher, input scales) and is not timed yet:
the report says so, and which backend upstream would pick.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple

TOKENS = (1, 2, 3, 8, 17, 64, 255, 256, 1024)
QUICK_TOKENS = (1, 17, 256)
TIMING_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
QUICK_TIMING_TOKENS = (1, 16, 128)
OURS = "sm120"
NOT_TIMED = {b: f"FlashInfer's {what} MoE is set up by upstream's FusedMoE layer (dispatcher, activation "
                "scales), which this check does not build yet"
             for b, what in (("flashinfer_cutlass", "CUTLASS"), ("flashinfer_trtllm", "TRT-LLM"))}


def shape_sets(family: str) -> list:
    """The MoE shape sets of the --shapes family (glm5, qwen3 or all)."""
    from sglang.sm120.model_shapes import MOE_SHAPES

    return [s for s in MOE_SHAPES if family == "all" or s.name.startswith(family)]


def upstream_choice(capability: Tuple[int, int]) -> Optional[str]:
    """upstream's NVFP4 MoE backend under --moe-runner-backend auto on this GPU (None: none runs)."""
    cap = tuple(capability)
    if (8, 0) <= cap < (10, 0):
        return "marlin"
    if (10, 0) <= cap < (11, 0):
        return "flashinfer_trtllm"
    return "flashinfer_cutlass" if cap >= (11, 0) else None


def timed_backends(quick: bool) -> Tuple[str, ...]:
    """Upstream backends this check times: Marlin always, bf16 Triton in the full run (its first
    calls compile Triton kernels, too slow for --quick)."""
    return ("marlin",) if quick else ("marlin", "bf16")


def _geomean(v: Sequence[float]):
    v = [x for x in v if x]
    return round(math.exp(sum(map(math.log, v)) / len(v)), 3) if v else None


def correctness(shape, tokens: Sequence[int], log: Callable[[str], None], fault: bool = False) -> List[Dict]:
    """fault: corrupt the first result compared (SGLANG_SM120_FAULT_INJECT=moe shows a failing stage)."""
    import torch

    from sglang.sm120 import kernels as K
    from sglang.sm120.kernels import moe
    from sglang.sm120.moe_tolerance import check_moe
    from sglang.sm120.selfcheck import corrupt_one

    dev = torch.device("cuda")
    tensors = moe.synthetic_experts(shape.experts, shape.hidden, shape.inter, dev, seed=0)
    packed = K.pack_experts(**tensors)
    cases = [(f"T={t}", t, None) for t in tokens] + [(f"T={max(tokens)} on {shape.topk} experts", max(tokens), shape.topk)]
    out = []
    for label, t, active in cases:
        over = shape.experts if active else shape.routed_over
        ids, w = moe.synthetic_routing(t, shape.topk, over, dev, seed=t, active=active)
        g = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn(t, shape.hidden, device=dev, generator=g).to(torch.bfloat16)
        name = f"moe {shape.name} {label}"
        try:
            y = K.moe_w4a16(x, ids, w, packed, routed_scaling_factor=shape.routed_scaling)
            if fault and not out:
                y = corrupt_one(y)
            c = check_moe(y, x, ids, w, tensors, routed_scaling_factor=shape.routed_scaling)
            out.append({"name": name, "ok": c.ok, "detail": c.summary()})
        except Exception as exc:
            out.append({"name": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}".splitlines()[0]})
        if not out[-1]["ok"]:
            log(f"  FAILED {name}: {out[-1]['detail']}")
    del tensors, packed
    torch.cuda.empty_cache()
    return out


def cell(row: Dict, copy_bw: float) -> Dict:
    """time_row's cell with x (other / ours) per backend and ours' % of the copy bandwidth."""
    ours = row["us"].get(OURS)
    row["x"] = {b: round(t / ours, 3) for b, t in row["us"].items() if b != OURS and ours}
    row["bw_pct"] = {OURS: round(100.0 * row["weight_bytes"] / (ours * 1e-6) / copy_bw, 1)} if ours else {}
    return row


def summarize(rows: Sequence[Dict], upstream: Optional[str]) -> Dict:
    """Geomean and minimum of x per backend over every row, per shape set and over all."""
    out: Dict = {"upstream_choice": upstream, "per_shape": {}}
    names = sorted({b for r in rows for b in r["x"]})
    for b in names:
        v = [r["x"][b] for r in rows if b in r["x"]]
        out[f"x_{b}_geomean"] = _geomean(v)
        out[f"x_{b}_min"] = round(min(v), 3) if v else None
    for shape in dict.fromkeys(r["shape"] for r in rows):
        mine = [r for r in rows if r["shape"] == shape]
        out["per_shape"][shape] = {f"x_{b}_geomean": _geomean([r["x"][b] for r in mine if b in r["x"]]) for b in names}
    return out


def run(family: str, quick: bool, reps: int, log: Callable[[str], None]) -> Dict:
    import torch

    from . import gemm_timing as T
    from . import moe_timing as MT

    from sglang.sm120.selfcheck import fault_site

    sets = shape_sets(family)
    fault = fault_site() == "moe"
    results: List[Dict] = []
    for i, s in enumerate(sets):
        res = correctness(s, QUICK_TOKENS if quick else TOKENS, log, fault=fault and i == 0)
        log(f"  {s.name}: {sum(r['ok'] for r in res)}/{len(res)} MoE checks passed")
        results += res
    dev = torch.device("cuda")
    cap = torch.cuda.get_device_capability()
    upstream = upstream_choice(cap)
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    l2 = getattr(props, "L2_cache_size", 64 << 20)
    copy_bw, _ = T.copy_bandwidth(log)
    backends = timed_backends(quick)
    status: Dict[str, Dict] = {b: {"shapes_ok": 0, "errors": {}} for b in backends}
    rows: List[Dict] = []
    order = tuple(backends) + (OURS,)
    for s in sets:
        packed, ops, errors = MT.setup(s, backends, dev)
        for b in backends:
            if b in ops:
                status[b]["shapes_ok"] += 1
            else:
                status[b]["errors"].setdefault(errors.get(b, "not available"), []).append(s.name)
        for t in (QUICK_TIMING_TOKENS if quick else TIMING_TOKENS):
            r = cell(MT.time_row(s, t, ops, order, packed.expert_weight_bytes(), l2, reps, dev), copy_bw)
            rows.append(r)
            log(f"  {s.name:10s} T={t:5d}  " + "  ".join(
                f"{b} {u:.2f} us" + (f" (x{r['x'][b]:.2f})" if b in r["x"] else "") for b, u in r["us"].items()))
        del packed, ops
        torch.cuda.empty_cache()
    info = {b: {"available": st["shapes_ok"] > 0, "reason": None if st["shapes_ok"] else "; ".join(st["errors"]),
                "failed_shapes": st["errors"] if st["shapes_ok"] else {}} for b, st in status.items()}
    if upstream and upstream not in info:
        info[upstream] = {"available": False, "reason": NOT_TIMED.get(upstream, "not timed by this check"),
                          "failed_shapes": {}}
    bad = [r for r in results if not r["ok"]]
    summ = summarize(rows, upstream)
    return {"status": "fail" if bad else "pass", "results": results, "rows": rows, "backends": info,
            "upstream_choice": upstream, "copy_bw_tbps": round(copy_bw / 1e12, 3), "reps": reps,
            "summary": summ, "shape_sets": [s.name for s in sets],
            "detail": (f"{len(results) - len(bad)}/{len(results)} MoE checks passed"
                       + (f"; first failure: {bad[0]['name']}: {bad[0]['detail']}" if bad else "")
                       + (f"; x{summ.get('x_marlin_geomean')} vs upstream Marlin MoE (geomean)"
                          if summ.get("x_marlin_geomean") else ""))}

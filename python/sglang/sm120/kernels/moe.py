"""Grouped NVFP4 W4A16 MoE: the experts of one layer in the kernel layout, and one call that runs
routing alignment, gate_up with SiLU-and-multiply, down with the routing weights and the fixed-order
top-k sum (csrc/moe_w4a16.cu).

    packed = pack_experts(w13_weight, w13_weight_scale, w13_weight_scale_2,
                          w2_weight, w2_weight_scale, w2_weight_scale_2)      # once, at load
    out = moe_w4a16(hidden_states, topk_ids, topk_weights, packed)          # every step

Layout: each expert's gate_up weight [2I, H] is repacked with layout.pack_weight after its rows
are interleaved per 64 output columns -- rows [0, 32) of every 128-row group are gate rows
64 G + [0, 32), rows [32, 64) the matching up rows, rows [64, 96) gate rows 64 G + [32, 64), rows
[96, 128) their up rows -- so the MMA rows g and g + 8 a lane holds are the gate and the up row of
one output column (SiLU(gate) * up is formed from the accumulators; I is padded to 64 with zero
rows). The down weight [H, I] is packed as is, H padded to 128. The experts lie back to back, so
expert e's tiles and scales start at e times one expert's bytes.
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Optional

import torch

from sglang.sm120 import nvfp4
from . import _lib
from .layout import CHUNK_K, GROUP_ROWS, pack_weight

MAX_EXPERTS = 1024  # kMoeMaxExperts (csrc/kernels.h)
_PACK_BUDGET_VALUES = 1 << 28  # e2m1 values packed per batch of experts (bounds the load-time temporaries)


@dataclass
class PackedExperts:
    w13: torch.Tensor          # uint8 [E, 2 I_pad * H_pad / 2]
    w13_scales: torch.Tensor   # float8_e4m3fn [E, 2 I_pad, H_pad / 16], 128x4 swizzled per expert
    w13_alpha: torch.Tensor    # float32 [E, 2]: decode global scales of the gate rows and the up rows
    w2: torch.Tensor           # uint8 [E, H_pad128 * I_pad / 2]
    w2_scales: torch.Tensor    # float8_e4m3fn [E, H_pad128, I_pad / 16]
    w2_alpha: torch.Tensor     # float32 [E]
    num_experts: int
    hidden: int                # H
    intermediate: int          # I

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.w13, self.w13_scales, self.w13_alpha,
                                                            self.w2, self.w2_scales, self.w2_alpha))

    def expert_weight_bytes(self) -> int:
        """Bytes one expert's kernel reads (packed weights and scales of gate_up and down)."""
        per = lambda t: t[0].numel() * t.element_size()  # noqa: E731
        return per(self.w13) + per(self.w13_scales) + per(self.w2) + per(self.w2_scales)


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def moe_w4a16_supported(num_experts: int, hidden: int, intermediate: int) -> Optional[str]:
    """None where the kernel serves these shapes, else why not (for a backend's one log line)."""
    if not 0 < num_experts <= MAX_EXPERTS:
        return f"{num_experts} local experts (the kernel serves 1 to {MAX_EXPERTS})"
    if hidden <= 0 or hidden % 16:
        return f"hidden size {hidden} is not a positive multiple of 16"
    if intermediate <= 0 or intermediate % 16:
        return f"expert intermediate size {intermediate} is not a positive multiple of 16"
    return None


def interleave_gate_up(w13: torch.Tensor, intermediate: int) -> torch.Tensor:
    """[E, 2I, C] (gate rows, then up rows) -> [E, 2 I_pad, C] in the kernel's row order (module
    docstring), zero rows where I_pad > I. Any trailing dims/dtype (weights or block scales)."""
    e, rows = w13.shape[:2]
    if rows != 2 * intermediate:
        raise ValueError(f"gate_up has {rows} rows, expected 2 x {intermediate}")
    i_pad = _round_up(intermediate, 64)
    halves = w13.new_zeros((e, 2, i_pad) + tuple(w13.shape[2:]))
    halves[:, 0, :intermediate] = w13[:, :intermediate]
    halves[:, 1, :intermediate] = w13[:, intermediate:]
    # [E, 2 (gate/up), G, 2 (column half), 32, ...] -> [E, G, 2 (column half), 2 (gate/up), 32, ...]
    g = i_pad // 64
    blocks = halves.view((e, 2, g, 2, 32) + tuple(w13.shape[2:])).transpose(1, 2).transpose(2, 3)
    return blocks.reshape((e, 2 * i_pad) + tuple(w13.shape[2:]))


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[1] == rows:
        return t
    out = t.new_zeros((t.shape[0], rows) + tuple(t.shape[2:]))
    out[:, : t.shape[1]] = t
    return out


def _pack_stack(weight: torch.Tensor, scale: torch.Tensor, what: str):
    """[E, N, K/2] / [E, N, K/16] with N % 128 == 0 -> (qweight [E, N K / 2], scales [E, N, K_pad/16]),
    packed in batches of experts (one layout.pack_weight call each: 128-row groups never straddle
    two experts, so the experts' tiles and scales lie back to back)."""
    e, n, half_k = weight.shape
    k_pad = _round_up(2 * half_k, CHUNK_K)
    per_batch = max(1, _PACK_BUDGET_VALUES // (n * k_pad))
    qs, ss = [], []
    for e0 in range(0, e, per_batch):
        e1 = min(e, e0 + per_batch)
        try:
            pw = pack_weight(weight[e0:e1].reshape((e1 - e0) * n, half_k),
                             scale[e0:e1].reshape((e1 - e0) * n, -1), 1.0)
        except ValueError as exc:
            raise ValueError(f"{what} of experts {e0}..{e1 - 1}: {exc}") from exc
        qs.append(pw.qweight.view(e1 - e0, -1))
        ss.append(pw.scales.view(e1 - e0, n, k_pad // 16))
    return torch.cat(qs), torch.cat(ss)


def _decode_scales(ws2: torch.Tensor, shape, what: str) -> torch.Tensor:
    ws2 = torch.as_tensor(ws2).detach().to(torch.float32)
    try:
        ws2 = ws2.reshape(shape) if ws2.numel() == _numel(shape) else ws2.reshape(shape[0], 1).expand(shape).contiguous()
    except RuntimeError as exc:
        raise ValueError(f"{what} must have {shape[0]} values (one per expert) or shape {tuple(shape)}, "
                         f"got {tuple(ws2.shape)}") from exc
    if not bool(torch.isfinite(ws2).all()) or bool((ws2 <= 0).any()):
        raise ValueError(f"{what}: decode global scales must be finite and > 0")
    return ws2.contiguous()


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _check_expert_tensors(w13_weight, w13_weight_scale, w2_weight, w2_weight_scale):
    for name, t, dt in (("w13_weight", w13_weight, (torch.uint8,)), ("w2_weight", w2_weight, (torch.uint8,)),
                        ("w13_weight_scale", w13_weight_scale, (torch.float8_e4m3fn, torch.uint8)),
                        ("w2_weight_scale", w2_weight_scale, (torch.float8_e4m3fn, torch.uint8))):
        if not isinstance(t, torch.Tensor) or t.dtype not in dt or t.dim() != 3:
            raise TypeError(f"{name} must be a 3-D {' or '.join(map(str, dt))} tensor [E, rows, cols]")
    e, two_i, half_h = w13_weight.shape
    h, i = 2 * half_h, two_i // 2
    want = {"w13_weight_scale": (e, two_i, h // 16), "w2_weight": (e, h, i // 2), "w2_weight_scale": (e, h, i // 16)}
    for name, t in (("w13_weight_scale", w13_weight_scale), ("w2_weight", w2_weight),
                    ("w2_weight_scale", w2_weight_scale)):
        if tuple(t.shape) != want[name]:
            raise ValueError(f"{name} must have shape {want[name]} for w13_weight {tuple(w13_weight.shape)}, "
                             f"got {tuple(t.shape)}")
    if two_i % 2:
        raise ValueError(f"w13_weight has {two_i} rows; gate and up need an even count")
    why = moe_w4a16_supported(e, h, i)
    if why:
        raise ValueError(f"grouped W4A16 MoE: {why}")
    return e, h, i


def pack_experts(w13_weight: torch.Tensor, w13_weight_scale: torch.Tensor, w13_weight_scale_2,
                 w2_weight: torch.Tensor, w2_weight_scale: torch.Tensor, w2_weight_scale_2) -> PackedExperts:
    """ModelOpt NVFP4 experts as upstream loads them (before its own repack or swizzle):
    w13_weight uint8 [E, 2I, H/2] (gate rows, then up rows), w13_weight_scale e4m3 [E, 2I, H/16]
    row-major, w13_weight_scale_2 float32 [E, 2] or [E] (DECODE scales of gate / up),
    w2_weight uint8 [E, H, I/2], w2_weight_scale e4m3 [E, H, I/16], w2_weight_scale_2 float32 [E].
    Runs on the weights' device."""
    e, h, i = _check_expert_tensors(w13_weight, w13_weight_scale, w2_weight, w2_weight_scale)
    dev = w13_weight.device
    w13_alpha = _decode_scales(w13_weight_scale_2, (e, 2), "w13_weight_scale_2").to(dev)
    w2_alpha = _decode_scales(w2_weight_scale_2, (e,), "w2_weight_scale_2").to(dev)
    w13_q, w13_s = _pack_stack(interleave_gate_up(w13_weight, i),
                               interleave_gate_up(w13_weight_scale.view(torch.uint8), i), "w13")
    h_pad = _round_up(h, GROUP_ROWS)
    w2_q, w2_s = _pack_stack(_pad_rows(w2_weight, h_pad), _pad_rows(w2_weight_scale.view(torch.uint8), h_pad), "w2")
    return PackedExperts(w13=w13_q, w13_scales=w13_s, w13_alpha=w13_alpha, w2=w2_q, w2_scales=w2_s,
                         w2_alpha=w2_alpha, num_experts=e, hidden=h, intermediate=i)


def moe_plan(tokens: int, topk: int, num_experts: int, hidden: int, intermediate: int, *,
             gate_up_k_warps: int = 0, down_k_warps: int = 0, m_tiles: int = 0) -> dict:
    """The kernel's plan of a call (host only): M tile, rows per work item, work items, warps per
    tile (gate_up_k_warps / down_k_warps: 0 = the plan's choice, else 1, 2, 4 or 8; m_tiles: 0 =
    the plan's, else 1, 2 or 4 8-token MMA tiles per work item; the overrides are for sweeps)."""
    plan = _plan(tokens, topk, num_experts, hidden, intermediate, _override(gate_up_k_warps, "gate_up_k_warps"),
                 _override(down_k_warps, "down_k_warps"), _override(m_tiles, "m_tiles", (1, 2, 4)))
    return dict(zip(("m_tiles", "rows_per_item", "max_items", "gate_up_k_warps", "down_k_warps"), plan))


@functools.lru_cache(maxsize=256)
def _plan(*args) -> tuple:
    # A pure function of its arguments, asked by every layer of every eager MoE step: one library
    # call per shape and batch size, not per call.
    out = (ctypes.c_int * 5)()
    _lib.check(_lib.load().sm120_moe_w4a16_plan(*args, out), "moe_w4a16_plan")
    return tuple(out)


def _override(value, name: str, allowed=(1, 2, 4, 8)) -> int:
    if value not in (0,) + allowed or isinstance(value, bool):
        raise ValueError(f"{name} must be 0 (the plan's choice), {', '.join(map(str, allowed[:-1]))} or {allowed[-1]}, "
                         f"got {value!r}")
    return int(value)


def _check_routing(hidden_states, topk_ids, topk_weights, experts: PackedExperts):
    from .ops import _aligned, _tensor

    _tensor("hidden_states", hidden_states, torch.bfloat16, dim=2)
    dev = hidden_states.device
    t, h = hidden_states.shape
    if h != experts.hidden:
        raise ValueError(f"hidden_states: H (= {h}) does not match the experts' hidden size (= {experts.hidden})")
    if t == 0:
        raise ValueError("hidden_states: no tokens")
    _aligned("hidden_states", hidden_states)
    _tensor("topk_ids", topk_ids, (torch.int32, torch.int64), dim=2, device=dev)
    _tensor("topk_weights", topk_weights, torch.float32, dim=2, device=dev)
    if topk_ids.shape[0] != t or tuple(topk_weights.shape) != tuple(topk_ids.shape):
        raise ValueError(f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} "
                         f"must both be [{t}, topk]")
    for name in ("w13", "w13_scales", "w13_alpha", "w2", "w2_scales", "w2_alpha"):
        _tensor(f"experts.{name}", getattr(experts, name), device=dev)
    return dev, t, topk_ids.shape[1]


def _indexed(device: torch.device) -> torch.device:
    """'cuda' as the device index it allocates on: the inputs' devices always carry one, and the
    runner passes its device as the bare 'cuda' (the lean steps' scratch was refused for that)."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


class MoeScratch:
    """Reusable scratch of moe_w4a16 calls (sorted rows, work list and count, activations, per-slot
    outputs): flat buffers per role on one device, grown to the largest call seen; each call takes
    views of their leading elements. One scratch serves calls that run one after another on one
    stream (the layers of a model); calls that may overlap need one each."""

    def __init__(self, device) -> None:
        self.device = _indexed(torch.device(device))
        self._flat = {}

    def take(self, role: str, shape, dtype: torch.dtype) -> torch.Tensor:
        numel = _numel(shape)
        flat = self._flat.get(role)
        if flat is None or flat.numel() < numel or flat.dtype != dtype:
            flat = self._flat[role] = torch.empty(max(numel, 1), dtype=dtype, device=self.device)
        return flat[:numel].view(shape)

    def scrub(self) -> None:
        """NaN into the float buffers (probes: a result that reads what no launch wrote shows)."""
        for flat in self._flat.values():
            if flat.is_floating_point():
                flat.fill_(float("nan"))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._flat.values())


def moe_w4a16(hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
              experts: PackedExperts, *, routed_scaling_factor: float = 1.0,
              out: Optional[torch.Tensor] = None, scratch: Optional[MoeScratch] = None,
              gate_up_k_warps: int = 0, down_k_warps: int = 0, m_tiles: int = 0,
              pdl: Optional[bool] = None) -> torch.Tensor:
    """bf16 [T, H] = routed_scaling_factor * sum_k topk_weights[t, k] * down_e(SiLU(gate_e(x)) * up_e(x)),
    e = topk_ids[t, k]; ids outside [0, E) (EP: other ranks' experts) contribute nothing. The k-sum
    runs in order k = 0..topk-1: identical inputs give identical outputs. No host sync; the
    scratch (sorted rows, work list, activations [T topk, I], per-slot outputs [T topk, H]) comes
    from `scratch` when given (a MoeScratch on the inputs' device), else from torch's caching
    allocator; either way the call is CUDA-graph capturable and every scratch element it reads it
    wrote first, so both give the same bits. gate_up_k_warps / down_k_warps: warps per 16-row
    weight tile, m_tiles: 8-token MMA tiles per work item (moe_plan; 0 = the plan's choice). pdl:
    programmatic dependent launch between the call's kernels (None: $SGLANG_SM120_PDL, default on;
    same bits either way)."""
    from .ops import PDL_DEFAULT, _out, _ptr, _stream

    dev, t, topk = _check_routing(hidden_states, topk_ids, topk_weights, experts)
    e, h, i = experts.num_experts, experts.hidden, experts.intermediate
    y = _out("out", out, (t, h), torch.bfloat16, dev)
    # int64 ids: clamped first, so no id wraps into [0, E) on the way to int32
    ids = topk_ids if topk_ids.dtype == torch.int32 else topk_ids.clamp(-1, e).to(torch.int32)
    plan = moe_plan(t, topk, e, h, i, gate_up_k_warps=gate_up_k_warps, down_k_warps=down_k_warps, m_tiles=m_tiles)
    s = t * topk
    if scratch is not None and scratch.device != dev:
        raise ValueError(f"scratch is on {scratch.device}, the inputs on {dev}")
    take = scratch.take if scratch is not None else (lambda _role, shape, dtype: torch.empty(shape, dtype=dtype, device=dev))
    sorted_slots = take("sorted_slots", (s,), torch.int32)
    work = take("work", (plan["max_items"], 4), torch.int32)
    work_count = take("work_count", (1,), torch.int32)
    act = take("act", (s, i), torch.bfloat16)
    per_slot = take("per_slot", (s, h), torch.bfloat16)
    rc = _lib.load().sm120_moe_w4a16(
        dev.index, _ptr(hidden_states), _ptr(ids), _ptr(topk_weights), _ptr(experts.w13), _ptr(experts.w13_scales),
        _ptr(experts.w13_alpha), _ptr(experts.w2), _ptr(experts.w2_scales), _ptr(experts.w2_alpha),
        _ptr(sorted_slots), _ptr(work), _ptr(work_count), _ptr(act), _ptr(per_slot), _ptr(y),
        t, topk, e, h, i, ctypes.c_float(float(routed_scaling_factor)), plan["gate_up_k_warps"],
        plan["down_k_warps"], plan["m_tiles"], int(PDL_DEFAULT if pdl is None else bool(pdl)), _stream(dev))
    _lib.check(rc, "moe_w4a16")
    return y


def synthetic_experts(num_experts: int, hidden: int, intermediate: int, device, seed: int = 0,
                      std: float = 0.02) -> dict:
    """Random experts quantized as a ModelOpt NVFP4 checkpoint stores them (pack_experts' and
    moe_reference's arguments, by name): gate and up of an expert keep separate decode global
    scales, as upstream loads them. For the self-check, tests and benchmarks."""
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    e, h, i = num_experts, hidden, intermediate
    out = {"w13_weight": torch.empty((e, 2 * i, h // 2), dtype=torch.uint8, device=device),
           "w13_weight_scale": torch.empty((e, 2 * i, h // 16), dtype=torch.float8_e4m3fn, device=device),
           "w13_weight_scale_2": torch.empty((e, 2), dtype=torch.float32, device=device),
           "w2_weight": torch.empty((e, h, i // 2), dtype=torch.uint8, device=device),
           "w2_weight_scale": torch.empty((e, h, i // 16), dtype=torch.float8_e4m3fn, device=device),
           "w2_weight_scale_2": torch.empty((e,), dtype=torch.float32, device=device)}
    for ex in range(e):
        for half in (0, 1):
            q = nvfp4.quantize_weight_modelopt(torch.randn(i, h, device=device, generator=g) * std)
            rows = slice(half * i, (half + 1) * i)
            out["w13_weight"][ex, rows], out["w13_weight_scale"][ex, rows] = q["weight"], q["weight_scale"]
            out["w13_weight_scale_2"][ex, half] = q["weight_scale_2"]
        q = nvfp4.quantize_weight_modelopt(torch.randn(h, i, device=device, generator=g) * std)
        out["w2_weight"][ex], out["w2_weight_scale"][ex] = q["weight"], q["weight_scale"]
        out["w2_weight_scale_2"][ex] = q["weight_scale_2"]
    return out


def synthetic_routing(tokens: int, topk: int, num_experts: int, device, seed: int = 0,
                      active: Optional[int] = None):
    """(topk_ids int32 [T, topk], topk_weights fp32 [T, topk]): topk distinct experts per token
    drawn from the first `active` experts (default all; fewer leaves experts with zero rows),
    softmax weights over the chosen scores."""
    active = num_experts if active is None else active
    if not topk <= active <= num_experts:
        raise ValueError(f"active experts must lie in [topk, num_experts] = [{topk}, {num_experts}], got {active}")
    device = torch.device(device)
    g = torch.Generator(device=device).manual_seed(seed)
    scores = torch.rand((tokens, active), device=device, generator=g)
    top, ids = scores.topk(topk, dim=1)
    return ids.to(torch.int32), torch.softmax(top * 4, dim=1).to(torch.float32)


def moe_reference(hidden_states, topk_ids, topk_weights, w13_weight, w13_weight_scale, w13_weight_scale_2,
                  w2_weight, w2_weight_scale, w2_weight_scale_2, *, routed_scaling_factor: float = 1.0):
    """Pure torch (CPU or CUDA) from the ModelOpt tensors: per expert, fp32 products of the
    dequantized weights, bf16 where the kernel rounds (SiLU(gate) * up; down times the routing
    weight; the k-sum in order k = 0..topk-1 times routed_scaling_factor)."""
    e, h, i = _check_expert_tensors(w13_weight, w13_weight_scale, w2_weight, w2_weight_scale)
    a13 = _decode_scales(w13_weight_scale_2, (e, 2), "w13_weight_scale_2")
    a2 = _decode_scales(w2_weight_scale_2, (e,), "w2_weight_scale_2")
    x = hidden_states.to(torch.float32)
    t, topk = topk_ids.shape
    ids = topk_ids.to(torch.int64)
    per_slot = torch.zeros((t, topk, h), dtype=torch.float32, device=x.device)
    for ex in torch.unique(ids).tolist():
        if not 0 <= ex < e:
            continue
        tok, k = (ids == ex).nonzero(as_tuple=True)
        gate = x[tok] @ nvfp4.dequantize_weight_modelopt(w13_weight[ex, :i], w13_weight_scale[ex, :i], 1.0).t()
        up = x[tok] @ nvfp4.dequantize_weight_modelopt(w13_weight[ex, i:], w13_weight_scale[ex, i:], 1.0).t()
        gate, up = gate * a13[ex, 0].to(x.device), up * a13[ex, 1].to(x.device)
        act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16).to(torch.float32)
        down = act @ nvfp4.dequantize_weight_modelopt(w2_weight[ex], w2_weight_scale[ex], 1.0).t()
        down = down * a2[ex].to(x.device)
        per_slot[tok, k] = (down * topk_weights[tok, k].to(torch.float32)[:, None]).to(torch.bfloat16).to(torch.float32)
    total = torch.zeros((t, h), dtype=torch.float32, device=x.device)
    for k in range(topk):
        total += per_slot[:, k]
    return (total * routed_scaling_factor).to(torch.bfloat16)

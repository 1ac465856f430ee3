"""MoE timing harness shared by `python -m sglang.sm120 check`'s moe stage and
benchmarks/bench_moe_fp4.py: the grouped W4A16 MoE (ours), upstream's NVFP4 MoE backends as
upstream's ModelOpt NVFP4 MoE method sets them up, and upstream's bf16 Triton fused MoE, on one
shape set of sglang.sm120.model_shapes.MOE_SHAPES.

One op is one whole MoE layer call on T tokens, top-k. Each timed graph chains ops that use
different routings (seeds) over one set of experts, enough of them that the expert weights they
read together exceed 2.5x L2 (the set of every shape is several times L2), so calls read their
weights from memory, as consecutive layers of a model do. Weight bytes per call are the distinct
local experts the call's routing hits times one expert's bytes, averaged over the chain.

Expert parallelism (a shape whose routing spans more experts than it holds, glm5-ep8): routing is
drawn over the global experts and the rank is rank 0 (global ids [0, E) are local). Upstream's
standard dispatcher maps global ids to local ones (-1 for other ranks' experts) before its
backends run; every backend here gets the ids so mapped, and Marlin its expert map as well, as
upstream's method passes it.
"""
from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Callable, List, Optional, Sequence, Tuple

import torch

MAX_OPS = 64


def expert_map(shape, device) -> Optional[torch.Tensor]:
    """int32 [global experts]: local id of each global expert on rank 0, -1 for other ranks' (None
    without expert parallelism)."""
    if shape.routed_over == shape.experts:
        return None
    m = torch.full((shape.routed_over,), -1, dtype=torch.int32, device=device)
    m[: shape.experts] = torch.arange(shape.experts, dtype=torch.int32, device=device)
    return m


def routings(shape, tokens: int, count: int, device, seed: int = 0) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """`count` (local topk_ids int32 [T, topk], topk_weights fp32 [T, topk]) pairs, each its own
    seed: synthetic_routing over the global experts, ids mapped to local ones (-1: not local)."""
    from sglang.sm120.kernels.moe import synthetic_routing

    emap = expert_map(shape, device)
    out = []
    for i in range(count):
        ids, w = synthetic_routing(tokens, shape.topk, shape.routed_over, device, seed=seed + 7919 * i + tokens)
        if emap is not None:
            ids = emap[ids.long()].contiguous()
        out.append((ids, w))
    return out


def distinct_local(ids: torch.Tensor, num_experts: int) -> int:
    """How many distinct local experts (ids in [0, E)) a routing hits."""
    u = torch.unique(ids)
    return int(((u >= 0) & (u < num_experts)).sum())


def ops_needed(shape, tokens: int, expert_bytes: int, l2: int) -> int:
    """Ops per graph so that the weights the chain reads exceed 2.5x L2 (each op's expected bytes
    from the expected distinct experts of T x topk draws), at least 2 and at most MAX_OPS."""
    e, slots = shape.experts, tokens * shape.topk * shape.experts / shape.routed_over
    hit = e * (1.0 - (1.0 - 1.0 / e) ** slots) if slots else 0.0
    return int(min(MAX_OPS, max(2, math.ceil(2.5 * l2 / max(hit * expert_bytes, 1.0)))))


def shared_gate_up_scale(tensors: dict) -> dict:
    """The experts with the gate's decode global scale used for up as well: upstream's Marlin MoE
    keeps one w13 global scale per expert (it warns and takes the gate's), so every backend here
    computes the same function."""
    t = dict(tensors)
    ws2 = tensors["w13_weight_scale_2"].clone()
    ws2[:, 1] = ws2[:, 0]
    t["w13_weight_scale_2"] = ws2
    return t


# ----------------------------------------------------------------------------- ours

def ours_op(packed, shape) -> Callable:
    from sglang.sm120 import kernels as K

    return lambda x, ids, w: K.moe_w4a16(x, ids, w, packed, routed_scaling_factor=shape.routed_scaling)


# ----------------------------------------------------------------------------- upstream Marlin

def load_marlin_moe():
    """(prepare_moe_nvfp4_layer_for_marlin, the Marlin MoE runner's fused function, its quant-info and
    config classes), or raises ImportError / whatever upstream's import raises."""
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.marlin import MarlinMoeQuantInfo, fused_experts_none_to_marlin
    from sglang.srt.layers.quantization.marlin_utils_fp4 import prepare_moe_nvfp4_layer_for_marlin

    return SimpleNamespace(prepare=prepare_moe_nvfp4_layer_for_marlin, run=fused_experts_none_to_marlin,
                           QuantInfo=MarlinMoeQuantInfo, Config=MoeRunnerConfig)


def marlin_moe_op(api, tensors: dict, shape, device) -> Callable:
    """Upstream's NVFP4 Marlin MoE on these experts: the layer state ModelOptNvFp4FusedMoEMethod
    builds before process_weights_after_loading (w13's global scale collapsed to the gate's, as
    its Marlin branch does), prepare_moe_nvfp4_layer_for_marlin, then per call the Marlin
    runner's fused function with the quant info get_marlin_quant_info builds. The op takes top-k
    weights with the routed scaling already folded in (marlin_weights): upstream fuses it into
    top-k for this method, outside the MoE call."""
    P = lambda t: torch.nn.Parameter(t.clone(), requires_grad=False)  # noqa: E731
    layer = torch.nn.Module()
    layer.w13_weight, layer.w2_weight = P(tensors["w13_weight"]), P(tensors["w2_weight"])
    layer.w13_weight_scale, layer.w2_weight_scale = P(tensors["w13_weight_scale"]), P(tensors["w2_weight_scale"])
    layer.w13_weight_scale_2 = P(tensors["w13_weight_scale_2"][:, 0].contiguous())
    layer.w2_weight_scale_2 = P(tensors["w2_weight_scale_2"])
    layer.quant_config = SimpleNamespace(group_size=16)
    layer.moe_runner_config = api.Config(activation="silu", is_gated=True)
    layer.intermediate_size_per_partition = shape.inter
    layer.params_dtype = torch.bfloat16
    api.prepare(layer)
    emap = expert_map(shape, device)
    info = api.QuantInfo(
        w13_qweight=layer.w13_weight, w2_qweight=layer.w2_weight, w13_scales=layer.w13_weight_scale,
        w2_scales=layer.w2_weight_scale, w13_g_idx_sort_indices=None, w2_g_idx_sort_indices=None, weight_bits=4,
        w13_global_scale=layer.w13_weight_scale_2, w2_global_scale=layer.w2_weight_scale_2,
        expert_map=emap, global_num_experts=shape.routed_over if emap is not None else -1)
    config = api.Config(num_experts=shape.routed_over, num_local_experts=shape.experts, top_k=shape.topk,
                        activation="silu", is_gated=True, routed_scaling_factor=None)
    logits = torch.zeros((1, shape.routed_over), dtype=torch.bfloat16, device=device)
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    def op(x, ids, w):
        topk = StandardTopKOutput(topk_weights=w, topk_ids=ids, router_logits=logits.expand(x.shape[0], -1))
        out = api.run(SimpleNamespace(hidden_states=x, topk_output=topk), info, config)
        return out.hidden_states
    return op


def marlin_weights(routes, shape):
    """The routings with the routed scaling folded into the top-k weights, as Marlin's op takes them."""
    s = float(shape.routed_scaling)
    return [(i, (w * s).contiguous()) for i, w in routes] if s != 1.0 else list(routes)


# ----------------------------------------------------------------------------- upstream bf16 Triton

def triton_bf16_op(shape, device, seed: int = 0) -> Callable:
    """Upstream's Triton fused_experts on bf16 experts of the same shapes (random values: timing only)."""
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    g = torch.Generator(device=device).manual_seed(seed)
    e, h, i = shape.experts, shape.hidden, shape.inter
    w13 = (torch.randn((e, 2 * i, h), device=device, generator=g) * 0.02).to(torch.bfloat16)
    w2 = (torch.randn((e, h, i), device=device, generator=g) * 0.02).to(torch.bfloat16)
    # in place, as upstream's MoE layer runs it: the out-of-place path allocates its output through
    # the tensor-parallel group's symmetric-memory pool, which a one-GPU harness has not set up
    config = MoeRunnerConfig(num_experts=shape.routed_over, num_local_experts=e, top_k=shape.topk,
                             activation="silu", is_gated=True, inplace=True, gate_up_interleaved=False,
                             routed_scaling_factor=shape.routed_scaling)
    logits = torch.zeros((1, shape.routed_over), dtype=torch.bfloat16, device=device)
    own = {}  # one private input per token count: the op overwrites it (timing only)

    def op(x, ids, w):
        buf = own.get(x.shape[0])
        if buf is None:
            buf = own[x.shape[0]] = x.clone()
        fused_experts(buf, w13, w2, StandardTopKOutput(w, ids, logits.expand(x.shape[0], -1)), config)
        return buf
    return op


def bf16_expert_bytes(shape) -> int:
    return shape.bf16_bytes_per_expert()


def reason_of(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def time_backend(op: Callable, x: torch.Tensor, routes: Sequence[Tuple[torch.Tensor, torch.Tensor]], reps: int) -> float:
    """Median microseconds per call of `op` over the chain of routings (gemm_timing.time_ops)."""
    from .gemm_timing import time_ops

    return time_ops([lambda i=i, w=w: op(x, i, w) for i, w in routes], reps)


SANITY_TOKENS = 16
SANITY_REL_ERR = 0.05  # a backend this far off the reference (norm-wise) computes something else
# the server flags upstream's MoE kernels read from the process-wide ServerArgs (0.5.16)
KERNEL_FLAGS = ("enable_deterministic_inference", "enable_fused_moe_sum_all_reduce")


def publish_kernel_flags() -> Optional[str]:
    """Upstream's Triton MoE reads server flags from the process-wide ServerArgs, which only a
    server publishes. In this harness publish a stand-in holding upstream's defaults for them
    (0.5.16's runtime context takes stand-ins, as its test kits publish them); a published
    ServerArgs is left alone. Returns why upstream's MoE cannot run here, else None."""
    from sglang.sm120 import upstream_api as U

    try:
        U.require("runtime_context.get_server_args")()
        return None
    except ValueError:  # upstream's "Global server args is not set yet!"
        pass
    if U.has("runtime_context.get_exec"):
        return ("upstream's MoE kernels read the config bags that only a resolved ServerArgs publishes "
                "(base 0.5.23); time them on 0.5.16")
    defaults = U.require("ServerArgs")
    U.require("runtime_context.get_context")().set_server_args(
        SimpleNamespace(**{f: getattr(defaults, f) for f in KERNEL_FLAGS}))
    return None


BUILDERS = {"marlin": lambda tensors, shape, dev: marlin_moe_op(load_marlin_moe(), tensors, shape, dev),
            "bf16": lambda tensors, shape, dev: triton_bf16_op(shape, dev)}


def setup(shape, backends: Sequence[str], device, seed: int = 0):
    """(packed experts, {name: op}, {name: why not}) for ours ("sm120") and the named upstream
    backends (BUILDERS) on synthetic experts of `shape` (gate and up sharing one global scale);
    ours and Marlin are held against moe_reference at SANITY_TOKENS tokens before anything is
    timed (bf16 runs other weights). A backend that does not import, refuses the GPU or is off
    the reference is left out with the reason; ours failing raises."""
    from sglang.sm120 import kernels as K
    from sglang.sm120.kernels import moe

    tensors = shared_gate_up_scale(moe.synthetic_experts(shape.experts, shape.hidden, shape.inter, device, seed=seed))
    packed = K.pack_experts(**tensors)
    ops, errors = {"sm120": ours_op(packed, shape)}, {}
    unpublished = publish_kernel_flags() if backends else None
    for b in backends:
        if unpublished:
            errors[b] = unpublished
            continue
        try:
            ops[b] = BUILDERS[b](tensors, shape, device)
        except Exception as exc:  # ImportError, or upstream refusing this GPU / these shapes
            errors[b] = reason_of(exc)
    (ids, w), = routings(shape, SANITY_TOKENS, 1, device, seed=seed)
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(SANITY_TOKENS, shape.hidden, device=device, generator=g).to(torch.bfloat16)
    ref = moe.moe_reference(x, ids, w, **tensors, routed_scaling_factor=shape.routed_scaling).float()
    for b in [b for b in ("sm120", "marlin") if b in ops]:
        try:
            wb = marlin_weights([(ids, w)], shape)[0][1] if b == "marlin" else w
            y = ops[b](x, ids, wb).float()
            rel = float((y - ref).norm() / ref.norm().clamp_min(1e-30))
            why = None if rel <= SANITY_REL_ERR else f"result off the reference: relative error {rel:.3g} > {SANITY_REL_ERR}"
        except Exception as exc:
            why = reason_of(exc)
        if why:
            errors[b] = why
            del ops[b]
    if "sm120" not in ops:
        raise RuntimeError(f"{shape.name}: moe_w4a16 is off its reference: {errors['sm120']}")
    del tensors
    return packed, ops, errors


def time_row(shape, tokens: int, ops: dict, order: Sequence[str], expert_bytes: int, l2: int, reps: int,
             device, seed: int = 1) -> dict:
    """One (shape, tokens) cell: each backend of `order` timed in that order over one chain of
    routings (a name ending in "_repeat" times that backend again). {tokens, ops, experts_hit_mean,
    weight_bytes, us: {name: us}, failed: {name: why}}; ours ("sm120") failing raises."""
    n_ops = ops_needed(shape, tokens, expert_bytes, l2)
    routes = routings(shape, tokens, n_ops, device, seed=seed)
    g = torch.Generator(device=device).manual_seed(seed + tokens)
    x = torch.randn(tokens, shape.hidden, device=device, generator=g).to(torch.bfloat16)
    hit = sum(distinct_local(i, shape.experts) for i, _ in routes) / len(routes)
    row = {"shape": shape.name, "tokens": tokens, "ops": n_ops, "experts_hit_mean": round(hit, 2),
           "weight_bytes": int(hit * expert_bytes), "us": {}, "failed": {}}
    for key in order:
        b = key[: -len("_repeat")] if key.endswith("_repeat") else key
        if b not in ops or b in row["failed"]:
            continue
        try:
            rt = marlin_weights(routes, shape) if b == "marlin" else routes
            row["us"][key] = round(time_backend(ops[b], x, rt, reps), 3)
        except Exception as exc:
            if b == "sm120":
                raise
            row["failed"][b] = reason_of(exc)
    return row

"""The tolerance of the grouped W4A16 MoE (kernels.moe_w4a16) against kernels.moe.moe_reference,
for the GPU test (test/gpu/test_moe_w4a16.py) and `python -m sglang.sm120 check`'s moe stage.

The kernel and the reference round to bf16 at the same three points (the activation
SiLU(gate) * up, each slot's down output times its routing weight, the scaled top-k sum); only
their fp32 sums run in another order. With R = fp4_tolerance.REL_BOUND (2^-8, half a bf16 ulp)
and A = fp4_tolerance.ABS_BOUND (2^-14, an fp32 sum in another order, relative to the sum of the
magnitudes), per slot (token t, rank k, expert e, weight w), exact gate g, up u and their
magnitude products G = a_g |x| @ |W_g|^T, U = a_u |x| @ |W_u|^T:

    the activation before rounding differs by   da = A (1.1 G |u| + |SiLU(g)| U)   (SiLU' <= 1.1)
    after both round to bf16 (two half ulps):    Da = da + 2R |act|
    the down output d = a_2 act @ W_2^T:         Dd = a_2 (Da + A |act|) @ |W_2|^T
    the slot w d, both rounded:                  Dp = w Dd + 2R w |d|
    the output, s * sum_k p_k, both rounded:     |y - ref| <= s sum_k (Dp_k + A |p_k|) + 2R |ref|

times 1.05 for the second-order terms (products of two rounding errors) left out. Slots whose
expert is not local (ids outside [0, E)) add nothing to either side: where no slot of a token is
local, the bound is 0 and the kernel's row must be exactly 0.

That bound is rigorous but loose: it lets every activation of a slot move by one bf16 ulp at
once, about 10% of |ref| in the median on random weights. So a second, norm-wise test: the
relative error ||y - ref|| / ||ref|| must stay <= NORM_BOUND (2^-8). Both sides round at the
same points, so a correct kernel is bit-identical to the reference on nearly every element (a
rounding flips only where the fp32 sums straddle a bf16 boundary) and far below it; a result
scaled by 1%, a wrong or missing expert, slot or routing weight, swapped gate and up, or a wrong
global or block scale fails one test or the other.
"""
from __future__ import annotations

import torch

from sglang.sm120.fp4_tolerance import ABS_BOUND, REL_BOUND, Comparison, compare

SILU_SLOPE_MAX = 1.1  # max |d/dx x sigmoid(x)| = 1.0998
SECOND_ORDER_MARGIN = 1.05
NORM_BOUND = REL_BOUND


def moe_bound(hidden_states, topk_ids, topk_weights, w13_weight, w13_weight_scale, w13_weight_scale_2,
              w2_weight, w2_weight_scale, w2_weight_scale_2, *, routed_scaling_factor: float = 1.0) -> torch.Tensor:
    """fp32 [T, H]: the elementwise bound on |moe_w4a16 - moe_reference| (module docstring)."""
    from sglang.sm120 import nvfp4
    from sglang.sm120.kernels.moe import _check_expert_tensors, _decode_scales

    e, h, i = _check_expert_tensors(w13_weight, w13_weight_scale, w2_weight, w2_weight_scale)
    a13 = _decode_scales(w13_weight_scale_2, (e, 2), "w13_weight_scale_2").to(hidden_states.device)
    a2 = _decode_scales(w2_weight_scale_2, (e,), "w2_weight_scale_2").to(hidden_states.device)
    x = hidden_states.to(torch.float32)
    ax = x.abs()
    ids = topk_ids.to(torch.int64)
    t, topk = ids.shape
    per_slot = torch.zeros((t, topk, h), dtype=torch.float32, device=x.device)
    R, A = REL_BOUND, ABS_BOUND
    for ex in torch.unique(ids).tolist():
        if not 0 <= ex < e:
            continue
        tok, k = (ids == ex).nonzero(as_tuple=True)
        wg = nvfp4.dequantize_weight_modelopt(w13_weight[ex, :i], w13_weight_scale[ex, :i], 1.0)
        wu = nvfp4.dequantize_weight_modelopt(w13_weight[ex, i:], w13_weight_scale[ex, i:], 1.0)
        g, gg = (x[tok] @ wg.t()) * a13[ex, 0], (ax[tok] @ wg.abs().t()) * a13[ex, 0]
        u, uu = (x[tok] @ wu.t()) * a13[ex, 1], (ax[tok] @ wu.abs().t()) * a13[ex, 1]
        del wg, wu
        sg = torch.nn.functional.silu(g)
        act = (sg * u).abs()
        d_act = A * (SILU_SLOPE_MAX * gg * u.abs() + sg.abs() * uu) + 2 * R * act
        w2 = nvfp4.dequantize_weight_modelopt(w2_weight[ex], w2_weight_scale[ex], 1.0)
        act_b = (sg * u).to(torch.bfloat16).to(torch.float32)  # the activation both sides multiply
        d = (act_b @ w2.t()).abs() * a2[ex]
        dd = ((d_act + A * act) @ w2.abs().t()) * a2[ex]
        w = topk_weights[tok, k].to(torch.float32).abs()[:, None]
        per_slot[tok, k] = w * dd + 2 * R * w * d + A * w * d
    return per_slot.sum(dim=1) * abs(float(routed_scaling_factor))


def compare_moe(y: torch.Tensor, ref: torch.Tensor, slot_bound: torch.Tensor) -> Comparison:
    """y (the kernel) against ref (moe_reference): elementwise within SECOND_ORDER_MARGIN *
    (slot_bound + 2R |ref|), slot_bound from moe_bound, and ||y - ref|| / ||ref|| <= NORM_BOUND.
    Reported as fp4_tolerance.Comparison (worst = max error / elementwise bound)."""
    ref = ref.float()
    bound = SECOND_ORDER_MARGIN * (slot_bound + 2 * REL_BOUND * ref.abs())
    # fp4_tolerance.compare's bound is REL_BOUND |ref| + ABS_BOUND * absref: hand it ours through absref
    c = compare(y, ref, (bound - REL_BOUND * ref.abs()) / ABS_BOUND)
    if c.ok and not c.rel_err <= NORM_BOUND:
        return Comparison(False, 0, c.total, c.rel_err, c.worst,
                          detail=f"every element within its bound, but the relative error {c.rel_err:.3g} "
                                 f"> {NORM_BOUND:.3g} (norm-wise)")
    return c


def check_moe(y: torch.Tensor, hidden_states, topk_ids, topk_weights, tensors: dict, *,
              routed_scaling_factor: float = 1.0) -> Comparison:
    """moe_w4a16's output y against moe_reference on the same inputs, within moe_bound."""
    from sglang.sm120.kernels.moe import moe_reference

    ref = moe_reference(hidden_states, topk_ids, topk_weights, **tensors, routed_scaling_factor=routed_scaling_factor)
    bound = moe_bound(hidden_states, topk_ids, topk_weights, **tensors, routed_scaling_factor=routed_scaling_factor)
    return compare_moe(y, ref, bound)

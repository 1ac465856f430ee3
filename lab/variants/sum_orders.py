"""Eager fp32 summations over dim 1 in the orders a Triton reduction may take (the product's
runner/gpu_numerics.ORDERS), for matching the GPU's compiled `moe_sum_reduce_torch_compile` (sum
of the top-k expert outputs, times the routed scaling factor, into a bf16 / fp16 `out`). Used by
test/gpu/test_dynamo_free_bits_gpu.py, which reports which order gives the compiled bits where
the twin misses them (on the H100 it did not, top-k 2..9).
"""
from __future__ import annotations

from sglang.sm120.runner.gpu_numerics import ORDERS, ordered_sum  # noqa: F401 (ORDERS: the variant names)


def fp32_sums(x):
    """{order: fp32 sum of x over dim 1}: ATen's torch.sum, then ORDERS."""
    return {"torch.sum": x.float().sum(dim=1), **{o: ordered_sum(x, 1, o) for o in ORDERS}}


def reduce(x, scale: float, order: str, rounded_before_scale: bool):
    """The sum in `order` times `scale`, in x's dtype: one rounding, or the sum rounded first."""
    s = fp32_sums(x)[order]
    if rounded_before_scale:
        s = s.to(x.dtype).float()
    return (s * scale).to(x.dtype)


"""Eager fp32 summations over dim 1 in the orders a Triton reduction may take, for matching the
GPU's compiled `moe_sum_reduce_torch_compile` (sum of the top-k expert outputs, times the routed
scaling factor, into a bf16 / fp16 `out`). Used by the lab variants `sum-ORDER[-rounded]`
(sitecustomize.py) and by test/gpu/test_dynamo_free_bits_gpu.py, which reports which order gives
the compiled bits.
"""
from __future__ import annotations


def _sequential(parts):
    acc = parts[0]
    for q in parts[1:]:
        acc = acc + q
    return acc


def _tree(parts):  # neighbours first: ((0+1)+(2+3))+...
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def _butterfly(parts):  # lanes at distance n/2 first (shuffle-xor from the widest offset)
    import torch

    n = 1
    while n < len(parts):
        n *= 2
    parts = parts + [torch.zeros_like(parts[0])] * (n - len(parts))
    while len(parts) > 1:
        h = len(parts) // 2
        parts = [parts[i] + parts[i + h] for i in range(h)]
    return parts[0]


def _runs_then_butterfly(parts, run):
    """Each thread adds its `run` consecutive elements in order, then the lanes combine as a
    butterfly (a reduction over a layout with `run` elements per thread)."""
    return _butterfly([_sequential(parts[i:i + run]) for i in range(0, len(parts), run)])


# the orders a lab variant may name (sitecustomize.py: sum-ORDER[-rounded])
ORDERS = ("sequential", "tree", "butterfly", "pairs-butterfly", "quads-butterfly")


def fp32_sums(x):
    """{order: fp32 sum of x over dim 1}: ATen's torch.sum, then ORDERS."""
    parts = [x[:, k].float() for k in range(x.shape[1])]
    return {"torch.sum": x.float().sum(dim=1), "sequential": _sequential(parts), "tree": _tree(parts),
            "butterfly": _butterfly(parts), "pairs-butterfly": _runs_then_butterfly(parts, 2),
            "quads-butterfly": _runs_then_butterfly(parts, 4)}


def reduce(x, scale: float, order: str, rounded_before_scale: bool):
    """The sum in `order` times `scale`, in x's dtype: one rounding, or the sum rounded first."""
    s = fp32_sums(x)[order]
    if rounded_before_scale:
        s = s.to(x.dtype).float()
    return (s * scale).to(x.dtype)


def twin(order: str, rounded_before_scale: bool):
    """A stand-in for moe_sum_reduce_torch_compile(x, out, scale) summing in `order`."""

    def moe_sum_reduce(x, out, routed_scaling_factor):
        out.copy_(reduce(x, routed_scaling_factor, order, rounded_before_scale))

    return moe_sum_reduce

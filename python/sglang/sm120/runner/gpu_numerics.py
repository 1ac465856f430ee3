"""The fp32 arithmetic of Inductor's GPU (Triton) kernels, without Dynamo: for Dynamo-free twins
(runner/dynamo_free.py) of torch.compile'd helpers that must give the compiled bits.

Where a Triton kernel's fp32 result differs from ATen's:
- sigmoid: Inductor emits `tl.sigmoid(x)`, Triton's 1 / (1 + exp(-x)) with the approximate exp
  (ex2.approx) and the approximate division (div.full.f32); ATen's sigmoid is neither.
- tensor / tensor: Triton's `/` on fp32 is div.full.f32 (up to 2 ulp off IEEE division; Inductor
  keeps it unless TORCHINDUCTOR_EMULATE_DIVISION_ROUNDING=1).
- a reduction: Triton sums in the order of its reduction layout (each thread's elements in
  order, then the lanes as a butterfly), ATen in its own. ORDERS are the candidates; which one a
  given kernel takes is measured on the GPU (test/gpu/test_dynamo_free_bits_gpu.py).
Additions and products of two values, gathers and top-k are the same in both.

`sigmoid` and `div_full` run one-line Triton kernels of their own (plain @triton.jit: no Dynamo,
no Inductor), built on first use: inside a forward, that is the runners' warm pass, before the
traps arm.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Dict, List

import torch
from torch.overrides import TorchFunctionMode

ORDERS = ("sequential", "tree", "butterfly", "pairs-butterfly", "quads-butterfly")
BLOCK = 1024


def _sequential(parts: List):
    acc = parts[0]
    for q in parts[1:]:
        acc = acc + q
    return acc


def _tree(parts: List):  # neighbours first: ((0+1)+(2+3))+...
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def _butterfly(parts: List):
    """Lanes at distance n/2 first (a shuffle-xor reduction from the widest offset), the count
    padded to a power of two with zeros, as a masked lane holds."""
    n = 1
    while n < len(parts):
        n *= 2
    parts = parts + [torch.zeros_like(parts[0])] * (n - len(parts))
    while len(parts) > 1:
        h = len(parts) // 2
        parts = [parts[i] + parts[i + h] for i in range(h)]
    return parts[0]


def _runs_then_butterfly(run: int) -> Callable:
    """Each thread adds its `run` consecutive elements in order, then the lanes combine as a
    butterfly (a reduction over a layout with `run` elements per thread)."""
    return lambda parts: _butterfly([_sequential(parts[i:i + run]) for i in range(0, len(parts), run)])


_ORDER_FNS: Dict[str, Callable] = {"sequential": _sequential, "tree": _tree, "butterfly": _butterfly,
                                   "pairs-butterfly": _runs_then_butterfly(2),
                                   "quads-butterfly": _runs_then_butterfly(4)}


def ordered_sum(x, dim: int, order: str, keepdim: bool = False):
    """fp32 sum of x over `dim`, adding the slices in `order` (one of ORDERS)."""
    if order not in _ORDER_FNS:
        raise ValueError(f"summation order must be one of {', '.join(ORDERS)}, got {order!r}")
    parts = [p.float() for p in x.unbind(dim)]
    out = _ORDER_FNS[order](parts)
    return out.unsqueeze(dim) if keepdim else out


@functools.lru_cache(maxsize=None)
def _kernels():
    import triton
    import triton.language as tl

    # one compiled variant per kernel: no specialisation on the element count, and the wrappers
    # pass 16-byte aligned pointers only (a variant built after the traps arm would be a ptxas run)
    @triton.jit(do_not_specialize=["n"])
    def sigmoid_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out_ptr + i, tl.sigmoid(tl.load(x_ptr + i, mask=m)), mask=m)

    @triton.jit(do_not_specialize=["n"])
    def div_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out_ptr + i, tl.load(a_ptr + i, mask=m) / tl.load(b_ptr + i, mask=m), mask=m)

    return sigmoid_kernel, div_kernel


def _fp32(t, name: str):
    if t.dtype != torch.float32 or not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA float32 tensor, got {t.dtype} on {t.device}")
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()  # a view at an odd offset: an aligned copy


def sigmoid(x):
    """Triton's fp32 sigmoid (Inductor's `tl.sigmoid`) of a CUDA float32 tensor."""
    x = _fp32(x, "sigmoid")
    out = torch.empty_like(x)
    if x.numel():
        _kernels()[0][(-(-x.numel() // BLOCK),)](x, out, x.numel(), BLOCK=BLOCK)
    return out


def div_full(a, b):
    """a / b as Triton divides fp32 (div.full.f32); b broadcast to a's shape."""
    a = _fp32(a, "div_full")
    b = _fp32(b.expand_as(a), "div_full")
    out = torch.empty_like(a)
    if a.numel():
        _kernels()[1][(-(-a.numel() // BLOCK),)](a, b, out, a.numel(), BLOCK=BLOCK)
    return out


# Inductor unrolls a reduction over fewer elements than this into one chain of adds in element
# order (torch._inductor.config.unroll_reductions_threshold); longer ones take the layout's order
UNROLLED_BELOW = 8
CONSTANT_DIVISIONS = ("reciprocal", "div_full")
REDIRECTED_DEVICES = {"cuda"}  # the CPU tests add "cpu" with stand-ins for the two kernels


# the tensor divisions a TorchFunctionMode sees, out of place and in place (dynamo_free's
# constant-division mode redirects the same ones)
DIVISIONS = {torch.Tensor.__truediv__, torch.Tensor.div, torch.div, torch.Tensor.true_divide, torch.true_divide}
IN_PLACE_DIVISIONS = {torch.Tensor.__itruediv__, torch.Tensor.div_, torch.Tensor.true_divide_}
_SIGMOIDS = {torch.sigmoid, torch.Tensor.sigmoid}
_SUMS = {torch.sum, torch.Tensor.sum}


def reciprocal(d: float) -> float:
    """1 / d as Inductor folds a division by the constant d into a product (d = 0: a signed inf)."""
    return math.copysign(math.inf, d) if d == 0 else 1.0 / d


def times_reciprocal(func, a, d: float):
    """a / d (d a Python number) as Inductor's GPU kernel computes it: a times 1 / d, in place for
    an in-place division."""
    r = reciprocal(d)
    return a.mul_(r) if func in IN_PLACE_DIVISIONS else a.mul(r)


def _fp32_redirected(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type in REDIRECTED_DEVICES and t.dtype == torch.float32


def is_number(v) -> bool:
    """A Python int or float (not a bool): what Inductor folds into a kernel as a constant."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class InductorGpuNumerics(TorchFunctionMode):
    """Gives a helper's plain body the fp32 results of Inductor's GPU kernel for the same ops:
    sigmoid and tensor / tensor as Triton computes them, sums over one dimension in `order`, a
    division by a Python number as a product with its reciprocal (`constant_division="reciprocal"`:
    the number specialised into the kernel) or as div.full (`"div_full"`: the number passed in).
    Only float32 operands on REDIRECTED_DEVICES are redirected; everything else runs as written."""

    def __init__(self, order: str, constant_division: str):
        if order not in ORDERS or constant_division not in CONSTANT_DIVISIONS:
            raise ValueError(f"order must be one of {ORDERS} and constant_division one of "
                             f"{CONSTANT_DIVISIONS}, got {order!r}, {constant_division!r}")
        super().__init__()
        self.order, self.constant_division = order, constant_division

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}  # (the mode is off inside its own handler)
        out = self._redirect(func, args, kwargs)
        return func(*args, **kwargs) if out is NotImplemented else out

    def _redirect(self, func, args, kwargs):
        if func in _SIGMOIDS and len(args) == 1 and not kwargs and _fp32_redirected(args[0]):
            return sigmoid(args[0])
        if (func in DIVISIONS or func in IN_PLACE_DIVISIONS) and len(args) == 2 and not kwargs \
                and _fp32_redirected(args[0]):
            a, b = args
            if is_number(b) and self.constant_division == "reciprocal":
                return times_reciprocal(func, a, b)
            if _fp32_redirected(b):
                q = div_full(*torch.broadcast_tensors(a, b))
            elif is_number(b):
                q = div_full(a, torch.full_like(a, b))
            else:
                return NotImplemented
            return a.copy_(q) if func in IN_PLACE_DIVISIONS else q
        dim = args[1] if len(args) == 2 else kwargs.get("dim")
        if func in _SUMS and 1 <= len(args) <= 2 and _fp32_redirected(args[0]) and isinstance(dim, int) \
                and kwargs.get("dtype") in (None, torch.float32) and set(kwargs) <= {"dim", "keepdim", "dtype"}:
            x = args[0]
            order = "sequential" if x.shape[dim] < UNROLLED_BELOW else self.order
            return ordered_sum(x, dim, order, keepdim=bool(kwargs.get("keepdim", False)))
        return NotImplemented


def inductor_gpu_twin(f: Callable, order: str, constant_division: str) -> Callable:
    """f's plain body with the fp32 results of Inductor's GPU kernel (InductorGpuNumerics)."""
    mode = InductorGpuNumerics(order, constant_division)  # a bad choice fails here, not at the first call

    @functools.wraps(f)
    def twin(*args, **kwargs):
        with mode:
            return f(*args, **kwargs)

    return twin

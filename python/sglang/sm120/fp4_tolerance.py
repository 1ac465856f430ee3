"""The NVFP4 GEMM tolerance and reference product every correctness check of the fork uses: the
server's self-check (fp4_selfcheck), `python -m sglang.sm120 check`, the kernel tests (docs/kernels.md):

    |y - ref| <= 2^-8 * |ref| + 2^-14 * (|x| @ |W|^T)

ref is the fp32 product of exactly the quantized operands. The first term covers the bf16 output
rounding (half an ulp is 2^-9), the second fp32 accumulation in another order (split-K, tensor
cores). Dropping or mis-scaling one 16-element block moves a result by about 16/K of
|x| @ |W|^T, far above 2^-14 for every K the fork meets (<= 16384).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

REL_BOUND = 2.0 ** -8
ABS_BOUND = 2.0 ** -14


@dataclass
class Comparison:
    ok: bool
    bad: int            # elements outside the tolerance (NaN counts as outside)
    total: int
    rel_err: float      # ||y - ref|| / ||ref||
    worst: float        # max |y - ref| / bound over all elements
    first_bad: Optional[tuple] = None
    detail: str = ""

    def summary(self) -> str:
        if self.ok:
            return f"rel err {self.rel_err:.2e}, worst err/bound {self.worst:.3f}"
        return f"{self.bad} of {self.total} outside tolerance, rel err {self.rel_err:.2e}; {self.detail}"


def exact_dequant(packed: torch.Tensor, scales: torch.Tensor, decode_scale) -> torch.Tensor:
    """fp32 [rows, K] of a ModelOpt NVFP4 matrix (row-major scales): e2m1 * e4m3 * global scale,
    every product exact in fp32."""
    from sglang.sm120 import nvfp4 as F

    vals = F.e2m1_codes_to_float(F.unpack_e2m1(packed))
    sf = scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
    return vals * sf * float(decode_scale)


def reference_gemm(xd: torch.Tensor, wd: torch.Tensor):
    """(ref, absref) of fp32 operands (dequantized exactly): x @ W^T, and |x| @ |W|^T for the bound."""
    return xd @ wd.t(), xd.abs() @ wd.abs().t()


def compare(y: torch.Tensor, ref: torch.Tensor, absref: torch.Tensor) -> Comparison:
    """y (any float dtype) against the fp32 reference, bound from |x| @ |W|^T (absref)."""
    y = y.float()
    bound = REL_BOUND * ref.abs() + ABS_BOUND * absref
    err = (y - ref).abs()
    bad = ~(err <= bound)
    n_bad = int(bad.sum())
    rel = float((y - ref).norm() / ref.norm().clamp_min(1e-30))
    ratio = (err / bound.clamp_min(1e-30)).nan_to_num(nan=float("inf"))
    worst = float(ratio.max()) if ratio.numel() else 0.0
    if not n_bad:
        return Comparison(True, 0, y.numel(), rel, worst)
    idx = tuple(bad.nonzero()[0].tolist())
    detail = (f"first at {list(idx)}: got {y[idx].item():.6g}, ref {ref[idx].item():.6g}, "
              f"bound {bound[idx].item():.3g}")
    return Comparison(False, n_bad, y.numel(), rel, worst, idx, detail)

"""Self-check of the sm120 NVFP4 MoE backend: once per process, before it serves.

When: fp4_moe.layer_backend calls ensure_verified() from the first ModelOpt NVFP4 MoE layer's
create_moe_runner (patch 0202), while the model is built: before any weight is loaded, so a
failure can still hand that layer -- and the process -- to upstream's backend, whose weight
order, dispatcher and runner differ from ours.

What: synthetic ModelOpt NVFP4 experts (kernels.moe.synthetic_experts) with the layer's hidden
size H and intermediate size I and min(E, MAX_CHECK_EXPERTS) experts (H and I pick the kernel's
tiling and K splits, so they stay whole; the experts only repeat the same code), packed by
pack_experts and run through kernels.moe_w4a16 for each (tokens, active experts) of
CHECK_CASES -- one token, a batch routed to only `topk` experts (the others get zero rows), a
larger batch with some ids of other ranks' experts (-1, as upstream's EP dispatcher maps them),
at routed_scaling_factor 1 as the layer runs it -- against kernels.moe.moe_reference with

    |y - ref| <= 2^-7 * (|ref| + max over the token's row of |ref|)

The reference rounds where the kernel rounds (SiLU(gate) * up and each expert's weighted output
to bf16), so the two differ by fp32 summation order and the bf16 roundings it flips: a few ulps
(2^-8 relative) of the row's largest values. A dropped expert, a swapped gate/up half or a
mis-scaled block moves results by a sizeable fraction of the row.

On a mismatch or an exception: ONE error line (selfcheck.OnceCheck) and the process's MoE runner
backend becomes upstream's choice (fp4_moe_backend.fall_back_to_upstream).
SGLANG_SM120_FAULT_INJECT=moe corrupts one element of the first result compared, to show that.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple

from sglang.sm120.selfcheck import OnceCheck, corrupt_one, error_line, fault_site

logger = logging.getLogger(__name__)

MAX_CHECK_EXPERTS = 8
CHECK_CASES: Tuple[Tuple[int, str], ...] = ((1, "all"), (16, "topk"), (96, "all+ep"))
TOL = 2.0 ** -7


@dataclass
class MoeOutcome:
    ok: bool
    experts: int            # the layer's E, H, I
    hidden: int
    intermediate: int
    checked_experts: int
    topk: int
    tokens: tuple
    seconds: float
    case: Optional[int] = None  # the failing token count
    path: str = ""
    error: str = ""
    fallback: str = ""

    def passed(self) -> str:
        return (f"grouped MoE E={self.experts} H={self.hidden} I={self.intermediate} ({self.checked_experts} "
                f"experts checked, top-{self.topk}), tokens={','.join(map(str, self.tokens))}, {self.seconds:.2f} s")

    def failure(self) -> str:
        return (f"grouped MoE E={self.experts} H={self.hidden} I={self.intermediate} tokens={self.case} "
                f"{self.path}: {self.error}")


def compare(y, ref) -> Optional[str]:
    """None when y is within the tolerance of ref (module docstring), else what is off."""
    import torch

    y, ref = y.float(), ref.float()
    bound = TOL * (ref.abs() + ref.abs().amax(dim=1, keepdim=True))
    bad = ~((y - ref).abs() <= bound)
    if not bool(bad.any()):
        return None
    idx = tuple(bad.nonzero()[0].tolist())
    return (f"{int(bad.sum())} of {y.numel()} outside tolerance; first at {list(idx)}: got "
            f"{y[idx].item():.6g}, ref {ref[idx].item():.6g}, bound {bound[idx].item():.3g}"
            + ("" if bool(torch.isfinite(y).all()) else " (non-finite results)"))


def verify_shape(experts: int, hidden: int, intermediate: int, topk: int, device,
                 cases: Sequence[Tuple[int, str]] = CHECK_CASES) -> MoeOutcome:
    import torch

    from sglang.sm120.kernels import moe

    t0 = time.perf_counter()
    e = min(experts, MAX_CHECK_EXPERTS)
    k = max(1, min(topk, e))
    fault = fault_site() == "moe"
    device = torch.device(device)

    def outcome(ok, **kw):
        return MoeOutcome(ok, experts, hidden, intermediate, e, k, tuple(c[0] for c in cases),
                          time.perf_counter() - t0, **kw)

    path, tokens = "setup", None
    try:
        w = moe.synthetic_experts(e, hidden, intermediate, device, seed=hidden * 31 + intermediate)
        packed = moe.pack_experts(**w)
        g = torch.Generator(device=device).manual_seed(e)
        for i, (tokens, kind) in enumerate(cases):
            path = kind
            ids, weights = moe.synthetic_routing(tokens, k, e, device, seed=i, active=k if kind == "topk" else None)
            if kind.endswith("+ep"):
                ids[::3, -1] = -1  # other ranks' experts, as upstream's EP dispatcher maps them
            x = torch.randn((tokens, hidden), device=device, generator=g).to(torch.bfloat16)
            y = moe.moe_w4a16(x, ids, weights, packed)
            if fault and i == 0:
                y = corrupt_one(y)
            why = compare(y, moe.moe_reference(x, ids, weights, **w))
            if why:
                return outcome(False, case=tokens, path=path, error=why)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:
        return outcome(False, case=tokens, path=path, error=error_line(exc))
    return outcome(True)


_check = OnceCheck("NVFP4 MoE", "MoE runner", logger)


def outcome() -> Optional[MoeOutcome]:
    """This process's MoE self-check result (None before the first NVFP4 MoE layer)."""
    return _check.outcome


def ensure_verified(experts: int, hidden: int, intermediate: int, topk: int, device, *,
                    verify: Optional[Callable[..., MoeOutcome]] = None,
                    fall_back: Optional[Callable[[str], str]] = None) -> MoeOutcome:
    """The first call runs `verify` (default verify_shape) on the layer's shapes, logs one line and,
    on failure, falls back (default fp4_moe_backend.fall_back_to_upstream); later calls return
    that first outcome."""
    from sglang.sm120 import fp4_moe_backend

    verify = verify or verify_shape
    return _check.ensure(lambda: verify(experts, hidden, intermediate, topk, device),
                         fall_back or fp4_moe_backend.fall_back_to_upstream)


def reset_for_tests() -> None:
    _check.reset()

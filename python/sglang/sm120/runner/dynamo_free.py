"""Eager stand-ins for upstream's @torch.compile helpers on the serving path.

Upstream decorates small helpers (MoE top-k fallbacks, moe_sum_reduce, SwiGLU variants, the
vocab-parallel embedding mask, the DSA indexer's head gates, the seeded sampler, the repetition
penalty, FP4 KV quantization, ...) with torch.compile; test/cpu/runner/torch_compile_sites.toml
lists every site of each base and why the others are never reached. Every call of such a helper enters Dynamo,
even when its code is cached, and the first call compiles (Inductor + Triton, minutes cold). The
series replaces those decorators with `compile_unless_dynamo_free(...)`: when the layerwise
backend is configured (SGLANG_SM120_DYNAMO_FREE=1, set by runner.config.finalize and inherited
by the scheduler processes) an eager function runs, otherwise upstream's torch.compile wrapper
does, built on first use.

The eager function must give what the compiled one gives, bit for bit, or layerwise changes the
tokens a user gets from upstream's configuration (which runs the compiled helper, with or
without CUDA graphs). Inductor fuses a helper's pointwise ops into one kernel that computes in
fp32 and rounds to the output dtype once (it drops the bf16 round trips between ops:
torch._inductor.config.emulate_precision_casts is off), where the plain body rounds after every
op. So a helper whose body rounds between ops has an *eager twin* here that follows Inductor's
order: same ops in fp32, one rounding at the end. moe_sum_reduce_torch_compile is the one every
MoE family meets (<= 32 tokens with top-k > 2 or a routed scaling factor): its plain body gives
bf16(bf16(sum) * scale), the compiled one bf16(sum * scale). Helpers without a twin run their
plain body; where that body rounds only once (fp32 math, concatenation, integer masks) it already
gives the compiled bits; the top-k fallbacks (grouped / biased top-k, reached only where
sglang's fused router kernels do not apply) use Triton's fast exp and division when compiled,
which no eager op reproduces (docs/runner.md, "Same tokens as upstream").
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict

from .. import settings

ENV = "SGLANG_SM120_DYNAMO_FREE"


def dynamo_free() -> bool:
    return settings.switch(ENV)


def _moe_sum_reduce_twin(x, out, routed_scaling_factor):
    """Inductor's kernel for `torch.sum(x, dim=1, out=out); out.mul_(scale)`: the sum and the
    scale in fp32, one rounding into `out`."""
    import torch

    if routed_scaling_factor == 1.0:  # the scale is exact: the plain sum rounds once already
        torch.sum(x, dim=1, out=out)
        return
    out.copy_(torch.sum(x, dim=1, dtype=torch.float32).mul_(routed_scaling_factor))


def _upcast_twin(f: Callable) -> Callable:
    """f on fp32 copies of its low-precision tensor arguments, the result rounded once to the
    dtype of its first tensor argument (Inductor's order for a pointwise chain)."""

    @functools.wraps(f)
    def twin(*args, **kwargs):
        import torch

        low = (torch.bfloat16, torch.float16)
        dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor)), None)
        up = [a.float() if isinstance(a, torch.Tensor) and a.dtype in low else a for a in args]
        out = f(*up, **kwargs)
        return out.to(dtype) if dtype in low and isinstance(out, torch.Tensor) else out

    return twin


# helper name -> twin factory (given the plain function). Looked up at every call, so a lab
# variant (lab/variants/sitecustomize.py: plain-eager-helpers) can empty it to measure the plain
# bodies.
TWINS: Dict[str, Callable[[Callable], Callable]] = {
    "moe_sum_reduce_torch_compile": lambda f: _moe_sum_reduce_twin,
    "_swiglu_silu_clamp_mul": _upcast_twin,
    "swiglu_gpt_oss_sigmoid_alpha": _upcast_twin,
    "swiglu_no_interleaved_with_alpha_and_limit": _upcast_twin,
}


def eager_twin(f: Callable) -> Callable:
    """What runs for helper `f` in Dynamo-free mode: its twin, else its plain body."""
    make = TWINS.get(getattr(f, "__name__", ""))
    return make(f) if make is not None else f


def compile_unless_dynamo_free(fn: Callable = None, /, **compile_kwargs: Any):
    """Use like torch.compile as a decorator, bare or with keyword arguments."""

    def decorate(f: Callable) -> Callable:
        compiled = None
        twins: Dict[Callable, Callable] = {}  # twin factory -> twin, built on first use

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            nonlocal compiled
            if dynamo_free():
                make = TWINS.get(f.__name__)
                if make is None:
                    return f(*args, **kwargs)
                twin = twins.get(make)
                if twin is None:
                    twin = twins[make] = make(f)
                return twin(*args, **kwargs)
            if compiled is None:
                import torch

                compiled = torch.compile(f, **compile_kwargs)
            return compiled(*args, **kwargs)

        wrapper.__wrapped_eager__ = f
        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate

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
fp32 and rounds to the output dtype once: it drops the bf16 round trips between ops, explicit
`.to(bf16)` casts inside the chain included (torch._inductor.config.emulate_precision_casts is
off). So a helper whose body rounds between ops has an *eager twin* here (TWINS) that follows
Inductor's order: the same ops in fp32, one rounding at the end:
- moe_sum_reduce_torch_compile (every MoE family, <= 32 tokens with top-k > 2 or a routed
  scaling factor): the plain body gives bf16(bf16(sum) * scale), the compiled one bf16(sum * scale).
- the SwiGLU variants (GPT-OSS-style gemm1_alpha / gemm1_limit experts).
- apply_rotary_emb, the native rope (patch 0112; only with --rl-on-policy-target or on MUSA):
  the plain body rounds each product and sum and the cos/sin cast to bf16.
- FP4MXBlock16KVQuantizeUtil.batched_quantize (--kv-cache-dtype fp4_e2m1): the plain body
  computes a block's scale exponent ceil(log2(max / 6)) in bf16, which rounds max / 6 and the
  log2 and so picks the next exponent down for some blocks (a different code for all 16 values).
- multinomial_with_seed (fp64 throughout): no rounding between ops, but on GPUs Inductor lowers
  a division by a constant to a multiplication by its reciprocal (CPUs keep the division), so
  the twin divides the hash the same way; the fp64 noise then differs from the plain body's in
  the last bit of some values. batched_quantize's twin divides max / 6 the same way (for bf16
  and fp16 maxima either division gives the same exponent; the CPU test checks all of them).
Helpers without a twin run their plain body, which already gives the compiled bits: fp32 math
that Inductor does not reorder (the DSA indexer's head gates: products only), integer and mask
helpers (vocab-parallel mask, top-k id post-processing, waterfill expansion, the overlap debug
assert), a concatenation, batched_dequantize (fp32, one cast at the end).

test/cpu/runner/test_dynamo_free_bits_*.py hold every routed helper to Inductor's CPU kernel
(bitwise, both bases). The CPU backend stands in for the GPU's Triton kernel where the
difference is the order of ops and roundings; it does not show what only the GPU kernel does:
- Triton's sigmoid (fast exp, approximate division) and its fp32 division (div.full: up to 2 ulp
  off) have no eager equivalent. Hence the MoE top-k fallbacks (grouped / biased top-k: sigmoid
  or softmax and a renormalising division; reached only where sglang's fused router kernels do
  not apply) and apply_scaling_penalties (repetition penalty: logits / penalty; reached by any
  request, greedy or not, whose repetition_penalty is not 1) are not reproduced on GPUs, and
  the SwiGLU twins match Triton up to its sigmoid. batched_quantize's division by a power of two
  is exact if the approximate division is exact there (expected, not measured here).
- Triton contracts a product and a sum into an FMA (Inductor compiles with fp fusion on): the
  rope twin matches the GPU kernel where its products are exact (bf16 / fp16 cos and sin); with
  the fp32 cos/sin cache CUDA keeps, an FMA may round differently.
- multinomial_with_seed's fp64 log: whether Triton's equals ATen's on the GPU is not measured.
- moe_sum_reduce at top-k >= 8 is a real reduction (smaller ones are unrolled into one fp32
  chain): the CPU kernel stores the bf16 sum before scaling, so the CPU tests cannot hold the twin
  there; test/gpu/test_dynamo_free_bits_gpu.py does, and found it bit-exact on the H100 at top-k
  2..8 (session 13).
The sigmoid routers (biased_grouped_topk_impl and kin) are reached by GLM-4.5 and GLM-5 routing
with the shared expert fused into the top-k; runner/gpu_numerics.py builds candidate twins for
them (Triton's own sigmoid and division, ordered sums), which the same GPU test holds to the
compiled bits. None is in TWINS until one matches there.
docs/runner.md ("Same tokens as upstream") says which of these the shipped models reach.
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


class _ConstantDivisionAsReciprocal:
    """A TorchFunctionMode (built on first use: torch is imported lazily) that turns `t / c` and
    `t /= c`, c a Python number and t a floating tensor, into `t * (1 / c)`: Inductor's GPU
    lowering of a division by a constant (its div lowering, off CPU)."""

    mode = None

    @classmethod
    def get(cls):
        if cls.mode is None:
            import torch
            from torch.overrides import TorchFunctionMode

            from .gpu_numerics import DIVISIONS, IN_PLACE_DIVISIONS, is_number, times_reciprocal

            class Mode(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    kwargs = kwargs or {}
                    if ((func in DIVISIONS or func in IN_PLACE_DIVISIONS) and len(args) == 2 and not kwargs
                            and isinstance(args[0], torch.Tensor) and args[0].is_floating_point()
                            and is_number(args[1])):
                        return times_reciprocal(func, *args)
                    return func(*args, **kwargs)

            cls.mode = Mode
        return cls.mode()


def _reciprocal_division_twin(f: Callable) -> Callable:
    """f with its divisions by Python numbers done as Inductor does them on GPUs."""

    @functools.wraps(f)
    def twin(*args, **kwargs):
        with _ConstantDivisionAsReciprocal.get():
            return f(*args, **kwargs)

    return twin


# helper name -> twin factory (given the plain function). Looked up at every call, so a lab
# variant (lab/variants/sitecustomize.py: plain-eager-helpers) can empty it to measure the plain
# bodies.
TWINS: Dict[str, Callable[[Callable], Callable]] = {
    "moe_sum_reduce_torch_compile": lambda f: _moe_sum_reduce_twin,
    "_swiglu_silu_clamp_mul": _upcast_twin,
    "swiglu_gpt_oss_sigmoid_alpha": _upcast_twin,
    "swiglu_no_interleaved_with_alpha_and_limit": _upcast_twin,
    "apply_rotary_emb": _upcast_twin,
    "batched_quantize": lambda f: _upcast_twin(_reciprocal_division_twin(f)),
    "multinomial_with_seed": _reciprocal_division_twin,
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

"""Eager stand-ins for upstream's @torch.compile helpers on the serving path.

Upstream decorates small helpers (MoE top-k fallbacks, moe_sum_reduce, SwiGLU variants, the
vocab-parallel embedding mask, the DSA indexer's head gates, the seeded sampler, the repetition
penalty, FP4 KV quantization, ...) with torch.compile; test/cpu/runner/torch_compile_sites.toml
lists every site of each base and why the others are never reached. Every call of such a helper enters Dynamo,
even when its code is cached, and the first call compiles (Inductor + Triton, minutes cold). The
series replaces those decorators with `compile_unless_dynamo_free(...)`: when the layerwise
backend is configured (SGLANG_SM120_DYNAMO_FREE=1, set by runner.config.finalize and inherited
by the scheduler processes) the plain Python function runs, otherwise upstream's torch.compile
wrapper does, built on first use. The eager body is the function torch.compile would trace, so
results match up to floating-point reassociation of fused pointwise ops.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from .. import settings

ENV = "SGLANG_SM120_DYNAMO_FREE"


def dynamo_free() -> bool:
    return settings.switch(ENV)


def compile_unless_dynamo_free(fn: Callable = None, /, **compile_kwargs: Any):
    """Use like torch.compile as a decorator, bare or with keyword arguments."""

    def decorate(f: Callable) -> Callable:
        compiled = None

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            nonlocal compiled
            if dynamo_free():
                return f(*args, **kwargs)
            if compiled is None:
                import torch

                compiled = torch.compile(f, **compile_kwargs)
            return compiled(*args, **kwargs)

        wrapper.__wrapped_eager__ = f
        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate

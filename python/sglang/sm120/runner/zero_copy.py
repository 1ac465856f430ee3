"""Zero-copy MoE inputs (opt-in, SGLANG_SM120_LAYERWISE_ZERO_COPY=1): a lean step reads the
tensors its segment wrote, where the capture otherwise stages them into static buffers.

Why: staging is one copy per token-major MoE input (hidden states, top-k weights and ids), the
last ops of every segment: three device copies per MoE layer and forward, which grow with the
prefill tokens.

Why it is safe to read the segment's own output at replay: at capture its memory belongs to the
graph pool; once the model drops the tensor the pool may give the memory to a later capture,
but every such capture replays after this island's step has run (segments replay in capture
order within a size, and one size replays per forward), and nothing runs between the segment
that wrote the tensor and the step that reads it. Only lean steps read in place: they never write
their inputs, where upstream's forward may (in-place MoE), and a later segment may still read the
input.

Why a non-owning view: holding the tensor itself would keep one hidden-state-sized block per
layer and size alive in the pool. The view is built from the
address, as torch's own CUDA-graph trees rebuild pool tensors
(`torch._C._construct_storage_from_data_pointer`); the allocator never sees it.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

from .. import settings

ENV = "SGLANG_SM120_LAYERWISE_ZERO_COPY"


def requested() -> bool:
    return settings.switch(ENV)


def non_owning_view(t: torch.Tensor) -> torch.Tensor:
    """A tensor over t's memory (same shape, strides, dtype, device) that does not keep it alive.

    Built outside any active dispatch mode: it is bookkeeping, not work of the segment being
    captured (the CPU stand-in graph would otherwise record and replay it)."""
    with _disable_current_modes():
        if t.numel() == 0:
            return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))  # elements from the first
        storage = torch._C._construct_storage_from_data_pointer(t.data_ptr(), t.device, span * t.element_size())
        return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, t.shape, t.stride())

"""The lean MoE step's decisions that differ on upstream sglang 0.5.23 (lean_moe.py holds the rest).

Against 0.5.16, 0.5.23's unquantized Triton path: copies the up config and pops a USE_TMA from it
(TMA weight loads in the up GEMM, passed on as `b_use_tma`); pops the down config's USE_TMA
even where TMA is unsupported; gives the gated activation a row filter when the down GEMM uses
TMA (taken from upstream's own `_activation_row_filter`); pads the align buffer to a multiple
of 4 and aligns tiny batches of many experts with one single-CTA Triton launch; sums <= 32
tokens with a Triton kernel on GPUs with PDL; and reaches the activation's JIT module through
`activation_module`. Reproduced here, each one as upstream decides it.

Refused (upstream's path runs there): w13 interleaved for the fused SwiGLU epilogue
(SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED), a forced fused-op backend (SGLANG_FORCE_FUSED_OP_BACKEND),
DWDP weight prefetch around the layer, the FlashInfer flags forward_cuda reads before the
runner, and an out-of-place output upstream would allocate in NCCL symmetric memory.
"""
from __future__ import annotations

from typing import Optional, Tuple


def layer_refusal(layer) -> Optional[str]:
    """Why `layer.forward` on 0.5.23 does more than the launches the lean step makes; None when not."""
    from sglang.sm120 import upstream_api

    qm = layer.quant_method
    if getattr(qm, "w13_swiglu_interleaved", False):
        return "w13 interleaved for the fused SwiGLU up-GEMM epilogue (SGLANG_OPT_FUSE_SWIGLU_INTERLEAVED)"
    if getattr(qm, "use_flashinfer_cutlass", False) or getattr(qm, "use_flashinfer_trtllm_moe", False):
        return "a FlashInfer MoE flag on the quant method (forward_cuda takes it before the runner)"
    if upstream_api.require("fused_op.get_fused_op_backend")() is not None:
        return "a forced fused-op backend (SGLANG_FORCE_FUSED_OP_BACKEND)"
    if getattr(layer, "_dwdp_bound", False):
        return "DWDP weight prefetch around the layer"
    if not layer.moe_runner_config.inplace and _symmetric_output_possible():
        return "an out-of-place output upstream allocates in NCCL symmetric memory (--enable-symm-mem, TP > 1)"
    return None


def _symmetric_output_possible() -> bool:
    """Whether upstream may allocate the MoE output in the symmetric pool: is_allocation_symmetric
    changes with each batch's DP padding, so only the settings that rule it out are read."""
    from sglang.sm120 import upstream_api

    if not upstream_api.require("pynccl_allocator.is_symmetric_memory_enabled")():
        return False
    tp = upstream_api.require("runtime_context.get_parallel")().tp_group
    return tp is not None and tp.world_size > 1


def forward_method(qm):
    """The forward the quant method dispatches to: 0.5.23 resolves it at the first call."""
    method = getattr(qm, "_forward_method", None)
    return qm._resolve_forward_method() if method is None else method


def tma_flags(fm, config: dict, down_config: Optional[dict]) -> Tuple[dict, bool, bool]:
    """(up config without USE_TMA, up TMA, down TMA), popped as `_prepare_fused_moe_run` pops them
    (the up config is a copy; the down one already is, try_get_optimal_moe_config makes it)."""
    config = dict(config)
    up_requested = config.pop("USE_TMA", False)
    down_requested = down_config is not None and down_config.pop("USE_TMA", False)
    supported = bool(fm._moe_support_tma())
    return config, bool(supported and up_requested), bool(supported and down_requested)


def align_plan(mab, padded: int, numel: int, num_experts: int) -> Tuple[int, bool]:
    """(sorted-ids length, whether the single-CTA small-numel align runs), as moe_align_block_size
    decides them for this call (no inactive-prefix count, no expert-id padding, no invalid-expert
    skipping: the +1 bucket convention). `padded`: 0.5.16's length, which 0.5.23 rounds up."""
    padded = (padded + 3) // 4 * 4  # the align kernel pads with int4 stores
    small = bool(mab._is_cuda and numel <= mab.SMALL_NUMEL_LIMIT
                 and num_experts + 1 > mab._CUDA_SMALL_BATCH_MAX_BUCKETS)
    return padded, small


def small_sum(fm) -> str:
    """The <= 32-token combine moe_combine_topk runs on CUDA."""
    return "sum_triton" if fm.is_arch_support_pdl() else "sum_compiled_helper"

"""NVFP4 GEMM and quantization kernels for SM120 (and SM90 for testing): Python API.

    from sglang.sm120 import kernels
    pw = kernels.pack_weight(weight_u8, weight_scale_e4m3, weight_scale_2)   # once, at load time
    y = kernels.gemm_w4a16(x_bf16, pw)                                        # small M
    xq, xs = kernels.quantize_nvfp4(x_bf16, input_scale_inv, mma_order=True)
    y = kernels.gemm_w4a4(xq, xs, input_scale, pw)                            # large M
    experts = kernels.pack_experts(w13, w13_scale, w13_scale_2, w2, w2_scale, w2_scale_2)  # MoE, at load
    out = kernels.moe_w4a16(hidden, topk_ids, topk_weights, experts)          # grouped W4A16 MoE

The compiled library is libsm120_kernels.so (csrc/, built by forkbuild.kernels); see
docs/kernels.md. `available()` says whether it loads here.
"""
from ._lib import available, build_archs, library_path, load
from .layout import PackedWeight, pack_weight, unpack_weight, p_order_packed
from .moe import MoeScratch, PackedExperts, moe_plan, moe_reference, moe_w4a16, moe_w4a16_supported, pack_experts
from .ops import (KERNEL_DEFAULT, WARPK_MAX_M, WARPS_DEFAULT, gemm_w4a4, gemm_w4a16, packed_scale_shape,
                  quantize_nvfp4, w4a16_plan, w4a16_warps, workspace)

__all__ = [
    "available", "build_archs", "library_path", "load",
    "PackedWeight", "pack_weight", "unpack_weight", "p_order_packed",
    "gemm_w4a4", "gemm_w4a16", "quantize_nvfp4", "w4a16_plan", "workspace", "packed_scale_shape",
    "WARPS_DEFAULT", "w4a16_warps", "KERNEL_DEFAULT", "WARPK_MAX_M",
    "MoeScratch", "PackedExperts", "pack_experts", "moe_w4a16", "moe_reference", "moe_plan", "moe_w4a16_supported",
]

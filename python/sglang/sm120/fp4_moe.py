"""ModelOpt NVFP4 MoE layers on the grouped W4A16 kernel: the hooks `--moe-runner-backend sm120`
calls (patch 0202 over ModelOptNvFp4FusedMoEMethod in modelopt_quant.py).

  * layer_backend(layer, config), from create_moe_runner, while the model is built and before
    any weight is loaded: the first layer the kernel serves runs the once-per-process self-check
    (fp4_moe_selfcheck; on failure the process's backend becomes upstream's choice and this
    layer, like every later one, takes upstream's path). Per layer: sm120, or -- for a layer the
    kernel does not serve (layer_refusal, one log line per layer) -- marlin, upstream's NVFP4
    W4A16 MoE, which shares sm120's weight order (gate rows first), dispatcher (local expert ids)
    and top-k (routed_scaling_factor already in the weights), so that layer alone can change.
  * process_weights_after_loading(layer): packs the experts (kernels.pack_experts) and frees the
    loaded tensors.
  * apply(layer, dispatch_output): kernels.moe_w4a16 on upstream's dispatch output.

Semantics match upstream's FlashInfer CUTLASS NVFP4 path (ModelOptNvFp4FusedMoEMethod.apply with
FlashInferCutlassMoeQuantInfo(apply_routed_scaling_factor=False)) and its Marlin path after patch
0301: FusedMoE folds routed_scaling_factor into the top-k weights for this quant method
(should_fuse_routed_scaling_factor_in_topk), so the kernel sums at factor 1; under expert
parallelism upstream's StandardDispatcher maps global ids to local ones and other ranks' experts
to -1, which the kernel skips (sm120 is not among the backends that keep global ids).
"""
from __future__ import annotations

import logging
from typing import Optional

import torch

from sglang.sm120 import fp4_moe_selfcheck

logger = logging.getLogger(__name__)

FLAG = "--moe-runner-backend sm120"
# The loaded ModelOpt tensors pack_experts reads; freed once packed.
EXPERT_TENSORS = ("w13_weight", "w13_weight_scale", "w13_weight_scale_2",
                  "w2_weight", "w2_weight_scale", "w2_weight_scale_2")


def uses_kernel(layer) -> bool:
    """The layer runs on this backend: its quant method chose sm120 and its experts are packed."""
    backend = getattr(getattr(layer, "quant_method", None), "_moe_runner_backend", None)
    return getattr(backend, "value", None) == "sm120" and getattr(layer, "sm120_experts", None) is not None


def layer_shapes(layer):
    """(E, H, I) of the layer's loaded experts: w13_weight is uint8 [E, 2I, H/2]."""
    e, two_i, half_h = layer.w13_weight.shape
    return e, 2 * half_h, two_i // 2


def layer_refusal(layer, config) -> Optional[str]:
    """Why the kernel does not serve this layer (None when it does)."""
    from sglang.sm120.kernels.moe import moe_w4a16_supported

    if config.activation != "silu" or not config.is_gated:
        return f"activation {config.activation!r} gated={config.is_gated} (the kernel runs gated SiLU)"
    for name in ("gemm1_alpha", "gemm1_beta", "gemm1_clamp_limit", "swiglu_limit"):
        if getattr(config, name, None) is not None:
            return f"{name} is set (the kernel runs plain SiLU(gate) * up)"
    if getattr(config, "silu_mul_keep_fp32", False):
        return "silu_mul_keep_fp32 (the kernel rounds SiLU(gate) * up to bf16)"
    if config.apply_router_weight_on_input:
        return "apply_router_weight_on_input (the kernel weighs the experts' outputs)"
    if config.no_combine:
        return "no_combine (the kernel sums the top-k outputs)"
    if config.params_dtype not in (None, torch.bfloat16):
        return f"activations {config.params_dtype} (the kernel takes bf16)"
    if getattr(layer, "w13_weight_bias", None) is not None or getattr(layer, "w2_weight_bias", None) is not None:
        return "expert bias"
    if getattr(layer, "gemm1_clamp_limit", None) is not None:
        return "the layer's gemm1_clamp_limit (the kernel runs plain SiLU(gate) * up)"
    return moe_w4a16_supported(*layer_shapes(layer))


def _check_device(layer) -> torch.device:
    dev = layer.w13_weight.device
    return dev if dev.type == "cuda" else torch.device("cuda", torch.cuda.current_device())


def layer_backend(layer, config):
    """The MoeRunnerBackend this layer runs on (module docstring); may switch the process's."""
    from sglang.sm120 import fp4_layer
    from sglang.srt.layers.moe.utils import MoeRunnerBackend, get_moe_runner_backend

    fp4_layer.require_kernels(FLAG)
    why = layer_refusal(layer, config)
    if why is not None:
        logger.warning("%s: layer %s (E=%d H=%d I=%d) is not served by the grouped kernel: %s; it runs "
                       "upstream's marlin NVFP4 MoE", FLAG, getattr(layer, "layer_id", "?"),
                       *layer_shapes(layer), why)
        return MoeRunnerBackend.MARLIN
    e, h, i = layer_shapes(layer)
    if not fp4_moe_selfcheck.ensure_verified(e, h, i, config.top_k, _check_device(layer)).ok:
        return get_moe_runner_backend()  # upstream's choice, for the process
    return MoeRunnerBackend.SM120


def process_weights_after_loading(layer: torch.nn.Module) -> None:
    """Pack the loaded experts for the kernel (layer.sm120_experts) and free the loaded tensors.
    Memory: the packed experts take the loaded bytes plus the kernel's padding (I to 64 and H to
    128 rows, K to whole 64-column chunks: nothing on the usual shapes), so after the frees the
    layer costs what upstream's does; while packing, one layer's experts exist twice (interleaved
    copy of w13, then the packed stacks, in batches of experts)."""
    from sglang.sm120 import kernels

    from sglang.sm120.fp4_layer import packable_scales

    tensors = {name: getattr(layer, name).data for name in EXPERT_TENSORS}
    where = f"NVFP4 MoE layer {getattr(layer, 'layer_id', '?')}"
    for w in ("w13", "w2"):
        tensors[f"{w}_weight_scale"], tensors[f"{w}_weight_scale_2"] = packable_scales(
            tensors[f"{w}_weight_scale"], tensors[f"{w}_weight_scale_2"], where)
    layer.sm120_experts = kernels.pack_experts(**tensors)
    del tensors
    for name in EXPERT_TENSORS:
        # The parameters stay (loaders and printers find them) but hold nothing.
        getattr(layer, name).data = torch.empty(0, dtype=getattr(layer, name).dtype,
                                                device=layer.sm120_experts.w13.device)


def routed_scaling(layer) -> float:
    """The factor the kernel applies: 1 where FusedMoE already folded it into the top-k weights."""
    if getattr(layer, "should_fuse_routed_scaling_factor_in_topk", True):
        return 1.0
    rsf = layer.moe_runner_config.routed_scaling_factor
    return 1.0 if rsf is None else float(rsf)


def run(layer, hidden_states, topk_output, *, out=None, scratch=None) -> torch.Tensor:
    """The kernel call of this layer: upstream's path (apply) and the lean eager step make it
    with the same arguments (only out and scratch, which the kernel writes before it reads)."""
    from sglang.sm120 import kernels

    if hidden_states.shape[0] == 0:  # an idle rank's empty batch (DP attention): nothing to launch
        return out if out is not None else hidden_states.new_empty((0, layer.sm120_experts.hidden))
    return kernels.moe_w4a16(hidden_states, topk_output.topk_ids, topk_output.topk_weights,
                             layer.sm120_experts, routed_scaling_factor=routed_scaling(layer),
                             out=out, scratch=scratch)


def apply(layer, dispatch_output):
    """ModelOptNvFp4FusedMoEMethod.apply for an sm120 layer: a StandardCombineInput."""
    from sglang.srt.layers.moe.token_dispatcher.standard import StandardCombineInput
    from sglang.srt.layers.moe.topk import TopKOutputChecker

    topk_output = getattr(dispatch_output, "topk_output", None)
    if topk_output is None or not TopKOutputChecker.format_is_standard(topk_output):
        raise NotImplementedError(f"{FLAG}: dispatch output {type(dispatch_output).__name__} without a "
                                  "standard top-k output (an all-to-all MoE backend?); use --moe-a2a-backend none")
    return StandardCombineInput(hidden_states=run(layer, dispatch_output.hidden_states, topk_output))
